"""Benchmark: the overview and the report of a sweep at 100, 1,000 and 5,000 runs.

    python -m bench.sweep_overview [--sizes 100,1000,5000] [--rounds 3] [--report-sizes 100,1000,5000]

Builds a throw-away store per size (three schemes swept over per-worker batch, workers and
emulated bandwidth, `tests.test_analysis_data.wide_sweep_records`), then times `dlcompare
summary DIR` as a user runs it: a fresh interpreter per round (imports included), the median of
`--rounds`.  Prints per size the store's build time, the summary's median time and range, its
time per run and its line count; then, for `--report-sizes`, one `dlcompare report DIR` each:
its time and time per run, report.html's size, the folder's size without the store, the largest
figure side.
Targets: at 1,000 runs summary under 2 s, report under 15 s, report.html under 5 MB and the
folder under 10 MB; at every size at most `SCREEN_LINES` lines, a summary cost that grows no
faster than linearly and no figure side over `MAX_PX`; exit 1 when one is missed.
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
REPORT_TARGET_S = 15.0  # at 1,000 runs
PAGE_TARGET_BYTES = 5_000_000
FOLDER_TARGET_BYTES = 10_000_000
TARGET_SIZE = 1000


def make_store(folder: Path, runs: int) -> float:
    """A sweep of `runs` records in `folder`; returns the seconds it took to store them."""
    from tests.test_analysis_data import make_campaign, wide_sweep_records

    records = wide_sweep_records(runs)
    started = time.perf_counter()
    make_campaign(folder, records)
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


def time_report(folder: Path) -> dict:
    """One `python -m analysis.report DIR` in a fresh interpreter: its seconds, the page's and
    the folder's bytes (the store left out) and the largest figure side in pixels."""
    from analysis.report import png_size

    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "analysis.report", str(folder)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"bench: report of {folder} failed: {done.stderr.strip()}")
    files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("results.sqlite")]
    sides = [max(png_size(p.read_bytes())) for p in (folder / "figures").glob("*.png")]
    return {"seconds": elapsed, "page": (folder / "report.html").stat().st_size,
            "folder": sum(p.stat().st_size for p in files), "largest_px": max(sides, default=0)}


def report_lines(sizes: list[int], folders: dict[int, Path]) -> list[str]:
    """Build and measure the report at each size; returns the targets missed."""
    from analysis.figures import MAX_PX

    missed = []
    print(f"\n{'runs':>6} {'report s':>9} {'ms/run':>7} {'page MB':>8} {'folder MB':>10} {'largest px':>11}")
    for size in sizes:
        got = time_report(folders[size])
        print(f"{size:>6} {got['seconds']:>9.1f} {1e3 * got['seconds'] / size:>7.1f} {got['page'] / 1e6:>8.2f} "
              f"{got['folder'] / 1e6:>10.2f} {got['largest_px']:>11}")
        if size == TARGET_SIZE and got["seconds"] > REPORT_TARGET_S:
            missed.append(f"report of {size} runs: {got['seconds']:.1f} s (target {REPORT_TARGET_S:.0f} s)")
        if size == TARGET_SIZE and (got["page"] > PAGE_TARGET_BYTES or got["folder"] > FOLDER_TARGET_BYTES):
            missed.append(f"report of {size} runs: page {got['page'] / 1e6:.1f} MB, folder "
                          f"{got['folder'] / 1e6:.1f} MB (targets 5 and 10 MB)")
        if got["largest_px"] > MAX_PX:
            missed.append(f"report of {size} runs: a figure {got['largest_px']} px on a side")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.sweep_overview", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000", help="comma-separated run counts")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-interpreter summaries per size")
    parser.add_argument("--report-sizes", default="100,1000,5000",
                        help="sizes whose report is built and measured ('' for none)")
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.sweep_overview", sys.argv[1:] if argv is None else argv)
    from analysis.summary import SCREEN_LINES

    sizes = sorted(int(s) for s in args.sizes.split(","))
    report_sizes = sorted(int(s) for s in args.report_sizes.split(",") if s)
    folders: dict[int, Path] = {}
    medians: dict[int, float] = {}
    missed = []
    print(f"{'runs':>6} {'store s':>8} {'summary s [min–max]':>22} {'ms/run':>7} {'lines':>6}")
    with tempfile.TemporaryDirectory(prefix="dlcompare-sweep-") as scratch:
        for size in sorted(set(sizes) | set(report_sizes)):
            folders[size] = folder = Path(scratch) / f"sweep{size}"
            stored = make_store(folder, size)
            if size not in sizes:
                continue
            timed = [time_summary(folder) for _ in range(args.rounds)]
            seconds = [t for t, _ in timed]
            lines = max(n for _, n in timed)
            medians[size] = statistics.median(seconds)
            print(f"{size:>6} {stored:>8.1f} {medians[size]:>9.2f} [{min(seconds):.2f}–{max(seconds):.2f}]"
                  f"{'':>3} {1e3 * medians[size] / size:>7.2f} {lines:>6}")
            if lines > SCREEN_LINES:
                missed.append(f"{size} runs: {lines} lines (target {SCREEN_LINES})")
        missed += report_lines(report_sizes, folders)
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
