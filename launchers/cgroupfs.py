"""`python -m launchers.cgroupfs COMMAND ...`: run COMMAND with the cgroup file systems in view.

`ip netns exec NODE` (how the emulated cluster enters a node) gives the command a private mount
namespace whose /sys is a fresh sysfs without the cgroup mounts under it, and podman's runtime
then refuses to create a container ("no cgroup mount found in mountinfo"). When /sys/fs/cgroup
is missing here, this mounts again, in this private namespace only, the cgroup file systems
PID 1 sees (same hierarchies, same options), then execs COMMAND. Where nothing is missing (no
namespace around it, or not root) it only execs COMMAND. The container runtime
(launchers/container_runtime.py) starts podman through it so a node's wrapper can go around it.

Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys

CGROUP_ROOT = "/sys/fs/cgroup"


def mount_points(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(mount point, file system type, source, super options) of each line of a mountinfo."""
    entries = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        separator = fields.index("-")
        entries.append((fields[4], fields[separator + 1], fields[separator + 2],
                        fields[separator + 3]))
    return entries


def restore_cgroup_mounts() -> None:
    """Mount PID 1's cgroup file systems where this mount namespace lacks them."""
    with open("/proc/self/mountinfo") as own:
        if any(point == CGROUP_ROOT for point, *_ in mount_points(own.read())):
            return
    if os.geteuid() != 0:
        return
    try:
        with open("/proc/1/mountinfo") as first:
            wanted = [entry for entry in mount_points(first.read())
                      if entry[0] == CGROUP_ROOT or entry[0].startswith(CGROUP_ROOT + "/")]
    except OSError:
        return
    for point, fstype, source, options in wanted:  # parents come first in mountinfo
        os.makedirs(point, exist_ok=True)
        subprocess.run(["mount", "-t", fstype, "-o", options, source, point],
                       capture_output=True)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m launchers.cgroupfs COMMAND [ARG ...]", file=sys.stderr)
        return 2
    restore_cgroup_mounts()
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
