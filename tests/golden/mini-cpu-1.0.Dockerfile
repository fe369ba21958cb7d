# GENERATED FILE - DO NOT EDIT.
# Cell mini-cpu:1.0 of matrix.yaml, rendered from templates/images/pytorch-pip.Dockerfile.j2 by `buildtool render`.
# Change matrix.yaml or templates/ and run `make render`; `make check` fails when this file drifts.

# The base comes in through a build arg so a build can point it at a mirror (BASE_MIRROR).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Debian's Python 3.11 in a virtual environment, so pip never fights the system packages.
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv procps \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv "$VIRTUAL_ENV"

# PyTorch 2.13.0+cpu (cpu); torchrun is the launcher.
RUN --mount=type=secret,id=pip.conf \
    --mount=type=secret,id=pip-ca \
    PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir \
      --extra-index-url https://download.pytorch.org/whl/cpu \
      "torch==2.13.0+cpu"

# TensorBoard and the profiler plugins users open their traces with.
RUN --mount=type=secret,id=pip.conf \
    --mount=type=secret,id=pip-ca \
    PIP_CONFIG_FILE=/run/secrets/pip.conf python -m pip install --no-cache-dir \
      "tensorboard==2.21.0"

# Root by default as on NGC; /workspace is writable for `docker run --user "$(id -u):$(id -g)"` too.
RUN mkdir -p /workspace && chmod 1777 /workspace
WORKDIR /workspace

# What the image is and how it must be run; build-time facts (revision, created, base
# digest, content key) are added as labels by `buildtool build`.
LABEL org.opencontainers.image.title="mini-cpu" \
      org.opencontainers.image.description="Golden-test cell on a Debian base." \
      org.opencontainers.image.version="1.0" \
      org.opencontainers.image.source="https://example.org/mini" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim" \
      io.dl-images.cell="mini-cpu:1.0" \
      io.dl-images.framework="pytorch" \
      io.dl-images.framework-version="2.13.0+cpu" \
      io.dl-images.python="3.11" \
      io.dl-images.accelerator="cpu" \
      io.dl-images.tests="common,pytorch" \
      io.dl-images.run.flags="--shm-size=2g --ulimit=memlock=-1"
