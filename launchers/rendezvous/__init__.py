"""How the processes of one run find each other, each framework its own way, on free ports.

A rendezvous kind (named by the framework's entry in adapters/registry.py) turns a run into the
list of processes to start: the workers, and for parameter-server schemes the servers and a
scheduler. Every process runs the same entry point (`python -m adapters.worker RUN.json`);
DLC_ROLE tells it which part to play, and DLC_RANK / DLC_WORLD_SIZE / DLC_LOCAL_RANK give workers
their place uniformly. The framework-specific variables (MASTER_ADDR, TF_CONFIG, DMLC_*) are
what the framework's own runtime reads. One module per kind, chosen in `processes_for`.
"""

from __future__ import annotations

import importlib
import pkgutil
import socket
from dataclasses import dataclass, field

# One module of this package per kind (what a framework's `rendezvous` in the registry names).
KINDS = tuple(sorted(module.name for module in pkgutil.iter_modules(__path__)))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it).

    A node's address that is not this machine's (another host, or an emulated node inside its
    own network namespace) cannot be bound here: any free port of this machine is then taken,
    which on a fresh node or namespace is free too."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            sock.bind(("", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Host:
    """A node the run may use: its address as the other nodes reach it, the name launchers
    such as mpirun, horovodrun and ssh reach it by (empty: the address), the network interface
    its ranks must use (None: loopback, this machine), and its slots (0: unknown)."""

    address: str = "127.0.0.1"
    name: str = ""
    interface: str | None = None
    slots: int = 0

    @property
    def target(self) -> str:
        """How a launcher names this node (mpirun -H, horovodrun -H, ssh)."""
        return self.name or self.address

    @property
    def is_loopback(self) -> bool:
        return self.interface in (None, "lo") and (
            self.address.startswith("127.") or self.address in ("localhost", "::1"))


@dataclass
class ProcessSpec:
    """One process of a run. Workers define success; other roles serve them and are ended
    when every worker has finished (a server that fails before that fails the run)."""

    role: str  # worker, server, scheduler, ...
    index: int  # rank among the processes of its role
    host: Host
    env: dict[str, str] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)  # e.g. mpirun ...: starts the ranks

    def __post_init__(self):
        self.env.setdefault("DLC_ROLE", self.role)
        self.env.setdefault("DLC_ROLE_INDEX", str(self.index))

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"


def worker_env(rank: int, local_rank: int, world_size: int) -> dict[str, str]:
    return {"DLC_ROLE": "worker", "DLC_RANK": str(rank), "DLC_WORLD_SIZE": str(world_size),
            "DLC_LOCAL_RANK": str(local_rank)}


def worker_hosts(config, hosts: list[Host]) -> list[tuple[int, int, Host]]:
    """(rank, local rank, host) for every worker: node-major, workers_per_node per node."""
    return [(node * config.workers_per_node + local, local, hosts[node])
            for node in range(config.nodes) for local in range(config.workers_per_node)]


def processes_for(kind: str, config, hosts: list[Host] | None = None) -> list[ProcessSpec]:
    """The processes of one run for rendezvous `kind` (a module of this package)."""
    if kind not in KINDS:
        raise ValueError(f"no rendezvous of kind {kind!r} (known: {', '.join(KINDS)})")
    hosts = hosts or [Host()] * config.nodes
    module = importlib.import_module(f"launchers.rendezvous.{kind}")
    return module.processes(config, hosts)
