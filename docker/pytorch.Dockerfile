# syntax=docker/dockerfile:1
# PyTorch image: frameworks torch (DDP), cntk-style, caffe-mpi-style (mpi4py over OpenMPI) and
# horovod (gloo and MPI), all in one virtualenv holding envs/torch-mpi.txt and envs/horovod.txt
# (+ horovod.build.txt), installed by the project's own builder (core/envs.py) so the image
# has exactly the local environments' pins. Built by `python -m launchers.images build pytorch`,
# which stages envs/, the project and any local wheels into the build context.
#
# Build arguments:
#   BASE    the image to build on. Default: the Debian base the project makes with debootstrap.
#           CUDA: e.g. nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 (any Debian/Ubuntu with apt).
#   DEVICE  cpu (default) or cuda. With cuda no local wheel is staged, so pip takes PyPI's
#           torch==<pin>, which is the CUDA build on x86_64.
ARG BASE=localhost/dlcompare/debian:bookworm

# ---- build stage: compilers and MPI headers (mpi4py and Horovod compile here) ----
FROM ${BASE} AS build
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/dlcompare
# the builder and what it imports only: editing the rest of core/ keeps this stage cached
COPY project/core/__init__.py project/core/cli.py project/core/envs.py project/core/files.py core/
COPY envs/ envs/
# The `# apt:` lines of the env files (OpenMPI, cmake, g++, make) are installed by the builder.
RUN --mount=type=bind,source=pip,target=/pip \
    PIP_CONFIG_FILE=/pip/pip.conf \
    python3 -m core.envs install --venv /opt/venv torch-mpi horovod

# ---- final stage: the runtime only ----
FROM ${BASE}
ARG DEVICE=cpu
LABEL org.dlcompare.device=$DEVICE
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 openmpi-bin \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --user-group dlcompare
COPY --from=build /opt/venv /opt/venv
COPY project/ /opt/dlcompare/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/dlcompare \
    PYTHONUNBUFFERED=1 \
    OMPI_MCA_plm_rsh_agent=false
WORKDIR /opt/dlcompare
USER 1000:1000
ENTRYPOINT ["/opt/venv/bin/python", "-m", "adapters.worker"]
