# GENERATED FILE - DO NOT EDIT.
# Cell mini-ngc:25.02 of matrix.yaml, rendered from templates/images/ngc.Dockerfile.j2 by `buildtool render`.
# Change matrix.yaml or templates/ and run `make render`; `make check` fails when this file drifts.

# The base comes in through a build arg so a build can point it at a mirror (BASE_MIRROR).
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Every file a step writes gets this time, so the same inputs give the same layer.
ARG SOURCE_DATE_EPOCH=0

# uv 0.13.9, pinned by hash, installed with the host's pip settings (secrets); later
# steps use it through a bind mount, so it is never part of the image.
FROM base AS uv
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=tmpfs,target=/run \
    --mount=type=secret,id=pip.conf,target=/run/secrets/pip.conf \
    --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    printf '%s\n' 'uv==0.13.9 --hash=sha256:16963d19594e18d746a70c7fce82237bde4f2cac4cfcf0ca2b84796fe9d0c6e9 --hash=sha256:2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25 --hash=sha256:3eeeb51a267a2144640fcd8f38d4a2f63439b39bc47445fd84727c3fc462c843 --hash=sha256:5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe --hash=sha256:56ec37616c00220032fc7b8c9d0ef51367fd0d70d9cd6ddd841660f949f84fed --hash=sha256:66c512266d633bef48384a1f53003f41f2a8e7b36fe6e7fbfd3e0fd52d96fa63 --hash=sha256:6a44b2ed8111d2f60d2b92627c5dccda3f7ed7570b18ce115e569cd68c28246b --hash=sha256:6b0c7b9f47a5d011939d61e324d3fe18a8bc155d8dd53add738709a92f290a7c --hash=sha256:6d5114bba238adddacb32fb11904f2b3ff4e988f8e9ff0d8d3b5e9822cf836b8 --hash=sha256:7ec1e1dd9b6cb335c301afdf877989df384227313981850755a59561f75e4ab8 --hash=sha256:a2ee66fe8b6608e1482ab1bde5799da04705c1cb40324c7f66054ecf46ae6e40 --hash=sha256:a6e845f387e4ed55bb59342957a9179e24a631fcc7668bda3426ae1cef8ed4b9 --hash=sha256:c16ed11e013557536b3e60065f1b912f6407bd6518e041b961e23ef9e6b4fbf5 --hash=sha256:c5dbdb7c8737cd183a9dce95b39cfd1f3d54ec2a27a1bb58f160293f9ba2c805 --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 --hash=sha256:db5c8df7145c21ffea9c0f74e38823bac3af60cbadf0e26b8633f08627b17bab --hash=sha256:dd6f4f93ddf8a668c73f0945f3638444b2140a4e15a3912067493fc6335543e4 --hash=sha256:ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375 --hash=sha256:eeb92051c2123b9730c46b04cc843cfa4bc7d7b0aec56df431a2215ef4cb0273' > /run/uv.txt \
 && PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir --no-deps --require-hashes \
      --target /uv -r /run/uv.txt

FROM base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG SOURCE_DATE_EPOCH=0

# NGC ships Python 3.12, pip and TensorFlow 2.17.0 built for its CUDA stack;
# only the tools are added.

# TensorBoard and the profiler plugins users open their traces with, and everything else the
# cell's lock holds besides the framework (pylock.tools.toml);
# under the base's own pip constraints (PIP_CONSTRAINT), so the framework is never replaced.
RUN --mount=type=tmpfs,target=/run \
    --mount=type=bind,from=uv,source=/uv/bin/uv,target=/run/uv/uv \
    --mount=type=bind,source=pylock.tools.toml,target=/run/lock/pylock.tools.toml \
    --mount=type=cache,id=dl-images-uv,target=/run/uv/cache \
    --mount=type=secret,id=lock-urls,target=/run/secrets/lock-urls \
    --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    touch /run/stamp \
 && if [ -f /run/secrets/pip-ca ]; then export SSL_CERT_FILE=/run/secrets/pip-ca; fi \
 && if [ -f /run/secrets/lock-urls ]; then sed -f /run/secrets/lock-urls /run/lock/pylock.tools.toml; else cat /run/lock/pylock.tools.toml; fi > /run/pylock.tools.toml \
 && if grep -n '"file:' /run/pylock.tools.toml >&2; then echo "ERROR: pylock.tools.toml names a file on the build machine (above) that no folder of this machine's pip settings serves; run make lock FRAMEWORK=mini-ngc:25.02 with this machine's pip settings" >&2; exit 1; fi \
 && UV_CACHE_DIR=/run/uv/cache UV_LINK_MODE=copy UV_COMPILE_BYTECODE=0 UV_PYTHON_DOWNLOADS=never \
    /run/uv/uv pip install --no-progress --preview-features pylock --python "$(command -v python)" --require-hashes \
      -r /run/pylock.tools.toml \
 && if [ -n "${PIP_CONSTRAINT:-}" ]; then python -c 'import sys, tomllib; print("".join("%s===%s\n" % (p["name"], p["version"]) for p in tomllib.load(open(sys.argv[1], "rb"))["packages"]), end="")' /run/pylock.tools.toml > /run/pins.txt \
 && UV_CACHE_DIR=/run/uv/cache UV_PYTHON_DOWNLOADS=never UV_CONSTRAINT="$PIP_CONSTRAINT" \
    /run/uv/uv pip install --dry-run --offline --no-deps --python "$(command -v python)" -r /run/pins.txt; fi \
 && find / -xdev -newer /run/stamp -name '*.py' -print0 | sort -z \
  | xargs -0 -r -n 2000 -P "$(nproc)" env PYTHONHASHSEED=0 python -c 'import sys, py_compile as c; [c.compile(p, doraise=False, quiet=2, invalidation_mode=c.PycInvalidationMode.CHECKED_HASH) for p in sys.argv[1:]]' \
 && find / -xdev -newer /run/stamp -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +

# Root by default as on NGC; /workspace is writable for `docker run --user "$(id -u):$(id -g)"` too.
RUN mkdir -p /workspace && chmod 1777 /workspace && touch --date="@${SOURCE_DATE_EPOCH}" /workspace
WORKDIR /workspace

# GPU runtimes (docker --gpus, pyxis/enroot, Apptainer --nv, Kubernetes' device plugin) inject the GPUs
# and driver libraries these name; the container toolkit refuses a driver older than CUDA 12.8.
# A base that sets them (NGC, with its forward-compatibility driver branches) keeps its own values.
ENV NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-all} \
    NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-compute,utility} \
    NVIDIA_REQUIRE_CUDA=${NVIDIA_REQUIRE_CUDA:-cuda>=12.8}
LABEL io.dl-images.cuda="12.8"

# What the image is and how it must be run; build-time facts (revision, created, the base as
# pulled and its digest, content key) are added as labels by `buildtool build`.
LABEL org.opencontainers.image.title="mini-ngc" \
      org.opencontainers.image.description="Golden-test cell on an NGC base." \
      org.opencontainers.image.version="25.02" \
      org.opencontainers.image.source="https://example.org/mini" \
      org.opencontainers.image.vendor="Example \"Labs\" \$HOME" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.dl-images.base.upstream="nvcr.io/nvidia/tensorflow:25.02-tf2-py3" \
      io.dl-images.cell="mini-ngc:25.02" \
      io.dl-images.framework="tensorflow" \
      io.dl-images.framework-version="2.17.0" \
      io.dl-images.python="3.12" \
      io.dl-images.accelerator="cuda" \
      io.dl-images.tests="common,tensorflow" \
      io.dl-images.run.flags="--shm-size=16g --ulimit=memlock=-1 --gpus=all"
