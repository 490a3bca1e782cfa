"""Benchmark: efficiency of each scheme on 2 and 4 emulated nodes at three link bandwidths,
measured against the performance model's prediction (needs root: network namespaces).

    python -m bench.emulated_scaling [--model googlenet] [--bandwidth 100Mbit,1Gbit,10Gbit]
        [--frameworks torch,cntk-style,caffe-mpi-style,horovod:gloo,tf:collective,mxnet:dist_sync]
        [--batch-size 2] [--out results/bench-emulated]

First calibrates every framework's transport on the emulated cluster at every node count and
bandwidth (`launchers.calibrate --cluster emulated`), then runs the campaign (one worker per
node, 1, 2 and 4 nodes) and prints, per scheme, nodes and bandwidth: measured iteration time,
efficiency E = t(1) / t(N), the model's predicted E from the same one-worker baseline, and the
error. All emulated nodes share this machine's cores, so compute slows as nodes are added:
efficiencies are the communication stack's and the link's, on a small CPU, not a GPU
cluster's. Runs in the launcher's environment (re-executes itself there).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from core.cli import OneLineParser
from core.envs import REPO_ROOT, reexec_in_host_env

FRAMEWORKS = "torch,cntk-style,caffe-mpi-style,horovod:gloo,tf:collective,mxnet:dist_sync"


def run(command: list[str]) -> int:
    print("$ " + " ".join(command), flush=True)
    return subprocess.run([sys.executable, "-m", *command], cwd=REPO_ROOT).returncode


def table(out: Path) -> list[str]:
    from analysis.store import ResultStore
    from analysis.tables import configs_with_speedup

    with ResultStore.for_campaign(out, create=False) as store:
        frame = store.runs_frame()
    configs = configs_with_speedup(frame)
    configs = configs[configs["nodes"] > 1]
    pred = frame.set_index("run_id")["predicted_iter_time"]
    ids = frame.groupby(["framework", "mode", "nodes", "bandwidth"], dropna=False)["run_id"].first()
    lines = [f"{'scheme':<26} {'N':>2} {'bandwidth':>9} {'t(N) ms':>9} {'E meas':>7} {'E pred':>7} {'err':>6}"]
    for _, row in configs.sort_values(["framework", "mode", "nodes", "bandwidth"]).iterrows():
        run_id = ids.get((row["framework"], row["mode"], row["nodes"], row["bandwidth"]))
        t_pred = pred.get(run_id) if run_id is not None else None
        e_pred = row["baseline_iter_ms"] / (t_pred * 1e3) if t_pred else float("nan")
        err = (e_pred - row["efficiency"]) / row["efficiency"] if t_pred else float("nan")
        lines.append(f"{row['framework_label'] + ' ' + row['mode']:<26} {int(row['nodes']):>2} "
                     f"{row['bandwidth']:>9} {row['iter_ms_median']:>9.1f} {row['efficiency']:>7.2f} "
                     f"{e_pred:>7.2f} {err * 100:>5.0f}%")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    reexec_in_host_env("bench.emulated_scaling", argv)
    parser = OneLineParser(prog="python -m bench.emulated_scaling")
    parser.add_argument("--model", default="googlenet")
    parser.add_argument("--frameworks", default=FRAMEWORKS)
    parser.add_argument("--bandwidth", default="100Mbit,1Gbit,10Gbit")
    parser.add_argument("--nodes", default="2,4")
    parser.add_argument("--batch-size", default="2")
    parser.add_argument("--out", default="results/bench-emulated")
    parser.add_argument("--calibrate", default="torch,caffe-mpi-style",
                        help="frameworks whose transports are calibrated: gloo (shared by "
                             "CNTK-style and Horovod gloo) and MPI; TensorFlow and MXNet are then "
                             "predicted from their own measured communication")
    parser.add_argument("--skip-calibration", action="store_true")
    args = parser.parse_args(argv)
    out = str(Path(args.out).resolve())
    started = time.monotonic()
    cluster = ["--cluster", "emulated", "--bandwidth", args.bandwidth]
    if not args.skip_calibration:
        run(["launchers.calibrate", "--frameworks", args.calibrate, "--nodes", args.nodes,
             "--workers", "1", *cluster, "--min-bytes", "256K", "--max-bytes", "4M",
             "--repeats", "2", "--warmup", "1", "--out", out, "--timeout", "900"])
    code = run(["launchers.compare", "--frameworks", args.frameworks, "--model", args.model,
                "--nodes", f"1,{args.nodes}", "--workers", "1", "--batch-size", args.batch_size,
                *cluster, "--iterations", "2", "--repeats", "2", "--warmup", "1",
                "--profile-iterations", "1", "--timeout", "1200", "--out", out])
    print("\n".join(table(Path(out))))
    print(f"bench took {time.monotonic() - started:.0f} s; campaign {out} (exit {code})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
