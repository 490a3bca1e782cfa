"""Benchmark: the what-if CLI on a 4 x 3 x 2 grid (nodes x bandwidth x latency).

    python -m bench.perfmodel_predict [--rounds 5]

Builds a throw-away campaign with one-worker ResNet-50 profiles of three schemes (DDP-like
buckets, whole gradient after backward, layer-wise tensors) and a calibration, then times
`analysis.predict.run` in this process (store read, prediction of every scheme at every grid
point, table, CSV, Markdown, SVG) and the CLI as a user runs it (a fresh interpreter).
Target: under one second.  Runs in the launcher's environment (re-executes itself there).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from core.cli import OneLineParser
from core.envs import REPO_ROOT, reexec_in_host_env

GRID = ["--nodes", "2,4,8,16", "--bandwidth", "10Gbit,56Gbit,100Gbit", "--latency", "5us,50us"]
SCHEMES = {
    "torch": ("PyTorch DDP", "ddp", {"overlap": True, "granularity": "bucket", "bucket_bytes": 25 * 2 ** 20,
                                     "first_bucket_bytes": 2 ** 20, "profile_granularity": "whole",
                                     "algorithm": "ring", "transport": "gloo"}),
    "cntk-style": ("CNTK-style", "allreduce", {"overlap": False, "granularity": "whole", "algorithm": "ring",
                                               "transport": "gloo"}),
    "caffe-mpi-style": ("Caffe-MPI-style", "mpi", {"overlap": True, "granularity": "tensor", "algorithm": "ring",
                                                   "transport": "mpi"}),
}


def make_campaign(folder: Path, model: str = "resnet50") -> Path:
    from analysis.calibration import CalibrationFit
    from analysis.perfmodel import split_backward_by_flops
    from analysis.store import ResultStore
    from models import get_model
    from tests.test_analysis_data import make_record

    spec = get_model(model)
    rows = [(r.name, r.flops, r.params > 0) for r in spec.layer_table()]
    with ResultStore.for_campaign(folder) as store:
        for framework, (label, mode, scheme) in SCHEMES.items():
            record = make_record(label, framework, mode, 1, 0.110, run_id=f"{framework}-1", model=model)
            record["phases"] = [{"phase": p, "measured_s": v, "predicted_s": None} for p, v in
                                {"io": 0.001, "h2d": 0.004, "forward": 0.035, "backward": 0.065, "comm": 0.0,
                                 "update": 0.005}.items()]
            record["extra"] = {"comm_scheme": scheme, "layer_backward_source": "flop-share",
                               "layer_backward_s": [list(x) for x in split_backward_by_flops(0.065, rows)]}
            store.add(record)
            store.add_calibration(CalibrationFit(framework, mode, scheme["transport"], "allreduce", "ring", "cpu", 1,
                                                 2, 2, 0, 40e-6, 1.1e-9, 0.05, 20e-6, 1e-9, 0.2e-9, 17, 10),
                                  {1024: [4e-5], 2 ** 20: [1.2e-3]})
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.perfmodel_predict", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.perfmodel_predict", sys.argv[1:] if argv is None else argv)
    from analysis import predict

    with tempfile.TemporaryDirectory() as tmp:
        out = make_campaign(Path(tmp) / "campaign")
        cli = ["--from", str(out), "--model", "resnet50", *GRID]
        inside, fresh, rows, fresh_cpu = [], [], [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            rows, _ = predict.run(predict.build_parser().parse_args(cli))
            inside.append(time.perf_counter() - started)
            started = time.perf_counter()
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run([sys.executable, "-m", "analysis.predict", *cli], cwd=REPO_ROOT,
                                  capture_output=True, text=True)
            fresh.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            fresh_cpu.append(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
        schemes = len({r["scheme"] for r in rows})
        print(f"what-if resnet50, 4 nodes x 3 bandwidths x 2 latencies x {schemes} schemes = {len(rows)} predictions")
        print(f"  in process (read store, predict, write csv/md/svg): median {statistics.median(inside) * 1e3:.0f} ms, "
              f"max {max(inside) * 1e3:.0f} ms over {args.rounds} rounds")
        print(f"  CLI, fresh interpreter:                            median {statistics.median(fresh) * 1e3:.0f} ms, "
              f"max {max(fresh) * 1e3:.0f} ms, CPU {statistics.median(fresh_cpu) * 1e3:.0f} ms")
        print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print(f"  target < 1000 ms: {'met' if statistics.median(fresh) < 1.0 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
