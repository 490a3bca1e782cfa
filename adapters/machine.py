"""What the machine was doing while a run was timed: its cores, its load, and how much of it
the run's own ranks used.

A CPU rank's speed depends on how many cores it really had: several workers on one machine
share its cores (each gets threads_per_worker), and anything else running there takes its
share too.  Each rank samples its machine before and after the timed loops (`sample`); rank 0
merges the samples (`machine_fields`) into the record's cpu_cores, ranks_per_host,
oversubscribed, load_avg_start, load_avg_end and other_load.

Standard library only; Linux's /proc gives the CPU time of the whole machine and of the
rank's own process tree (a framework's helper processes, data-loader workers, CNTK's
backend).  Where /proc is missing the CPU-time fields stay None.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import time
from pathlib import Path

PROC = Path("/proc")


def host_id() -> str:
    """One machine's identity: the kernel's boot id, shared by every network namespace and
    container on it (emulated nodes run on one host), else the host name."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def usable_cores() -> int:
    """Cores this process may run on (its affinity: a cgroup cpuset or taskset counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_busy_seconds() -> float | None:
    """CPU-seconds every core of the machine spent busy since boot (/proc/stat)."""
    try:
        fields = (PROC / "stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU-seconds used so far) of every process (/proc/<pid>/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return table


def process_tree_seconds(pid: int | None = None) -> float | None:
    """CPU-seconds used so far by process `pid` (this one) and its live descendants."""
    pid = pid or os.getpid()
    try:
        table = _process_table()
    except OSError:
        return None
    if pid not in table:
        return None
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    pending, total = [pid], 0.0
    while pending:
        current = pending.pop()
        total += table[current][1]
        pending += children.get(current, [])
    return total


def peak_resident_bytes() -> int:
    """The most memory this process has held resident so far (Linux counts ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def memory_total_bytes() -> int | None:
    """The machine's memory (/proc/meminfo MemTotal), None where it cannot be read."""
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def sample() -> dict:
    """The machine now, as one rank sees it."""
    return {"host": host_id(), "cores": usable_cores(), "load": os.getloadavg()[0],
            "busy_s": machine_busy_seconds(), "own_s": process_tree_seconds(), "at": time.monotonic()}


def interval(before: dict, after: dict) -> dict:
    """One rank's view of the timed interval between two samples."""
    def delta(key):
        return None if before[key] is None or after[key] is None else after[key] - before[key]

    return {"host": before["host"], "cores": before["cores"], "load_start": before["load"],
            "peak_resident_bytes": peak_resident_bytes(), "memory_total_bytes": memory_total_bytes(),
            "load_end": after["load"], "busy_s": delta("busy_s"), "own_s": delta("own_s"),
            "wall_s": after["at"] - before["at"]}


def machine_fields(intervals: list[dict], threads_per_worker: int, device: str) -> dict:
    """The record's machine fields from every rank's `interval` (rank 0's first).

    other_load: per machine, the cores busy during the timed interval minus what the ranks
    on it used themselves, averaged over the interval; the largest over machines.  A CPU run
    is oversubscribed when one machine's ranks ask for more threads than it has cores.
    """
    if not intervals:
        return {}
    by_host: dict[str, list[dict]] = {}
    for item in intervals:
        by_host.setdefault(item["host"], []).append(item)
    ranks_per_host = max(len(group) for group in by_host.values())
    cores = min(item["cores"] for item in intervals)
    other = []
    for group in by_host.values():
        if all(g["busy_s"] is not None and g["own_s"] is not None for g in group):
            wall = statistics.median(g["wall_s"] for g in group)
            busy = statistics.median(g["busy_s"] for g in group)
            if wall > 0:
                other.append(max(0.0, (busy - sum(g["own_s"] for g in group)) / wall))
    first = intervals[0]
    return {"cpu_cores": cores, "ranks_per_host": ranks_per_host,
            "oversubscribed": int(device == "cpu" and ranks_per_host * max(1, threads_per_worker) > cores),
            "load_avg_start": first["load_start"], "load_avg_end": first["load_end"],
            "other_load": max(other) if other else None}
