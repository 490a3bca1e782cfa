"""The cluster transports by `--cluster` kind: the one place that imports them all and
chooses one (see launchers/cluster/__init__.py for what a transport provides)."""

from __future__ import annotations

from launchers.cluster import ClusterError, ClusterSpec, LocalCluster
from launchers.cluster.emulated import EmulatedCluster, check_can_emulate
from launchers.cluster.slurm import SlurmCluster
from launchers.cluster.ssh import SshCluster


def preflight(spec: ClusterSpec) -> None:
    """What the transport needs from this machine (root, tools), checked before anything is
    built or stored: a ClusterError in one line."""
    if spec.kind == "emulated":
        check_can_emulate()
    elif spec.kind == "slurm":
        SlurmCluster()


def make_cluster(spec: ClusterSpec, campaign, dry_run: bool = False):
    """The transport for `spec`, set up for `campaign` (dry_run: named, nothing created)."""
    if spec.kind == "local":
        return LocalCluster()
    if spec.kind == "emulated":
        return EmulatedCluster.for_campaign(campaign, dry_run=dry_run)
    if spec.kind == "hostfile":
        return SshCluster.from_hostfile(spec.path, campaign, dry_run=dry_run)
    if spec.kind == "slurm":
        return SlurmCluster.for_campaign(campaign, dry_run=dry_run)
    raise ClusterError(f"no cluster transport {spec.kind!r}")
