"""Benchmark: how long `dlcompare tune` takes to predict a 1,000-point space before it measures.

    python -m bench.tune_predict results/tune [--workers 1-10] [--nodes 1-25]

Reads a folder that `dlcompare tune` (or `dlcompare run` at one worker plus `dlcompare
calibrate`) filled with one-worker profiles and calibrations, and predicts its schemes x batches
over `--workers` x `--nodes` (by default 1..10 workers per node and 1..25 nodes: with two schemes
at two batches, 1,000 points) the way `tune` does (`launchers.tune.predicted`), five times;
prints the median and the spread of the wall time.  Target: under 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from core.envs import reexec_in_host_env

if __name__ == "__main__":  # pandas, the model: the launcher's environment
    reexec_in_host_env("bench.tune_predict", sys.argv[1:])

from analysis.store import ResultStore  # noqa: E402
from launchers.tune import predicted  # noqa: E402


def span(text: str) -> list[int]:
    """'1-10' -> 1..10."""
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tune_predict", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a tune folder: one-worker profiles and calibrations")
    parser.add_argument("--workers", default="1-10", help="workers per node, LOW-HIGH (default 1-10)")
    parser.add_argument("--nodes", default="1-25", help="nodes, LOW-HIGH (default 1-25)")
    args = parser.parse_args(argv)
    out = Path(args.folder).resolve()
    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        singles = [r for r in store.records() if r.get("status") == "ok" and r.get("world_size") == 1]
    frameworks = sorted({(r["framework"], r["mode"]) for r in singles})
    batches = sorted({int(r["batch_per_worker"]) for r in singles})
    model = singles[0]["model"]
    times, points = [], 0
    for _ in range(5):
        started = time.perf_counter()
        points = len(predicted(out, frameworks, model, batches, span(args.workers), span(args.nodes)))
        times.append(time.perf_counter() - started)
    print(f"{points} points ({len(frameworks)} schemes x {len(batches)} batches x {args.workers} workers x "
          f"{args.nodes} nodes): median {statistics.median(times):.2f} s [{min(times):.2f}-{max(times):.2f}] "
          "over 5 predictions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
