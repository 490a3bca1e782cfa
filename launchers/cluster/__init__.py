"""Cluster transports: where the processes of a multi-node run are placed.

`--cluster` chooses one, each in its own module:

  - `local` (launchers/cluster/__init__.py, `LocalCluster`): every process on this machine,
    on loopback; one node only.
  - `emulated` (launchers/cluster/emulated.py): every node a network namespace on this host
    with its own address on a private bridge and links shaped by `tc`.
  - `hostfile:FILE` (launchers/cluster/ssh.py): real nodes reached over ssh.
  - `slurm` (launchers/cluster/slurm.py): real nodes of a Slurm allocation, one sbatch job per
    run, srun or the framework's launcher inside it.

The transports are imported and chosen in one place, launchers/cluster/transports.py
(`preflight`, `make_cluster`); this module holds what they share.

A transport gives the local transport (launchers/local.py) what it needs to place a run:
`hosts(run)` (one `Host` per node: address, launcher name, interface) and `wrappers(run)`
(command wrappers such as `ip netns exec NS ...` or `ssh NODE ...`), so every framework's
rendezvous (launchers/rendezvous/) works unchanged on any transport, and a container
runtime's wrapper composes with them (innermost first). `prepare(run)` sets what a run
changes (link shaping), `close()` removes what the transport created.
"""

from __future__ import annotations

from dataclasses import dataclass

from launchers.rendezvous import Host

KINDS = ("local", "emulated", "hostfile:FILE", "slurm")


class ClusterError(ValueError):
    """Bad --cluster input or a cluster that cannot be used; one line for the CLI."""


@dataclass(frozen=True)
class ClusterSpec:
    kind: str  # local, emulated, hostfile, slurm
    path: str = ""  # the hostfile

    @property
    def label(self) -> str:
        return f"hostfile:{self.path}" if self.kind == "hostfile" else self.kind


def parse_cluster(text: str | None) -> ClusterSpec:
    text = (text or "local").strip()
    if text in ("local", "emulated", "slurm"):
        return ClusterSpec(text)
    if text.startswith("hostfile:") and text[len("hostfile:"):].strip():
        return ClusterSpec("hostfile", text[len("hostfile:"):].strip())
    raise ClusterError(f"--cluster takes {', '.join(KINDS)}; got {text!r}")


class LocalCluster:
    """This machine alone: processes on loopback, nothing to set up or tear down."""

    kind = "local"
    max_nodes = 1

    def hosts(self, run) -> list[Host]:
        return [Host()] * run.nodes

    def wrappers(self, run) -> list:
        return []

    def prepare(self, run) -> dict:
        return {}

    def describe(self) -> list[str]:
        return ["local: every process on this machine, loopback"]

    def traffic(self) -> list[int]:
        return []

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
