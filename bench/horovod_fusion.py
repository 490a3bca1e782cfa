"""Benchmark: Horovod's tensor fusion and cycle time, over Gloo (horovodrun) and MPI (mpirun).

    python -m bench.horovod_fusion [--model googlenet] [--batch 8] [--workers 2]
        [--modes gloo,mpi] [--fusion-mb 0,4,128] [--cycle-ms 1,5] [--iterations 3]

Each setting is one real run through the worker (the same code the compare launcher runs), in
the Horovod environment (built on first use); the table gives the iteration time (median of
repeats), the separated profile's backward and all-reduce-after-backward, the overlapped
backward+all-reduce and the measured overlap. fusion_mb 0 turns fusion off (one all-reduce per
gradient tensor), 128 is Horovod's default (one buffer holds GoogleNet's whole 27 MB gradient).
Runs in any environment with the launcher's dependencies (e.g. the dev venv): the ranks run in
the Horovod environment. Settings run one after the other; ranks share this machine's cores.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path

from adapters.base import RunConfig
from core.cli import OneLineParser, comma_list_type
from core.envs import REPO_ROOT, ensure_environment
from launchers.local import run_local


def floats(text: str) -> list[float]:
    """A comma list of numbers (an argparse ``type``)."""
    return [float(part) for part in comma_list_type(text)]


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m bench.horovod_fusion")
    parser.add_argument("--model", default="googlenet")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", type=comma_list_type, default="gloo,mpi")
    parser.add_argument("--fusion-mb", type=floats, default="0,4,128")
    parser.add_argument("--cycle-ms", type=floats, default="1")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-iterations", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)

    python = str(ensure_environment("horovod", log=print).python)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-horovod-") as tmp:
        for mode, fusion_mb, cycle_ms in itertools.product(
                args.modes, args.fusion_mb, args.cycle_ms):
            name = f"{mode}-f{fusion_mb:g}-c{cycle_ms:g}"
            out = Path(tmp) / name
            config = RunConfig(
                run_id=name, framework="horovod", mode=mode, model=args.model,
                batch_per_worker=args.batch, workers_per_node=args.workers, warmup=1,
                iterations=args.iterations, repeats=args.repeats,
                profile_iterations=args.profile_iterations, dropout=False,
                options={"fusion_mb": fusion_mb, "cycle_ms": cycle_ms}, rank_dir=str(out),
                record_path=str(out / "record.json"))
            outcome = run_local(config, python, out, "horovod", REPO_ROOT, args.timeout)
            if outcome.status != "ok":
                print(f"{name}: {outcome.status}: {(outcome.error or '').splitlines()[0]}")
                continue
            record = json.loads((out / "record.json").read_text())
            phases = {p["phase"]: p["measured_s"] for p in record["phases"]}
            rows.append((mode, fusion_mb, cycle_ms, record["iter_time_median"],
                         phases["backward"], phases["comm"],
                         record["extra"]["profile_backward_comm"], record["overlap"]))
            print(f"{name}: done in {outcome.duration_s:.0f} s", flush=True)
    print(f"\nHorovod, {args.model}, batch {args.batch} x {args.workers} ranks")
    print(f"{'mode':5} {'fusion MB':>9} {'cycle ms':>8} {'iter s':>7} {'bwd s':>7} "
          f"{'comm s':>7} {'bwd+comm s':>10} {'overlap':>7}")
    for mode, fusion, cycle, iteration, backward, comm, both, overlap in rows:
        shown = "-" if overlap is None else f"{overlap:.2f}"
        print(f"{mode:5} {fusion:9g} {cycle:8g} {iteration:7.3f} {backward:7.3f} {comm:7.3f} "
              f"{both:10.3f} {shown:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
