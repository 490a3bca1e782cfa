"""Benchmark: the what-if CLI on a 4 x 3 x 2 grid (nodes x bandwidth x latency).

    python -m bench.perfmodel_predict [--rounds 5]

Two what-ifs, each timed in this process (`analysis.predict.run`) and as a user runs it (a
fresh interpreter):

- ``--from``: a throw-away campaign with one-worker ResNet-50 profiles of three schemes
  (DDP-like buckets, whole gradient after backward, layer-wise tensors) and a calibration,
  predicted with the catalogue too (9 schemes), writing CSV, Markdown and the PNG plot;
- ``--cluster-file examples/cluster.toml``: every framework scheme the what-if offers
  (``--frameworks study``: the catalogue's synchronous, modelled schemes that span nodes) on the
  described cluster's hierarchy, compute from ResNet-50's FLOPs: the answer (rows and table),
  the CLI with --json, and the CLI writing its files.

Target: the grid over every scheme answers in under one second.  Runs in the launcher's environment
(re-executes itself there).
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

from core import schemes as catalogue
from core.cli import OneLineParser
from core.envs import REPO_ROOT, reexec_in_host_env

GRID = ["--nodes", "2,4,8,16", "--bandwidth", "10Gbit,56Gbit,100Gbit", "--latency", "5us,50us"]
# three schemes on the campaign's CPU profiles: DDP-like buckets, the whole gradient after
# backward, layer-wise tensors (the catalogue's descriptions)
STORED = ("torch:ddp", "cntk-style:allreduce", "caffe-mpi-style:mpi")


def make_campaign(folder: Path, model: str = "resnet50") -> Path:
    from analysis.calibration import CalibrationFit
    from analysis.perfmodel import split_backward_by_flops
    from analysis.store import ResultStore
    from models import get_model
    from tests.test_analysis_data import make_record

    spec = get_model(model)
    rows = [(r.name, r.flops, r.params > 0) for r in spec.layer_table()]
    with ResultStore.for_campaign(folder) as store:
        for info in (catalogue.SCHEMES[name] for name in STORED):
            framework, mode, scheme = info.framework, info.mode, info.describe()
            record = make_record(info.label, framework, mode, 1, 0.110, run_id=f"{framework}-1", model=model)
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


def timed(call, rounds: int) -> tuple[list[float], list[float], object]:
    """Wall and CPU seconds of `call()` per round, and its last result."""
    wall, cpu, result = [], [], None
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.process_time()
        result = call()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return wall, cpu, result


def fresh_cli(arguments: list[str], rounds: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of `python -m analysis.predict ARGUMENTS` per round."""
    wall, cpu = [], []
    for _ in range(rounds):
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "analysis.predict", *arguments], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        wall.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
    return wall, cpu


def line(what: str, seconds: list[float], cpu: list[float] | None = None) -> str:
    text = f"  {what:<58} median {statistics.median(seconds) * 1e3:5.0f} ms, max {max(seconds) * 1e3:5.0f} ms"
    return text + (f", CPU {statistics.median(cpu) * 1e3:.0f} ms" if cpu else "")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bench.perfmodel_predict", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.perfmodel_predict", sys.argv[1:] if argv is None else argv)
    from analysis import predict, whatif

    rounds = args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        out = make_campaign(Path(tmp) / "campaign")
        campaign = ["--from", str(out), "--model", "resnet50", *GRID]
        inside, inside_cpu, rows = timed(lambda: predict.run(predict.build_parser().parse_args(campaign))[0], rounds)
        fresh, fresh_cpu = fresh_cli(campaign, rounds)
        print(f"what-if --from, resnet50, 4 nodes x 3 bandwidths x 2 latencies x {len({r['scheme'] for r in rows})} "
              f"schemes = {len(rows)} predictions")
        print(line("in process (read store, predict, write csv/md/png):", inside, inside_cpu))
        print(line("CLI, fresh interpreter:", fresh, fresh_cpu))

        cluster = ["--cluster-file", str(REPO_ROOT / "examples" / "cluster.toml"), "--model", "resnet50",
                   "--frameworks", "study", *GRID]

        def answer():
            rows = predict.run(predict.build_parser().parse_args([*cluster, "--no-files"]))[0]
            whatif.markdown(rows)
            return rows

        answers, answers_cpu, rows = timed(answer, rounds)
        files, files_in_cpu, _ = timed(lambda: predict.run(predict.build_parser().parse_args([*cluster, "--out", tmp])),
                                       rounds)
        json_wall, json_cpu = fresh_cli([*cluster, "--json"], rounds)
        files_wall, files_cpu = fresh_cli([*cluster, "--out", tmp], rounds)
        print(f"what-if --cluster-file, resnet50, 4 nodes x 3 bandwidths x 2 latencies x {len({r['scheme'] for r in rows})} "
              f"study schemes = {len(rows)} predictions")
        print(line("in process, the answer (read the file, predict, table):", answers, answers_cpu))
        print(line("in process, with csv/md/png written:", files, files_in_cpu))
        print(line("CLI --json, fresh interpreter:", json_wall, json_cpu))
        print(line("CLI writing csv/md/png, fresh interpreter:", files_wall, files_cpu))
        print(f"  machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        met = statistics.median(answers) < 1.0
        print(f"  target: the grid over every scheme answers in < 1000 ms (wall, in process): {'met' if met else 'NOT met'}"
              + ("" if met or statistics.median(answers_cpu) >= 1.0 else
                 f"; its CPU time {statistics.median(answers_cpu) * 1e3:.0f} ms: the machine is loaded"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
