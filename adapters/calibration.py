"""The worker's calibration mode (`launchers.calibrate`): what the performance model needs to
know about a scheme's communication stack, measured through the framework itself.

- **collective**: seconds per message size of the scheme's collective
  (`Trainer.collective_times`), the slowest rank per repeat; fitted to alpha, beta by
  `analysis.calibration`.
- **reduction** (CPU): a local float32 sum per size, the model's gamma.
- **contention** (schemes that overlap): how much the communication running beside backward
  and backward slow each other down.  The probe (`Trainer.contention_probe`) times the
  calibration network's communication-free backward alone and with each gradient sent as it
  appears (as WFBP hooks and MXNet's engine send them), through the framework's own
  asynchronous path, in alternating rounds, and when that exchange was back, and the same
  messages once more without backward (the exchange's own end);
  `analysis.calibration.fit_contention` turns them into the model's kappa and kappa_c.  On a
  CPU host whose cores the ranks' compute already fills, communication is CPU work too and
  cannot hide for free; on a GPU whose collectives run on their own engines both are near 0.

Every rank writes its file into the shared run directory; rank 0 merges them into the one
calibration record.
"""

from __future__ import annotations

import inspect
import statistics
import time
from pathlib import Path

import numpy as np

from adapters.base import DistInfo, RunConfig
from adapters.rankfiles import environment, wait_for_rank_files
from core.files import write_json_atomic

CONTENTION_ROUNDS = 21
LOOP_BYTES = 2 ** 20  # bytes of back-to-back messages per sample (config.calibrate["loop_bytes"])


def run_calibration(trainer, config: RunConfig, dist: DistInfo) -> None:
    """Time the scheme's collective per message size (every rank), on a CPU a local float32
    sum of the same sizes (the model's reduction cost gamma), and the contention; rank 0
    writes the slowest rank's time per repeat to the record path."""
    sizes = [int(n) for n in config.calibrate["sizes"]]
    repeats = int(config.calibrate.get("repeats", 10))
    warmup = int(config.calibrate.get("warmup", 2))
    trainer.collective_times(sizes[:1], 1, max(warmup, 5))  # first calls set up connections: not timed
    loop_bytes = int(config.calibrate.get("loop_bytes", LOOP_BYTES))
    collective = collective_samples(trainer, sizes, repeats, warmup, loop_bytes)
    result = {"collective": {str(k): v for k, v in collective.items()}}
    if config.device == "cpu" and config.calibrate.get("reduction", True):
        result["reduction"] = {str(k): v for k, v in reduction_times(sizes, repeats).items()}
    rank_dir = Path(config.rank_dir)
    if config.calibrate.get("contention", True):
        result["contention"] = contention(trainer)
    write_json_atomic(rank_dir / f"calibrate_rank{dist.rank}.json", result)
    trainer.barrier()
    if dist.rank != 0:
        return
    ranks = wait_for_rank_files(rank_dir, dist.world_size, name="calibrate_rank{rank}.json")
    slowest = {size: [max(r["collective"][size][i] for r in ranks) for i in range(len(times))]
               for size, times in ranks[0]["collective"].items()}
    write_json_atomic(Path(config.record_path), {
        "framework": config.framework, "mode": config.mode, "device": config.device,
        "nodes": config.nodes, "workers_per_node": config.workers_per_node,
        "world_size": config.world_size, "servers": config.servers,
        "comm_scheme": trainer.comm_scheme(), "collective": slowest, "loop_bytes": loop_bytes,
        "reduction": ranks[0].get("reduction"), "contention": merged_contention(ranks),
        "env": environment(trainer.versions()), "device_name": trainer.device_name()})


def collective_samples(trainer, sizes: list[int], repeats: int, warmup: int,
                       loop_bytes: int) -> dict[int, list[float]]:
    """`repeats` samples per size of the scheme's collective, taken in rounds: each round
    times every size once (the warm-up calls in the first), so sample i of every size comes
    from round i on every rank.  A burst of load on a shared machine then spoils a few
    samples of every size, which the per-size median drops, instead of every sample of a few
    neighbouring sizes, which bends the fit: one TF calibration timed 512 KiB-4 MiB 2.5x
    slow in all ten back-to-back repeats (fit alpha 4.5 ms, rms 28%, against 3.1 ms, 12%,
    a minute later), and the predictions built on it missed by up to 23%.

    Where the adapter's `collective_times` takes `iters`, a sample is the mean of
    back-to-back calls adding up to about `loop_bytes` (at most MAX_CALIBRATION_ITERS)."""
    per_call = loop_bytes > 0 and "iters" in inspect.signature(trainer.collective_times).parameters
    samples: dict[int, list[float]] = {int(n): [] for n in sizes}
    iters = {size: messages_per_sample(size, loop_bytes, trainer.MAX_CALIBRATION_ITERS) for size in samples}
    for round_ in range(repeats):
        first = warmup if round_ == 0 else 0
        if per_call:
            for size in samples:
                samples[size] += trainer.collective_times([size], 1, first, iters=iters[size])[size]
        else:
            for size, values in trainer.collective_times(list(samples), 1, first).items():
                samples[int(size)] += values
    return samples


def messages_per_sample(nbytes: int, loop_bytes: int, most: int) -> int:
    """Back-to-back messages of `nbytes` in one calibration sample: about `loop_bytes` in
    all, at least 1, at most `most` (the trainer's MAX_CALIBRATION_ITERS).  Adapters that
    must build a sample's messages ahead (TF graph mode) use it too."""
    return max(1, min(int(most), int(loop_bytes) // max(int(nbytes), 1)))


def reduction_times(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """Seconds of a local in-place float32 sum a += b per size (NumPy on the host)."""
    times = {}
    for nbytes in sizes:
        a = np.zeros(max(1, nbytes // 4), dtype=np.float32)
        b = np.ones_like(a)
        np.add(a, b, out=a)
        measured = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.add(a, b, out=a)
            measured.append(time.perf_counter() - start)
        times[nbytes] = measured
    return times


# --------------------------------------------------------------------------- contention

def contention(trainer, rounds: int = CONTENTION_ROUNDS) -> dict | None:
    """This rank's contention probe (`Trainer.contention_probe`) for a scheme that
    overlaps; None where it does not overlap or the adapter has no probe."""
    scheme = trainer.comm_scheme() or {}
    if not scheme.get("overlap"):
        return None
    try:
        return trainer.contention_probe(rounds)
    except NotImplementedError:
        return None


def merged_contention(ranks: list[dict]) -> dict | None:
    """The probe of the rank whose backward the submissions slowed most (the slowest rank
    decides a synchronous iteration), with every rank's samples; None without a probe."""
    probes = [r.get("contention") for r in ranks]
    if not probes or any(p is None for p in probes):
        return None

    def slowdown(probe):
        return statistics.median(probe["with_s"]) / statistics.median(probe["alone_s"])

    worst = max(probes, key=slowdown)
    return {**worst, "rank_slowdown": [slowdown(p) for p in probes]}
