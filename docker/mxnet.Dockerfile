# syntax=docker/dockerfile:1
# MXNet image: framework mxnet (kvstore local, device, dist_sync, dist_device_sync), one
# virtualenv from envs/mxnet.txt (MXNet 1.9.1, NumPy < 1.24) installed by the project's own
# builder (core/envs.py). Built by `python -m launchers.images build mxnet`.
#
# Build arguments:
#   BASE    the image to build on. Default: the Debian base the project makes with debootstrap.
#           CUDA: e.g. nvidia/cuda:11.2.2-cudnn8-runtime-ubuntu20.04 (MXNet 1.9.1's last CUDA).
#   DEVICE  cpu (default) or cuda: cuda installs mxnet-cu112 of the same pinned version.
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
    if [ "$DEVICE" = cuda ]; then sed -i 's/^mxnet==/mxnet-cu112==/' envs/mxnet.txt; fi \
 && PIP_CONFIG_FILE=/pip/pip.conf \
    python3 -m core.envs install --venv /opt/venv mxnet \
 && rm -rf /var/lib/apt/lists/*
COPY project/ /opt/dlcompare/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/dlcompare \
    PYTHONUNBUFFERED=1
USER 1000:1000
ENTRYPOINT ["/opt/venv/bin/python", "-m", "adapters.worker"]
