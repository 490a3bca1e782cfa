# syntax=docker/dockerfile:1
# TensorFlow image: framework tf (collective, ps, ps-async, mirrored), one virtualenv from
# envs/tf.txt then envs/tf.nodeps.txt (--no-deps), installed by the project's own builder
# (core/envs.py). Built by `python -m launchers.images build tensorflow`.
#
# Build arguments:
#   BASE    the image to build on. Default: the Debian base the project makes with debootstrap.
#           CUDA: e.g. nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04.
#   DEVICE  cpu (default) or cuda: cuda installs tensorflow[and-cuda] of the same pinned version
#           instead of tensorflow-cpu (it pulls the matching CUDA, cuDNN and NCCL wheels).
ARG BASE=localhost/dlcompare/debian:bookworm
FROM ${BASE}
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --user-group dlcompare
WORKDIR /opt/dlcompare
# the builder and what it imports only: editing the rest of core/ keeps this stage cached
COPY project/core/__init__.py project/core/cli.py project/core/envs.py project/core/files.py core/
COPY envs/ envs/
ARG DEVICE=cpu
RUN --mount=type=bind,source=pip,target=/pip \
    if [ "$DEVICE" = cuda ]; then sed -i 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' envs/tf.txt; fi \
 && PIP_CONFIG_FILE=/pip/pip.conf \
    python3 -m core.envs install --venv /opt/venv tf \
 && rm -rf /var/lib/apt/lists/*
COPY project/ /opt/dlcompare/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/dlcompare \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=1
USER 1000:1000
ENTRYPOINT ["/opt/venv/bin/python", "-m", "adapters.worker"]
