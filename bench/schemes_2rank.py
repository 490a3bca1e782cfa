"""Benchmark: the study's aggregation schemes side by side — 2 ranks on this machine, the three
full models at the default CPU batch, iteration time and measured overlap, in one campaign.

    python -m bench.schemes_2rank [--out results/bench-schemes-2rank]
        [--frameworks torch,cntk-style,caffe-mpi-style,horovod:gloo,horovod:mpi]
        [--models alexnet,googlenet,resnet50] [--iterations 3] [--repeats 3]

It runs `python -m launchers.compare --workers 2` over the schemes (so every number is also in
that campaign's store, report and tables) and prints one table: per model and scheme, the
median iteration time with its p10-p90 spread, the separated profile's backward and
communication (aggregation run after backward), the overlapped backward+communication and the
measured overlap = (t_b + t_c - t_bc) / t_c, and the performance model's prediction. The machine
and its load are printed first: on a 2-core CPU the "workers" share cores, so the ordering
reflects each scheme's communication stack and how it competes with backward for the cores,
not GPU-like scaling.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bench import run_compare
from core.cli import OneLineParser
from core.envs import reexec_in_host_env

SCHEMES = "torch,cntk-style,caffe-mpi-style,horovod:gloo,horovod:mpi"
HEADER = (f"{'model':10s} {'scheme':22s} {'b':>3s} {'iter ms':>8s} {'p10-p90':>13s} "
          f"{'bwd ms':>7s} {'comm ms':>8s} {'bwd+comm':>9s} {'overlap':>7s} {'pred ms':>8s}")


def milliseconds(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1e3


def row(record: dict) -> str:
    """One line of the table for a stored record (see the module's docstring)."""
    scheme = f"{record['framework']}:{record['mode']}"
    start = f"{record['model']:10s} {scheme:22s} {record['batch_per_worker']:3d}"
    if record["status"] != "ok":
        return f"{start} {record['status']}: {(record['error'] or '').splitlines()[:1]}"
    phases = {p["phase"]: p.get("measured_s") for p in record["phases"]}
    overlap = record["overlap"] if record["overlap"] is not None else float("nan")
    return (f"{start} {milliseconds(record['iter_time_median']):8.1f} "
            f"{milliseconds(record['iter_time_p10']):6.0f}-"
            f"{milliseconds(record['iter_time_p90']):<6.0f} "
            f"{milliseconds(phases.get('backward')):7.1f} "
            f"{milliseconds(phases.get('comm')):8.1f} "
            f"{milliseconds(record['extra'].get('profile_backward_comm')):9.1f} "
            f"{overlap:7.2f} {milliseconds(record.get('predicted_iter_time')):8.1f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench-schemes-2rank")
    parser.add_argument("--frameworks", default=SCHEMES)
    parser.add_argument("--models", default="alexnet,googlenet,resnet50")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.schemes_2rank", argv)
    out = Path(args.out).resolve()
    print(json.dumps({"cpu_count": os.cpu_count(), "load_average": os.getloadavg()}), flush=True)
    code = run_compare(["--frameworks", args.frameworks, "--model", args.models,
                        "--workers", "2", "--iterations", str(args.iterations),
                        "--repeats", str(args.repeats), "--warmup", "2",
                        "--profile-iterations", "3", "--calibrate"], out)
    print(json.dumps({"load_average_after": os.getloadavg()}))
    from analysis.store import ResultStore

    print(HEADER)
    records = ResultStore.for_campaign(out, create=False).records()
    for record in sorted(records, key=lambda r: (r["model"], r["framework"], r["mode"])):
        print(row(record), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
