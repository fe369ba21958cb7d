# GENERATED FILE - DO NOT EDIT.
# Cell mini-ngc:25.02 of matrix.yaml, rendered from templates/images/tensorflow-ngc.Dockerfile.j2 by `buildtool render`.
# Change matrix.yaml or templates/ and run `make render`; `make check` fails when this file drifts.

# The base comes in through a build arg so a build can point it at a mirror (BASE_MIRROR).
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NGC ships Python 3.12, pip and TensorFlow 2.17.0 built for its CUDA stack;
# only the tools are added.

# TensorBoard and the profiler plugins users open their traces with.
RUN --mount=type=secret,id=pip.conf \
    --mount=type=secret,id=pip-ca \
    PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir \
      "tensorboard==2.21.0" \
      "tensorboard-plugin-profile==2.19.0"

# Root by default as on NGC; /workspace is writable for `docker run --user "$(id -u):$(id -g)"` too.
RUN mkdir -p /workspace && chmod 1777 /workspace
WORKDIR /workspace

# What the image is and how it must be run; build-time facts (revision, created, base
# digest, content key) are added as labels by `buildtool build`.
LABEL org.opencontainers.image.title="mini-ngc" \
      org.opencontainers.image.description="Golden-test cell on an NGC base." \
      org.opencontainers.image.version="25.02" \
      org.opencontainers.image.source="https://example.org/mini" \
      org.opencontainers.image.base.name="nvcr.io/nvidia/tensorflow:25.02-tf2-py3" \
      io.dl-images.cell="mini-ngc:25.02" \
      io.dl-images.framework="tensorflow" \
      io.dl-images.framework-version="2.17.0" \
      io.dl-images.python="3.12" \
      io.dl-images.accelerator="cuda" \
      io.dl-images.tests="common,tensorflow" \
      io.dl-images.run.flags="--shm-size=16g --ulimit=memlock=-1 --gpus=all"
