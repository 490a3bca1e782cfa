"""Benchmark: the model composing a topology it was never calibrated on (needs root: network
namespaces).

    python -m bench.compose_emulated [--frameworks torch,cntk-style,horovod:gloo,mxnet:dist_sync]
        [--model alexnet-tiny] [--batch-size 8] [--bandwidth 100Mbit] [--out results/bench-compose]
        [--analyse-only]

Calibrates each scheme on two topologies only: 1 node x 2 workers (the intra-node link:
loopback inside a node) and 2 nodes x 1 worker (the NIC: an emulated link shaped to
--bandwidth), runs 1 x 1 and 1 x 2, then 2 x 1, 2 x 2 and 2 x 4 on the emulated cluster, and
predicts the 2 x 2 and 2 x 4 runs with `analysis.compose`: the intra-node and NIC links of the two fits
composed on the run's topology (`perfmodel.topology_cost`), beside the flat model of
`analysis.predict` (all ranks on the one link `calibration.lookup` finds, the 2 x 1 fit).
Prints per run the measured iteration time and both predictions with their errors, and per
scheme the median |error|, twice: on the run's own measured compute (what the report's
prediction uses: the composition alone is tested) and on the one-worker profile scaled to the
host's shared cores (`analysis.compose.compute_factor`); and, for scale, the runs on the
calibrated topologies (1 x 2, 2 x 1) predicted from their own calibration.  Target: composed
within 15 % median for DDP, CNTK-style, Horovod and MXNet dist_sync.

Every emulated node shares this machine's 2 cores: 2 x 4 is 8 ranks (plus MXNet's server
and scheduler) on 2 cores, so compute is time-shared, every collective waits for the OS to
run its peers, and the runs move by tens of percent between campaigns.  A low bandwidth
(100 Mbit/s) keeps the link the larger part of an iteration.  Runs in the launcher's
environment (re-executes itself there).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from core.cli import OneLineParser
from core.envs import reexec_in_host_env

FRAMEWORKS = "torch,cntk-style,horovod:gloo,mxnet:dist_sync"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="python -m bench.compose_emulated")
    parser.add_argument("--frameworks", default=FRAMEWORKS)
    parser.add_argument("--model", default="alexnet-tiny")
    parser.add_argument("--batch-size", default="8")
    parser.add_argument("--bandwidth", default="100Mbit")
    parser.add_argument("--repeats", default="3", help="timed repeats per run (default: %(default)s)")
    parser.add_argument("--out", default="results/bench-compose")
    parser.add_argument("--analyse-only", action="store_true", help="only print the comparison of a stored campaign")
    args = parser.parse_args(argv)
    reexec_in_host_env("bench.compose_emulated", argv)
    from analysis.compose import composition_report  # after the re-exec: pandas
    from bench import run_command

    def run(arguments: list[str]) -> int:
        print("$ python -m " + " ".join(arguments), flush=True)
        return run_command(arguments)

    out = str(Path(args.out).resolve())
    started = time.monotonic()
    if not args.analyse_only:
        calibration = ["--frameworks", args.frameworks, "--out", out, "--max-bytes", "4M", "--repeats", "6",
                       "--timeout", "900"]
        run(["launchers.calibrate", *calibration, "--nodes", "1", "--workers", "2"])
        run(["launchers.calibrate", *calibration, "--cluster", "emulated", "--nodes", "2", "--workers", "1",
             "--bandwidth", args.bandwidth])
        campaign = ["--frameworks", args.frameworks, "--model", args.model, "--batch-size", args.batch_size,
                    "--iterations", "5", "--repeats", args.repeats, "--warmup", "2", "--profile-iterations", "3",
                    "--timeout", "1200", "--out", out]
        run(["launchers.compare", *campaign, "--nodes", "1", "--workers", "1,2"])
        run(["launchers.compare", *campaign, "--cluster", "emulated", "--nodes", "2", "--workers", "1,2,4",
             "--bandwidth", args.bandwidth])
    print(composition_report(Path(out)))
    print(f"bench took {time.monotonic() - started:.0f} s; campaign {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
