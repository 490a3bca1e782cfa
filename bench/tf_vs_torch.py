"""Benchmark: images/s of TensorFlow against PyTorch on the three full models, one worker, the
default CPU batch (launchers/plan.py), in one campaign through the same worker and timing code.

    python -m bench.tf_vs_torch [--out results/bench-tf-vs-torch] [--iterations 5] [--repeats 3]

It runs `python -m launchers.compare --frameworks torch,tf --model alexnet,googlenet,resnet50
--workers 1` (so every number is also in that campaign's store and report) and prints one
JSON line per model with both throughputs and their ratio. Both frameworks use every core
(threads_per_worker = cores / workers), float32, synthetic data, dropout on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import run_compare, stored_runs
from core.cli import OneLineParser, comma_list_type
from core.envs import reexec_in_host_env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench-tf-vs-torch")
    parser.add_argument("--models", type=comma_list_type, default="alexnet,googlenet,resnet50")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.tf_vs_torch", argv)
    out = Path(args.out).resolve()
    code = run_compare(["--frameworks", "torch,tf", "--model", ",".join(args.models), "--workers", "1",
                        "--iterations", str(args.iterations), "--repeats", str(args.repeats),
                        "--warmup", "2", "--profile-iterations", "2"], out)
    rows = stored_runs(out, "model, framework, batch_per_worker, throughput, "
                            "iter_time_median, status")
    by_model: dict = {}
    for model, framework, batch, throughput, median, status in rows:
        by_model.setdefault(model, {})[framework] = (batch, throughput, median, status)
    for model in args.models:
        entry = by_model.get(model, {})
        torch, tf = entry.get("torch"), entry.get("tf")
        line = {"model": model, "batch": (torch or tf or (None,))[0],
                "torch_images_per_s": torch[1] if torch else None,
                "tf_images_per_s": tf[1] if tf else None,
                "status": {k: v[3] for k, v in entry.items()}}
        if torch and tf and torch[1] and tf[1]:
            line["tf_over_torch"] = tf[1] / torch[1]
        print(json.dumps(line), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
