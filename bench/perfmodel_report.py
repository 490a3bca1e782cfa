"""Benchmark: building the report of a 50-run campaign (predictions, tables, figures, HTML).

    python -m bench.perfmodel_report [--runs 50] [--rounds 3]

Builds a throw-away campaign of `--runs` realistic records (five schemes x two models x
workers 1, 2, 4 and 2 nodes, repeated; per-layer backward times; a calibration per scheme) and
times `analysis.report.build_report` (refreshing every run's prediction, writing the tables
incl. LaTeX, drawing every figure, the HTML) in this process, and the CLI
`python -m analysis.report DIR` in a fresh interpreter.  Target: under 10 seconds.
"""

from __future__ import annotations

import os
import resource
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core import schemes as catalogue
from core.cli import OneLineParser
from core.envs import REPO_ROOT, reexec_in_host_env

# the catalogue's descriptions of three; two records without one (the model assumes a scheme)
DESCRIBED = ("torch:ddp", "cntk-style:allreduce", "caffe-mpi-style:mpi")
SCHEMES = [(info.framework, info.label, info.mode, info.describe() if info.name in DESCRIBED else None)
           for info in (catalogue.SCHEMES[name] for name in (*DESCRIBED, "tf:collective", "mxnet:dist_sync"))]
TOPOLOGIES = [(1, 1), (1, 2), (1, 4), (2, 2)]  # (nodes, world size)


def make_campaign(folder: Path, runs: int) -> Path:
    from analysis.calibration import CalibrationFit
    from analysis.perfmodel import split_backward_by_flops
    from analysis.store import ResultStore
    from models import get_model
    from tests.test_analysis_data import make_record

    combos = list(itertools.product(SCHEMES, ("googlenet", "resnet50"), TOPOLOGIES))
    with ResultStore.for_campaign(folder) as store:
        for k in range(runs):
            (framework, label, mode, scheme), model, (nodes, world) = combos[k % len(combos)]
            rows = [(r.name, r.flops, r.params > 0) for r in get_model(model).layer_table()]
            t = 0.1 * (1 + 0.15 * (world - 1)) * (1 + 0.02 * (k // len(combos)))
            record = make_record(label, framework, mode, world, t, run_id=f"run{k:03d}", model=model, nodes=nodes,
                                 workers_per_node=world // nodes, servers=1 if framework == "mxnet" else 0,
                                 started_at=f"2026-01-01T00:{k // 60:02d}:{k % 60:02d}")
            backward = 0.06
            record["phases"] = [{"phase": p, "measured_s": v, "predicted_s": None} for p, v in
                                {"io": 0.001, "h2d": 0.002, "forward": 0.03, "backward": backward,
                                 "comm": 0.0 if world == 1 else 0.02 * world, "update": 0.004}.items()]
            record["extra"] = {"layer_backward_source": "flop-share",
                               "layer_backward_s": [list(x) for x in split_backward_by_flops(backward, rows)]}
            if scheme:
                record["extra"]["comm_scheme"] = {"algorithm": "ring", **scheme}
            record["predicted_iter_time"] = record["prediction_error"] = None
            store.add(record)
        for framework, _, mode, scheme in SCHEMES[:3]:
            store.add_calibration(CalibrationFit(framework, mode, scheme["transport"], "allreduce", "ring", "cpu", 1,
                                                 2, 2, 0, 40e-6, 1.1e-9, 0.05, 20e-6, 1e-9, 0.2e-9, 17, 10),
                                  {1024: [4e-5], 2 ** 20: [1.2e-3]})
    return folder


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.perfmodel_report", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.perfmodel_report", sys.argv[1:] if argv is None else argv)
    import matplotlib  # noqa: F401 - imported before timing, as the CLI pays it once

    from analysis import report

    with tempfile.TemporaryDirectory() as tmp:
        out = make_campaign(Path(tmp) / "campaign", args.runs)
        inside, fresh, inside_cpu, fresh_cpu = [], [], [], []
        for _ in range(args.rounds):
            started, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
            report.build_report(out)
            inside.append(time.perf_counter() - started)
            inside_cpu.append(time.process_time() - cpu + _children_cpu() - children)
            started, children = time.perf_counter(), _children_cpu()
            done = subprocess.run([sys.executable, "-m", "analysis.report", str(out)], cwd=REPO_ROOT,
                                  capture_output=True, text=True)
            fresh.append(time.perf_counter() - started)
            fresh_cpu.append(_children_cpu() - children)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
        size = (out / "report.html").stat().st_size
        print(f"report of a {args.runs}-run campaign ({size / 1e6:.1f} MB HTML, "
              f"{len(list((out / 'figures').glob('*.png')))} figures, {len(list((out / 'tables').glob('*')))} table files)")
        print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (wall time suffers "
              "when other work competes for the CPUs; CPU time much less)")
        print(f"  build_report in process:  wall median {statistics.median(inside):.2f} s (max {max(inside):.2f}), "
              f"CPU {statistics.median(inside_cpu):.2f} s, over {args.rounds} rounds")
        print(f"  CLI, fresh interpreter:   wall median {statistics.median(fresh):.2f} s (max {max(fresh):.2f}), "
              f"CPU {statistics.median(fresh_cpu):.2f} s")
        print(f"  target < 10 s wall: {'met' if statistics.median(fresh) < 10 else 'NOT met'} here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
