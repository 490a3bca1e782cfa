"""Benchmark: the terminal overview of a sweep at 100, 1,000 and 5,000 runs.

    python -m bench.sweep_overview [--sizes 100,1000,5000] [--rounds 3]

Builds a throw-away store per size (two schemes swept over per-worker batch on three
topologies, `tests.test_analysis_data.sweep_records`), then times `dlcompare summary DIR` as a
user runs it: a fresh interpreter per round (imports included), the median of `--rounds`.
Prints per size the store's build time, the summary's median time and range, its time per
run and its line count.  Targets: under 2 s at 1,000 runs, at most `SCREEN_LINES` lines at
every size, and a cost that grows no faster than linearly (from 1,000 to 5,000 runs the time at
most 5 × the 1,000-run time); exit 1 when one is missed.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.cli import OneLineParser, listed
from core.envs import REPO_ROOT, reexec_in_host_env

SUMMARY_TARGET_S = 2.0  # at 1,000 runs
TARGET_SIZE = 1000


def make_store(folder: Path, runs: int) -> float:
    """A sweep of `runs` records in `folder`; returns the seconds it took to store them."""
    from tests.test_analysis_data import SWEEP_SCHEMES, SWEEP_TOPOLOGIES, make_campaign, sweep_records

    per_batch = len(SWEEP_SCHEMES) * len(SWEEP_TOPOLOGIES)
    batches = range(2, 2 + 2 * -(-runs // per_batch), 2)
    started = time.perf_counter()
    make_campaign(folder, sweep_records(batches)[:runs])
    return time.perf_counter() - started


def time_summary(folder: Path) -> tuple[float, int]:
    """One `python -m analysis.summary DIR` in a fresh interpreter: (seconds, lines printed)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "analysis.summary", str(folder)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"bench: summary of {folder} failed: {done.stderr.strip()}")
    return elapsed, len(done.stdout.splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.sweep_overview", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="comma-separated run counts")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-interpreter summaries per size")
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.sweep_overview", sys.argv[1:] if argv is None else argv)
    from analysis.summary import SCREEN_LINES

    sizes = sorted(int(s) for s in args.sizes.split(","))
    medians: dict[int, float] = {}
    missed = []
    print(f"{'runs':>6} {'store s':>8} {'summary s [min–max]':>22} {'ms/run':>7} {'lines':>6}")
    with tempfile.TemporaryDirectory(prefix="dlcompare-sweep-") as scratch:
        for size in sizes:
            folder = Path(scratch) / f"sweep{size}"
            stored = make_store(folder, size)
            timed = [time_summary(folder) for _ in range(args.rounds)]
            seconds = [t for t, _ in timed]
            lines = max(n for _, n in timed)
            medians[size] = statistics.median(seconds)
            print(f"{size:>6} {stored:>8.1f} {medians[size]:>9.2f} [{min(seconds):.2f}–{max(seconds):.2f}]"
                  f"{'':>3} {1e3 * medians[size] / size:>7.2f} {lines:>6}")
            if lines > SCREEN_LINES:
                missed.append(f"{size} runs: {lines} lines (target {SCREEN_LINES})")
    if TARGET_SIZE in medians and medians[TARGET_SIZE] > SUMMARY_TARGET_S:
        missed.append(f"{TARGET_SIZE} runs: {medians[TARGET_SIZE]:.2f} s (target {SUMMARY_TARGET_S} s)")
    for small, large in zip(sizes, sizes[1:]):
        if medians[large] > medians[small] * large / small:
            missed.append(f"{small}→{large} runs: time grew {medians[large] / medians[small]:.1f}×, "
                          f"faster than the runs ({large / small:.0f}×)")
    if missed:
        print("missed: " + listed(missed, first=len(missed)))
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
