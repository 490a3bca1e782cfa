"""`dlcompare COMMAND [ARGS]`: the one command a user types (installed by `pip install -e .`).

    dlcompare run examples/campaign.yaml     # = python -m launchers.compare
    dlcompare report results/example         # = python -m analysis.report
    dlcompare predict --from results/example --model googlenet-tiny --nodes 2,4,8

Each subcommand is the module it names, given the rest of the command line; `python -m
MODULE` keeps working the same.  This dispatcher parses with the standard library only, since
the console script may run in any Python that has the package installed.  The launcher's
commands (run, calibrate, images, check) parse their own arguments the same way and then move
into the launcher's environment (envs/host.txt) themselves; the analysis commands (report,
summary, predict, diff) and `models` need its libraries (pandas, NumPy) to even be imported, so the
dispatcher moves there first and then calls the module's `main`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from core.cli import OneLineParser
from core.envs import reexec_in_host_env


class Subcommand(NamedTuple):
    module: str  # whose main(argv) runs it
    stdlib: bool  # the module parses with the standard library and re-executes itself
    summary: str


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand("launchers.compare", True, "run a campaign: frameworks x models x topologies, then the report"),
    "report": Subcommand("analysis.report", False, "rebuild a campaign's report.html, tables and figures"),
    "summary": Subcommand("analysis.summary", False, "print a campaign's verdict and summary table"),
    "predict": Subcommand("analysis.predict", False, "what-if: predict schemes at node counts and links you lack"),
    "diff": Subcommand("analysis.diff", False, "campaign B against campaign A, configuration by configuration"),
    "calibrate": Subcommand("launchers.calibrate", True, "fit the communication model (alpha, beta, contention)"),
    "images": Subcommand("launchers.images", True, "build or list the per-framework container images"),
    "check": Subcommand("launchers.check", True, "compare loss, gradients and one step across frameworks"),
    "trace": Subcommand("analysis.trace", True, "the path of a run's trace of one iteration, every rank and the model"),
    "tune": Subcommand("launchers.tune", False, "predict a space of schemes and sizes, measure only what can win"),
    "models": Subcommand("models.__main__", False, "list the networks or summarise one layer by layer"),
}


def build_parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  {name:<10} {sub.summary}" for name, sub in SUBCOMMANDS.items())
    parser = OneLineParser(
        prog="dlcompare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Which framework and gradient-aggregation scheme trains this CNN fastest on my "
                    "machines, and why.",
        epilog=f"commands:\n{commands}\n\n`dlcompare COMMAND --help` shows a command's options.")
    parser.add_argument("command", choices=list(SUBCOMMANDS), metavar="COMMAND",
                        help="one of: " + ", ".join(SUBCOMMANDS))
    parser.add_argument("arguments", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="the command's own arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        parser.error(f"a COMMAND is needed (one of: {', '.join(SUBCOMMANDS)}); dlcompare --help says more")
    args = parser.parse_args(argv)
    sub = SUBCOMMANDS[args.command]
    if not sub.stdlib:  # it imports pandas or NumPy: into the launcher's environment first
        reexec_in_host_env("launchers.cli", argv)
    module = importlib.import_module(sub.module)
    if args.command == "run":
        return module.main(args.arguments, prog="dlcompare run")
    return module.main(args.arguments)


if __name__ == "__main__":
    sys.exit(main())
