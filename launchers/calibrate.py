"""`python -m launchers.calibrate`: fit the communication model's alpha, beta (and gamma).

    python -m launchers.calibrate --frameworks torch,cntk-style,caffe-mpi-style --workers 2

For each framework (and mode) and worker count, starts the framework's real ranks the way
`launchers.compare` does (its environment, its rendezvous, `python -m adapters.worker` in
calibration mode) and times the scheme's collective through the framework's own stack
(`Trainer.collective_times`: torch.distributed all_reduce over gloo/NCCL, MPI Allreduce, ...)
for message sizes from --min-bytes to --max-bytes (x2 steps, nccl-tests' -b/-e/-f), each
sample a barrier then back-to-back calls (up to about 1 MiB per sample, at most 20: nccl-tests'
-n, consecutive messages as backward sends them), plus a local float32 sum of the same sizes
for the reduction cost.  `analysis.calibration` fits
T(n) = a + b n (least squares on relative residuals) and inverts it to link-level alpha,
beta, gamma; the fit and every timing go to the campaign's results.sqlite (tables
``calibration`` and ``calibration_points``), where the performance model finds them.

Output follows nccl-tests: time per size, algbw = bytes / time, busbw = algbw * 2(p-1)/p
for all-reduce.  Exit codes: 0 every calibration stored, 1 one failed (said in one line; the
others are stored), 2 bad input or --out in use by a campaign, 3 the store cannot be written
(a full disk, a damaged store), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from core.cli import OneLineParser
from core.envs import reexec_in_host_env
from launchers.cluster import DEFAULT_TRANSPORT, cluster_help
from launchers.interpreters import add_python_argument, overrides_or_exit


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m launchers.calibrate",
        description="Measure all-reduce (or push/pull) time per message size through each framework's own "
                    "communication stack, fit alpha, beta, gamma, and store them with the campaign.")
    parser.add_argument("--frameworks", default="torch",
                        help="comma list of FRAMEWORK[:MODE] (default: %(default)s)")
    parser.add_argument("--workers", default="2", help="worker processes per node, comma list (default: 2)")
    parser.add_argument("--nodes", default="1", help="nodes, comma list (default: 1; above 1 needs --cluster)")
    parser.add_argument("--cluster", default=DEFAULT_TRANSPORT, help=cluster_help())
    parser.add_argument("--bandwidth", default=None,
                        help="emulated link bandwidths, comma list (--cluster emulated)")
    parser.add_argument("--latency", default=None,
                        help="emulated one-way link latencies, comma list (--cluster emulated)")
    parser.add_argument("--servers", default="1",
                        help="parameter servers for the modes that have them (default: %(default)s)")
    parser.add_argument("--min-bytes", default="1K", help="smallest message (default: %(default)s)")
    parser.add_argument("--max-bytes", default="64M", help="largest message (default: %(default)s)")
    parser.add_argument("--factor", type=int, default=2, help="size step factor (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per size (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per size (default: %(default)s)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="default: %(default)s")
    parser.add_argument("--out", default="results/campaign",
                        help="campaign folder whose results.sqlite gets the calibration (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per calibration run (default: %(default)s)")
    parser.add_argument("--wait", action="store_true",
                        help="when a campaign holds --out, wait for it to end instead of refusing to start")
    parser.add_argument("--repair", action="store_true",
                        help="when --out's results.sqlite is damaged, salvage it into a new store first")
    parser.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="adapter option for the ranks, repeatable (as launchers.compare): "
                             "share_gpu=true lets two ranks share one GPU")
    add_python_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = parser.current_spelling(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # usage errors before any environment is built
    overrides_or_exit(args.python)
    reexec_in_host_env("launchers.calibrate", argv)
    from launchers.calibration_runs import run_cli  # after the re-exec: pandas, rich, the adapters' records

    return run_cli(args, argv)


if __name__ == "__main__":
    sys.exit(main())
