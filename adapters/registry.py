"""What the launcher needs to start each framework of the scheme catalogue (`core.schemes`,
which holds every framework's label, modes and schemes): per framework its adapter module,
environment (envs/<env>.txt), rendezvous kind (launchers/rendezvous/<kind>.py) and container
image (docker/<image>.Dockerfile).

Imports no framework: the launcher reads this table to build plans, environments, images and
rendezvous, and only the worker (inside the framework's own environment) imports the adapter
module itself through `load_trainer`, which returns the adapter's class for the run's mode (the
module's `TRAINERS`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from core import schemes as catalogue


@dataclass(frozen=True)
class FrameworkInfo:
    """What the launcher must know about one framework adapter without importing it; its
    label, modes and schemes are the catalogue's (`core.schemes`), read through the
    properties below.

    `rendezvous` names how ranks find each other (a module of launchers/rendezvous/): every
    framework gets its rendezvous its own way (MASTER_ADDR for torch, TF_CONFIG, DMLC_* for
    ps-lite, MPI).
    """

    name: str  # CLI name, the catalogue's framework
    module: str  # adapter module, imported only inside the framework's environment
    env: str  # environment name: envs/<env>.txt
    rendezvous: str
    # A second environment whose interpreter the adapter drives (CNTK's Python 3.6); its
    # python reaches the worker as DLC_BACKEND_PYTHON.
    backend_env: str | None = None
    # The container image (launchers/images.py IMAGES, docker/<image>.Dockerfile) holding
    # `env`; None: the framework runs in virtualenvs only.
    image: str | None = None
    # What the interpreter that runs the framework must import (the backend's where there is
    # one): checked, with the versions found, when a user names that interpreter (--python).
    imports: tuple[str, ...] = ()
    # Other top-level packages of the framework that only its adapter may import (with
    # `imports`: what must stay out of modules every environment runs, tests/test_layers.py).
    companions: tuple[str, ...] = ()

    @property
    def packages(self) -> set[str]:
        """The framework's top-level packages."""
        return {name.split(".")[0] for name in (*self.imports, *self.companions)}

    @property
    def facts(self) -> catalogue.FrameworkFacts:
        return catalogue.framework_facts(self.name)

    @property
    def label(self) -> str:
        return self.facts.label

    @property
    def modes(self) -> tuple[str, ...]:
        """Aggregation modes; the first is the default."""
        return self.facts.modes

    def scheme(self, mode: str | None = None) -> catalogue.SchemeInfo:
        return catalogue.scheme(self.name, mode)

    @property
    def synchronous_modes(self) -> tuple[str, ...]:
        return tuple(m for m in self.modes if self.scheme(m).synchronous)

    @property
    def server_modes(self) -> tuple[str, ...]:
        """Modes with parameter servers (--servers N)."""
        return tuple(m for m in self.modes if self.scheme(m).servers)

    @property
    def servers_with_one_worker(self) -> bool:
        """False: one worker runs single-device, no server."""
        return self.facts.servers_with_one_worker


FRAMEWORKS: dict[str, FrameworkInfo] = {info.name: info for info in (
    FrameworkInfo("torch", "adapters.pytorch", "torch", "torch", image="pytorch", imports=("torch",)),
    FrameworkInfo("tf", "adapters.tensorflow", "tf", "tf", image="tensorflow", imports=("tensorflow",),
                  companions=("tf_keras", "keras")),
    # the worker side needs only NumPy; CNTK itself runs in backend_env, its ranks started by
    # mpirun
    FrameworkInfo("cntk", "adapters.cntk", "torch", "mpi", backend_env="cntk", imports=("cntk",)),
    FrameworkInfo("cntk-style", "adapters.cntk_style", "torch", "torch", image="pytorch", imports=("torch",)),
    FrameworkInfo("caffe-mpi-style", "adapters.caffe_mpi", "torch-mpi", "mpi", image="pytorch",
                  imports=("torch", "mpi4py")),
    # horovodrun starts the gloo mode, mpirun the mpi mode (launchers/rendezvous/horovod.py)
    FrameworkInfo("horovod", "adapters.horovod", "horovod", "horovod", image="pytorch",
                  imports=("horovod.torch",)),
    # ps-lite's scheduler and servers started by dlcompare (launchers/rendezvous/dmlc.py)
    FrameworkInfo("mxnet", "adapters.mxnet", "mxnet", "dmlc", image="mxnet", imports=("mxnet",)),
    # the env:// variables: JAX's coordinator on MASTER_ADDR:MASTER_PORT
    FrameworkInfo("jax", "adapters.jax", "jax", "torch", imports=("jax",), companions=("jaxlib",)),
)}


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
    try:
        return info, info.scheme(mode or None).mode
    except catalogue.UnknownScheme as error:
        raise UnknownFramework(str(error)) from None


def load_trainer(name: str, mode: str):
    """Import the adapter module (and so the framework) and return the Trainer class of `mode`
    (the module's `TRAINERS`, one class per mode)."""
    module = importlib.import_module(framework_info(name).module)
    try:
        return module.TRAINERS[mode]
    except KeyError:
        raise UnknownFramework(f"{module.__name__} has no trainer for mode {mode!r} "
                               f"(it has: {', '.join(module.TRAINERS)})") from None
