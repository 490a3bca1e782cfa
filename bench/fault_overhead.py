"""Benchmark: what the campaign's safeguards against lost results and orphaned ranks cost.

    python -m bench.fault_overhead [--runs 20] [--workers 1] [--iterations 20]

A campaign of `--runs` tiny runs (torch, alexnet-tiny, batch 16) with the safeguards and as
many without them, interleaved (with, without, then without, with, ...) so the machine's
noise hits both alike, each through the real local transport and a real store:

- with: every rank started with its parent-death signal and a stdin lifeline, each rank's
  parent watch thread running, the record kept in its run folder before it is stored;
- without: none of those (`run_local(lifelines=False)`, which also sets DLC_PARENT_WATCH=0
  for the ranks), the record only stored.

Per run it reports the wall time (start of the ranks to their end) and the measured
iteration time (median over repeats), and the store write; per campaign, the folder lock
and the integrity check (`PRAGMA quick_check` of the store holding every run of the
benchmark, which each open of a store pays once). Medians with p10-p90; the safeguards
should add nothing beyond the noise. Runs in the launcher's environment (envs/host.txt).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from core.envs import reexec_in_host_env

if __name__ == "__main__":  # pandas, psutil: the launcher's environment
    reexec_in_host_env("bench.fault_overhead", sys.argv[1:])

import numpy as np  # noqa: E402

from adapters.base import RunConfig  # noqa: E402
from analysis.store import STORE_FILENAME, CampaignLock, ResultStore, integrity_problem  # noqa: E402
from core.envs import REPO_ROOT, ensure_environment  # noqa: E402
from launchers.campaign import keep_record  # noqa: E402
from launchers.local import run_local  # noqa: E402

MODES = ("with", "without")


def spread(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    """'median [p10–p90] unit' of `values` times `scale`."""
    p10, p90 = np.percentile(values, [10, 90])
    return (f"{statistics.median(values) * scale:8.3f} [{p10 * scale:.3f}–{p90 * scale:.3f}] "
            f"{unit}").rstrip()


def tiny_run(out: Path, index: int, mode: str, args) -> RunConfig:
    run_id = f"bench-{index:03d}-{mode}"
    run_dir = out / "runs" / run_id
    return RunConfig(run_id=run_id, campaign=out.name, framework="torch", mode="ddp",
                     model="alexnet-tiny", batch_per_worker=16, workers_per_node=args.workers,
                     iterations=args.iterations, warmup=2, repeats=3, profile_iterations=1,
                     threads_per_worker=1, rank_dir=str(run_dir),
                     record_path=str(run_dir / "record.json"))


def one_run(store: ResultStore, out: Path, index: int, mode: str, python: str, args) -> dict:
    config = tiny_run(out, index, mode, args)
    started = time.perf_counter()
    outcome = run_local(config, python, Path(config.rank_dir), "torch", REPO_ROOT, timeout=600,
                        lifelines=mode == "with")
    wall = time.perf_counter() - started
    if outcome.status != "ok":
        raise SystemExit(f"{config.run_id}: {outcome.status}: {outcome.error}")
    record = json.loads(Path(config.record_path).read_text())
    started = time.perf_counter()
    if mode == "with":
        keep_record(config, record)
    store.add(record)
    return {"wall": wall, "iteration": record["iter_time_median"],
            "store": time.perf_counter() - started}


def campaign_costs(out: Path, repeats: int) -> dict[str, list[float]]:
    """The folder lock (take and release) and the store's integrity check, `repeats` times."""
    lock, check = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        CampaignLock(out).acquire().release()
        lock.append(time.perf_counter() - started)
        with ResultStore(out / STORE_FILENAME) as store:
            started = time.perf_counter()
            assert integrity_problem(store._conn) is None
            check.append(time.perf_counter() - started)
    return {"lock": lock, "check": check}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fault_overhead",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (default: 20)")
    parser.add_argument("--workers", type=int, default=1, help="ranks per run (default: 1)")
    parser.add_argument("--iterations", type=int, default=20,
                        help="timed iterations per repeat (default: 20)")
    args = parser.parse_args(argv)
    python = str(ensure_environment("torch", log=print).python)
    timings = {mode: {"wall": [], "iteration": [], "store": []} for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="dlc-fault-overhead-") as folder:
        out = Path(folder) / "campaign"
        with ResultStore.for_campaign(out) as store:
            for index in range(args.runs):
                order = MODES if index % 2 == 0 else MODES[::-1]
                for mode in order:
                    for key, value in one_run(store, out, index, mode, python, args).items():
                        timings[mode][key].append(value)
                print(f"round {index + 1}/{args.runs}: " + ", ".join(
                    f"{mode} {timings[mode]['wall'][-1]:.2f} s" for mode in MODES), flush=True)
        costs = campaign_costs(out, args.runs)
        runs = len(ResultStore(out / STORE_FILENAME, create=False))
    print(f"\n{args.runs} runs of each kind, torch alexnet-tiny b16, {args.workers} rank(s), "
          f"{args.iterations} iterations x 3 repeats (median [p10–p90]):")
    for key, label, scale, unit in (("wall", "run wall time", 1, "s"),
                                    ("iteration", "iteration time", 1e3, "ms"),
                                    ("store", "record kept + stored", 1e3, "ms")):
        ratio = statistics.median(timings["with"][key]) / statistics.median(timings["without"][key])
        print(f"  {label:22s} with {spread(timings['with'][key], scale, unit)}   "
              f"without {spread(timings['without'][key], scale, unit)}   with/without {ratio:.3f}")
    paired = [w - o for w, o in zip(timings["with"]["wall"], timings["without"]["wall"])]
    print(f"  run wall time, with - without in the same round {spread(paired, 1, 's')}")
    print(f"  folder lock (take + release)   {spread(costs['lock'], 1e6, 'us')}")
    print(f"  integrity check, {runs} runs     {spread(costs['check'], 1e3, 'ms')}  (once per open)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
