# GENERATED FILE - DO NOT EDIT.
# Cell mini-cpu:1.0 of matrix.yaml, rendered from templates/images/pip.Dockerfile.j2 by `buildtool render`.
# Change matrix.yaml or templates/ and run `make render`; `make check` fails when this file drifts.

# The base comes in through a build arg so a build can point it at a mirror (BASE_MIRROR).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Every file a step writes gets this time, so the same inputs give the same layer.
ARG SOURCE_DATE_EPOCH=0

# Debian's Python 3.11; the image's packages go into a virtual environment (below).
ARG DEBIAN_FRONTEND=noninteractive
# Debian packages named in matrix.yaml: ca-certificates python3 python3-venv procps.
# Every Debian package this step adds to the base, at the version apt.lock pins (`make lock` resolves it
# inside the base; base.dpkg lists that base's own packages). Anything else apt adds means another base
# than the lock's: the build stops.
RUN --mount=type=tmpfs,target=/run \
    touch /run/stamp \
 && printf '%s\n' \
      ca-certificates=20230311+deb12u1 \
      libexpat1=2.5.0-1+deb12u2 \
      libgssapi-krb5-2=1.20.1-2+deb12u5 \
      libk5crypto3=1.20.1-2+deb12u5 \
      libkeyutils1=1.6.3-2 \
      libkrb5-3=1.20.1-2+deb12u5 \
      libkrb5support0=1.20.1-2+deb12u5 \
      libncursesw6=6.4-4 \
      libnsl2=1.3.0-2 \
      libproc2-0=2:4.0.2-3 \
      libpython3-stdlib=3.11.2-1+b1 \
      libpython3.11-minimal=3.11.2-6+deb12u8 \
      libpython3.11-stdlib=3.11.2-6+deb12u8 \
      libreadline8=8.2-1.3 \
      libsqlite3-0=3.40.1-2+deb12u2 \
      'libssl3=3.0.20-1~deb12u2' \
      libtirpc-common=1.3.3+ds-1 \
      libtirpc3=1.3.3+ds-1 \
      media-types=10.0.0 \
      'openssl=3.0.20-1~deb12u2' \
      procps=2:4.0.2-3 \
      python3=3.11.2-1+b1 \
      python3-distutils=3.11.2-3 \
      python3-lib2to3=3.11.2-3 \
      python3-minimal=3.11.2-1+b1 \
      python3-pip-whl=23.0.1+dfsg-1 \
      python3-setuptools-whl=66.1.1-1+deb12u2 \
      python3-venv=3.11.2-1+b1 \
      python3.11=3.11.2-6+deb12u8 \
      python3.11-minimal=3.11.2-6+deb12u8 \
      python3.11-venv=3.11.2-6+deb12u8 \
      readline-common=8.2-1.3 \
    > /run/apt.pins \
 && dpkg-query -W -f '${Package}=${Version}\n' | sort > /run/before \
 && apt-get update \
 && xargs apt-get install -y --no-install-recommends < /run/apt.pins \
 && dpkg-query -W -f '${Package}=${Version}\n' | sort | comm -13 /run/before - \
    | { grep -vxF -f /run/apt.pins || true; } > /run/unlocked \
 && if [ -s /run/unlocked ]; then echo "ERROR: apt added $(paste -sd ' ' /run/unlocked), which apt.lock does not list (another base than it was resolved in); run make lock FRAMEWORK=mini-cpu:1.0" >&2; exit 1; fi \
 && rm -rf /var/lib/apt/lists/* && mkdir /var/lib/apt/lists/partial \
 && find /var/cache/apt /var/log/apt -type f -delete && : > /var/log/dpkg.log && : > /var/cache/ldconfig/aux-cache \
 && find / -xdev -newer /run/stamp -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +

# uv 0.13.9, pinned by hash, installed with the host's pip settings (secrets); later
# steps use it through a bind mount, so it is never part of the image.
FROM base AS uv
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=tmpfs,target=/run \
    --mount=type=secret,id=pip.conf,target=/run/secrets/pip.conf \
    --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    printf '%s\n' 'uv==0.13.9 --hash=sha256:16963d19594e18d746a70c7fce82237bde4f2cac4cfcf0ca2b84796fe9d0c6e9 --hash=sha256:2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25 --hash=sha256:3eeeb51a267a2144640fcd8f38d4a2f63439b39bc47445fd84727c3fc462c843 --hash=sha256:5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe --hash=sha256:56ec37616c00220032fc7b8c9d0ef51367fd0d70d9cd6ddd841660f949f84fed --hash=sha256:66c512266d633bef48384a1f53003f41f2a8e7b36fe6e7fbfd3e0fd52d96fa63 --hash=sha256:6a44b2ed8111d2f60d2b92627c5dccda3f7ed7570b18ce115e569cd68c28246b --hash=sha256:6b0c7b9f47a5d011939d61e324d3fe18a8bc155d8dd53add738709a92f290a7c --hash=sha256:6d5114bba238adddacb32fb11904f2b3ff4e988f8e9ff0d8d3b5e9822cf836b8 --hash=sha256:7ec1e1dd9b6cb335c301afdf877989df384227313981850755a59561f75e4ab8 --hash=sha256:a2ee66fe8b6608e1482ab1bde5799da04705c1cb40324c7f66054ecf46ae6e40 --hash=sha256:a6e845f387e4ed55bb59342957a9179e24a631fcc7668bda3426ae1cef8ed4b9 --hash=sha256:c16ed11e013557536b3e60065f1b912f6407bd6518e041b961e23ef9e6b4fbf5 --hash=sha256:c5dbdb7c8737cd183a9dce95b39cfd1f3d54ec2a27a1bb58f160293f9ba2c805 --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 --hash=sha256:db5c8df7145c21ffea9c0f74e38823bac3af60cbadf0e26b8633f08627b17bab --hash=sha256:dd6f4f93ddf8a668c73f0945f3638444b2140a4e15a3912067493fc6335543e4 --hash=sha256:ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375 --hash=sha256:eeb92051c2123b9730c46b04cc843cfa4bc7d7b0aec56df431a2215ef4cb0273' > /run/uv.txt \
 && pip_wheel=(/usr/share/python-wheels/pip-*.whl) \
 && PIP_CONFIG_FILE=/run/secrets/pip.conf python3 "${pip_wheel[0]}/pip" install --no-cache-dir --no-deps --require-hashes \
      --target /uv -r /run/uv.txt

FROM base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG SOURCE_DATE_EPOCH=0

# A virtual environment, so the image's packages never fight the system's; pip comes from the lock.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1
RUN --mount=type=tmpfs,target=/run \
    touch /run/stamp \
 && python3 -m venv --without-pip "$VIRTUAL_ENV" \
 && find / -xdev -newer /run/stamp -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +
# PyTorch 2.13.0+cpu (cpu) and its dependencies (pylock.framework.toml).
RUN --mount=type=tmpfs,target=/run \
    --mount=type=bind,from=uv,source=/uv/bin/uv,target=/run/uv/uv \
    --mount=type=bind,source=pylock.framework.toml,target=/run/lock/pylock.framework.toml \
    --mount=type=cache,id=dl-images-uv,target=/run/uv/cache \
    --mount=type=secret,id=lock-urls,target=/run/secrets/lock-urls \
    --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    touch /run/stamp \
 && if [ -f /run/secrets/pip-ca ]; then export SSL_CERT_FILE=/run/secrets/pip-ca; fi \
 && if [ -f /run/secrets/lock-urls ]; then sed -f /run/secrets/lock-urls /run/lock/pylock.framework.toml; else cat /run/lock/pylock.framework.toml; fi > /run/pylock.framework.toml \
 && if grep -n '"file:' /run/pylock.framework.toml >&2; then echo "ERROR: pylock.framework.toml names a file on the build machine (above) that no folder of this machine's pip settings serves; run make lock FRAMEWORK=mini-cpu:1.0 with this machine's pip settings" >&2; exit 1; fi \
 && UV_CACHE_DIR=/run/uv/cache UV_LINK_MODE=copy UV_COMPILE_BYTECODE=0 UV_PYTHON_DOWNLOADS=never \
    /run/uv/uv pip install --no-progress --preview-features pylock --python "$(command -v python)" --require-hashes \
      -r /run/pylock.framework.toml \
 && find / -xdev -newer /run/stamp -name '*.py' -print0 | sort -z \
  | xargs -0 -r -n 2000 -P "$(nproc)" env PYTHONHASHSEED=0 python -c 'import sys, py_compile as c; [c.compile(p, doraise=False, quiet=2, invalidation_mode=c.PycInvalidationMode.CHECKED_HASH) for p in sys.argv[1:]]' \
 && find / -xdev -newer /run/stamp -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +

# TensorBoard and the profiler plugins users open their traces with, and everything else the
# cell's lock holds besides the framework (pylock.tools.toml).
RUN --mount=type=tmpfs,target=/run \
    --mount=type=bind,from=uv,source=/uv/bin/uv,target=/run/uv/uv \
    --mount=type=bind,source=pylock.tools.toml,target=/run/lock/pylock.tools.toml \
    --mount=type=cache,id=dl-images-uv,target=/run/uv/cache \
    --mount=type=secret,id=lock-urls,target=/run/secrets/lock-urls \
    --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    touch /run/stamp \
 && if [ -f /run/secrets/pip-ca ]; then export SSL_CERT_FILE=/run/secrets/pip-ca; fi \
 && if [ -f /run/secrets/lock-urls ]; then sed -f /run/secrets/lock-urls /run/lock/pylock.tools.toml; else cat /run/lock/pylock.tools.toml; fi > /run/pylock.tools.toml \
 && if grep -n '"file:' /run/pylock.tools.toml >&2; then echo "ERROR: pylock.tools.toml names a file on the build machine (above) that no folder of this machine's pip settings serves; run make lock FRAMEWORK=mini-cpu:1.0 with this machine's pip settings" >&2; exit 1; fi \
 && UV_CACHE_DIR=/run/uv/cache UV_LINK_MODE=copy UV_COMPILE_BYTECODE=0 UV_PYTHON_DOWNLOADS=never \
    /run/uv/uv pip install --no-progress --preview-features pylock --python "$(command -v python)" --require-hashes \
      -r /run/pylock.tools.toml \
 && find / -xdev -newer /run/stamp -name '*.py' -print0 | sort -z \
  | xargs -0 -r -n 2000 -P "$(nproc)" env PYTHONHASHSEED=0 python -c 'import sys, py_compile as c; [c.compile(p, doraise=False, quiet=2, invalidation_mode=c.PycInvalidationMode.CHECKED_HASH) for p in sys.argv[1:]]' \
 && find / -xdev -newer /run/stamp -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +

# Root by default as on NGC; /workspace is writable for `docker run --user "$(id -u):$(id -g)"` too.
RUN mkdir -p /workspace && chmod 1777 /workspace && touch --date="@${SOURCE_DATE_EPOCH}" /workspace
WORKDIR /workspace

# What the image is and how it must be run; build-time facts (revision, created, the base as
# pulled and its digest, content key) are added as labels by `buildtool build`.
LABEL org.opencontainers.image.title="mini-cpu" \
      org.opencontainers.image.description="Golden-test cell on a Debian base." \
      org.opencontainers.image.version="1.0" \
      org.opencontainers.image.source="https://example.org/mini" \
      org.opencontainers.image.documentation="https://example.org/mini/docs" \
      org.opencontainers.image.vendor="Example \"Labs\" \$HOME" \
      org.opencontainers.image.licenses="BSD-3-Clause" \
      io.dl-images.base.upstream="docker.io/library/debian:bookworm-slim" \
      io.dl-images.cell="mini-cpu:1.0" \
      io.dl-images.framework="pytorch" \
      io.dl-images.framework-version="2.13.0+cpu" \
      io.dl-images.python="3.11" \
      io.dl-images.accelerator="cpu" \
      io.dl-images.tests="common,pytorch" \
      io.dl-images.run.flags="--shm-size=2g --ulimit=memlock=-1"
