"""This machine alone: `--cluster local` (the default): every process here, on loopback."""

from __future__ import annotations

from launchers.cluster import Transport, TransportError, transports


class LocalCluster(Transport):
    """One node, this machine: nothing to set up, shape or tear down; the processes are started
    by the local launcher (launchers/local.py), the base class's default."""

    kind = "local"
    summary = "this machine, 1 node"
    max_nodes = 1

    def validate(self, campaign) -> None:
        if max(campaign.nodes) > 1:
            multi = ", ".join(t.syntax() for t in transports().values() if t.max_nodes > 1)
            raise TransportError(f"--nodes above 1 needs a cluster transport: --cluster {multi}")
        super().validate(campaign)

    def identity(self, bandwidth, latency) -> dict:
        """Nothing: runs on this machine keep the configuration hashes they had before there
        were transports, so stored campaigns still resume."""
        return {}

    def describe(self) -> list[str]:
        return []

    def commands(self, run, python: str, rendezvous: str, timeout: float) -> list[str]:
        """Nothing beyond the plan: every process runs here as the plan says."""
        return []
