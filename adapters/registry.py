"""The one place that knows which frameworks exist, how each is launched and where it lives:
per framework its adapter module, modes, environment (envs/<env>.txt), rendezvous kind
(launchers/rendezvous/<kind>.py) and container image (docker/<image>.Dockerfile).

Imports no framework: the launcher reads this table to build plans, environments, images and
rendezvous, and only the worker (inside the framework's own environment) imports the adapter
module itself through `load_trainer`, which returns the adapter's class for the run's mode (the
module's `TRAINERS`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class FrameworkInfo:
    """What the launcher must know about one framework adapter without importing it.

    `rendezvous` names how ranks find each other (a module of launchers/rendezvous/): every
    framework gets its rendezvous its own way (MASTER_ADDR for torch, TF_CONFIG, DMLC_* for
    ps-lite, MPI).
    """

    name: str  # CLI name
    label: str  # shown in tables and plots
    module: str  # adapter module, imported only inside the framework's environment
    env: str  # environment name: envs/<env>.txt
    modes: tuple[str, ...]  # aggregation modes; the first is the default
    synchronous_modes: tuple[str, ...]
    rendezvous: str
    server_modes: tuple[str, ...] = ()  # modes with parameter servers (--servers N)
    servers_with_one_worker: bool = True  # False: one worker runs single-device, no server
    # A second environment whose interpreter the adapter drives (CNTK's Python 3.6); its
    # python reaches the worker as DLC_BACKEND_PYTHON.
    backend_env: str | None = None
    # The container image (launchers/images.py IMAGES, docker/<image>.Dockerfile) holding
    # `env`; None: the framework runs in virtualenvs only.
    image: str | None = None
    # What the interpreter that runs the framework must import (the backend's where there is
    # one): checked, with the versions found, when a user names that interpreter (--python).
    imports: tuple[str, ...] = ()


FRAMEWORKS: dict[str, FrameworkInfo] = {
    "torch": FrameworkInfo(
        name="torch",
        label="PyTorch DDP",
        module="adapters.pytorch",
        env="torch",
        modes=("ddp",),
        synchronous_modes=("ddp",),
        rendezvous="torch",
        image="pytorch",
        imports=("torch",),
    ),
    "tf": FrameworkInfo(
        name="tf",
        label="TensorFlow",
        module="adapters.tensorflow",
        env="tf",
        # collective: MultiWorkerMirroredStrategy; ps: TF1 SyncReplicasOptimizer; ps-async:
        # TF2 ParameterServerStrategy (asynchronous); mirrored: one process over local GPUs.
        modes=("collective", "ps", "ps-async", "mirrored"),
        synchronous_modes=("collective", "ps", "mirrored"),
        rendezvous="tf",
        image="tensorflow",
        server_modes=("ps", "ps-async"),
        servers_with_one_worker=False,
        imports=("tensorflow",),
    ),
    "cntk": FrameworkInfo(
        name="cntk",
        label="CNTK",
        module="adapters.cntk",
        env="torch",  # the worker side needs only NumPy; CNTK itself runs in backend_env
        # ranks started by mpirun; with several, CNTK's data_parallel_distributed_learner
        # all-reduces the gradients over MPI (one worker: CNTK's plain learner)
        modes=("mpi",),
        synchronous_modes=("mpi",),
        rendezvous="mpi",
        backend_env="cntk",
        imports=("cntk",),
    ),
    "cntk-style": FrameworkInfo(
        name="cntk-style",
        label="CNTK-style",
        module="adapters.cntk_style",
        env="torch",
        modes=("allreduce",),
        synchronous_modes=("allreduce",),
        rendezvous="torch",
        image="pytorch",
        imports=("torch",),
    ),
    "caffe-mpi-style": FrameworkInfo(
        name="caffe-mpi-style",
        label="Caffe-MPI-style",
        module="adapters.caffe_mpi",
        env="torch-mpi",
        modes=("mpi",),
        synchronous_modes=("mpi",),
        rendezvous="mpi",
        image="pytorch",
        imports=("torch", "mpi4py"),
    ),
    "horovod": FrameworkInfo(
        name="horovod",
        label="Horovod",
        module="adapters.horovod",
        env="horovod",
        # the transport under Horovod's fused ring all-reduce: gloo started by horovodrun,
        # mpi started by mpirun (launchers/rendezvous/horovod.py)
        modes=("gloo", "mpi"),
        synchronous_modes=("gloo", "mpi"),
        rendezvous="horovod",
        image="pytorch",
        imports=("horovod.torch",),
    ),
    "mxnet": FrameworkInfo(
        name="mxnet",
        label="MXNet",
        module="adapters.mxnet",
        env="mxnet",
        # kvstore types (adapters/mxnet.py). Names not listed are rejected here because MXNet's
        # kv.create silently turns any name it does not know into a local store.
        modes=("dist_sync", "dist_device_sync", "local", "device", "nccl"),
        synchronous_modes=("dist_sync", "dist_device_sync", "local", "device", "nccl"),
        rendezvous="dmlc",
        image="mxnet",
        server_modes=("dist_sync", "dist_device_sync"),
        imports=("mxnet",),
    ),
    "jax": FrameworkInfo(
        name="jax",
        label="JAX",
        module="adapters.jax",
        env="jax",
        # jax.distributed over processes, gradients averaged by lax.pmean in shard_map: one
        # all-reduce of the whole gradient after backward (gloo on CPUs, NCCL on GPUs)
        modes=("allreduce",),
        synchronous_modes=("allreduce",),
        rendezvous="torch",  # the env:// variables: JAX's coordinator on MASTER_ADDR:MASTER_PORT
        imports=("jax",),
    ),
}


class UnknownFramework(ValueError):
    """A framework or mode name the registry does not know."""


def framework_info(name: str) -> FrameworkInfo:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        known = ", ".join(sorted(FRAMEWORKS))
        raise UnknownFramework(f"unknown framework {name!r} (known: {known})") from None


def parse_framework_mode(text: str) -> tuple[FrameworkInfo, str]:
    """Parse 'torch' or 'tf:ps' into (info, mode); the mode defaults to the adapter's first."""
    name, _, mode = text.strip().partition(":")
    info = framework_info(name)
    mode = mode or info.modes[0]
    if mode not in info.modes:
        raise UnknownFramework(
            f"unknown mode {mode!r} for {name} (known: {', '.join(info.modes)})"
        )
    return info, mode


def load_trainer(name: str, mode: str):
    """Import the adapter module (and so the framework) and return the Trainer class of `mode`
    (the module's `TRAINERS`, one class per mode)."""
    module = importlib.import_module(framework_info(name).module)
    try:
        return module.TRAINERS[mode]
    except KeyError:
        raise UnknownFramework(f"{module.__name__} has no trainer for mode {mode!r} "
                               f"(it has: {', '.join(module.TRAINERS)})") from None
