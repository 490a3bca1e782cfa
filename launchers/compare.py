"""`python -m launchers.compare` (`dlcompare run`): run frameworks x models x topologies,
store, report.

    python -m launchers.compare --frameworks torch --model googlenet
    dlcompare run examples/campaign.yaml --workers 1,2

A campaign can be written as a YAML file: its keys are the flags (``batch-size`` or
``batch_size``), a list is a sweep (``workers: [1, 2, 4]`` is ``--workers 1,2,4``), ``true``
sets a switch; flags on the command line override the file.  The file is read after the move
into the launcher's environment (PyYAML lives there); a file that does not exist is an error
before anything is built.

The first call builds the launcher's own environment and each framework's environment
(pinned, cached); later calls reuse them. Every run is appended to the campaign's store as it
finishes, so the same command with the same --out resumes where it stopped. Exit codes: 0 all
runs ok, 1 some run failed or timed out (recorded; the campaign went on), 2 bad input or --out
in use by another campaign, 3 a result or the report could not be written (a full disk, a
damaged store: what was measured is kept in its run folder and stored by the next run),
130 interrupted (Ctrl-C, SIGTERM, SIGHUP; what was measured is kept).
"""

from __future__ import annotations

import argparse
import os
import sys

from core.cli import DEFAULT_LAUNCHES, EXIT_USAGE, OneLineParser, error_line, fail, warn
from core.envs import reexec_in_host_env
from launchers.cluster import DEFAULT_TRANSPORT, cluster_help
from launchers.interpreters import add_python_argument, overrides_or_exit


def build_parser(prog: str = "python -m launchers.compare") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Compare deep-learning frameworks and gradient-aggregation schemes "
                    "training the same CNN. Every default is shown in the plan printed first.")
    parser.add_argument("campaign", nargs="?", default=None, metavar="CAMPAIGN.yaml",
                        help="campaign file: keys are the flags below, lists are sweeps; "
                             "flags given here override it (see examples/campaign.yaml)")
    parser.add_argument("--frameworks", default="torch",
                        help="comma list of FRAMEWORK[:MODE], e.g. torch or tf:collective,tf:ps "
                             "(default: %(default)s)")
    parser.add_argument("--model", default="googlenet",
                        help="model name or comma list (python -m models list); "
                             "default: %(default)s")
    parser.add_argument("--workers", default=None,
                        help="worker processes per node, comma list (default: 1,2 on CPU; "
                             "1,2,4.. up to the GPUs present)")
    parser.add_argument("--nodes", default="1",
                        help="node counts, comma list (default: 1; above 1 needs --cluster)")
    parser.add_argument("--cluster", default=DEFAULT_TRANSPORT, help=cluster_help())
    parser.add_argument("--bandwidth", default=None,
                        help="emulated link bandwidth, comma list, e.g. 1Gbit,10Gbit "
                             "(--cluster emulated; default: unshaped)")
    parser.add_argument("--latency", default=None,
                        help="emulated one-way link latency, comma list, e.g. 0.2ms "
                             "(--cluster emulated, needs the kernel's netem; default: none)")
    parser.add_argument("--servers", default="1",
                        help="parameter servers for the modes that have them, comma list "
                             "(default: %(default)s)")
    parser.add_argument("--batch-size", default=None,
                        help="per-worker batch, comma list (default: per model and device)")
    parser.add_argument("--iterations", type=int, default=10,
                        help="timed iterations per repeat (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed iterations first (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed repeats within each launch: their p10-p90 is the within-launch "
                             "spread (default: %(default)s)")
    parser.add_argument("--launches", type=int, default=DEFAULT_LAUNCHES,
                        help="separate launches of each configuration, interleaved in shuffled "
                             "rounds; the verdict tests the difference between schemes against the "
                             "spread between launches (default: %(default)s)")
    parser.add_argument("--profile-iterations", type=int, default=3,
                        help="iterations of each profile kind (default: %(default)s)")
    parser.add_argument("--data", choices=("synthetic", "files"), default="synthetic",
                        help="in-memory synthetic batches or generated JPEG files "
                             "(default: %(default)s)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="default: %(default)s (GPU when nvidia-smi finds one)")
    parser.add_argument("--out", default="results/campaign",
                        help="campaign folder: store, tables, figures, report (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="hard limit per run in seconds (default: %(default)s)")
    parser.add_argument("--channels-last", action="store_true",
                        help="NHWC memory layout where the framework supports it")
    parser.add_argument("--no-dropout", action="store_true",
                        help="disable dropout (deterministic runs)")
    parser.add_argument("--seed", type=int, default=0, help="weights and data seed (default: 0)")
    parser.add_argument("--loader-workers", type=int, default=2,
                        help="data-loader processes per worker with --data files (default: 2)")
    parser.add_argument("--runtime", choices=("local", "container"), default="local",
                        help="local: each framework's virtualenv; container: every rank inside "
                             "its framework's image (python -m launchers.images, built when "
                             "missing), the image digest recorded (default: %(default)s)")
    add_python_argument(parser)
    parser.add_argument("--dtype", default="float32",
                        help="float32 (on a GPU without TF32 math), tf32, or bfloat16 (mixed "
                             "precision), where the framework has it (default: %(default)s)")
    parser.add_argument("--option", action="append", metavar="KEY=VALUE",
                        help="adapter option for every run, repeatable: cudnn_benchmark=false, "
                             "pinned=false, share_gpu=true (ranks share one GPU), bucket_mb=N, ...")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run again the runs stored as failed or timeout")
    parser.add_argument("--calibrate", action="store_true",
                        help="first fit the communication model's alpha, beta for every framework "
                             "and worker count without a stored calibration (python -m "
                             "launchers.calibrate), so every prediction is calibrated; after the "
                             "runs, calibrate those again and predict with both pooled")
    parser.add_argument("--wait", action="store_true",
                        help="when another campaign holds --out, wait for it to end instead of "
                             "refusing to start")
    parser.add_argument("--repair", action="store_true",
                        help="when --out's results.sqlite is damaged, salvage its readable runs "
                             "into a new store first (the damaged file is kept beside it)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan only (reads --out, writes nothing)")
    parser.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)  # tests only
    return parser


class CampaignFileError(ValueError):
    """A campaign file that cannot be read or names what is not a flag; one line."""


def file_arguments(parser: OneLineParser, path: str, document) -> list[str]:
    """The flags a loaded campaign file stands for, as command-line arguments; a key spelled
    as a flag used to be (`schemes`) still works, with one warning line."""
    if document is None:
        return []
    if not isinstance(document, dict):
        raise CampaignFileError(f"{path}: expected keys and values (FLAG: VALUE), got {type(document).__name__}")
    options = {action.dest: action for action in parser._actions
               if action.option_strings and action.help != argparse.SUPPRESS and action.dest != "help"}
    arguments = []
    for key, value in document.items():
        renamed = parser.current_flag("--" + str(key).replace("_", "-"))
        if renamed is not None:
            warn(f"{path}: key {key} is deprecated; use {renamed[2:]}")
            key = renamed[2:]
        action = options.get(str(key).replace("-", "_"))
        if action is None:
            known = ", ".join(sorted(name.replace("_", "-") for name in options))
            raise CampaignFileError(f"{path}: unknown key {key!r} (known: {known})")
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            if not isinstance(value, bool):
                raise CampaignFileError(f"{path}: {key} is a switch: true or false, not {value!r}")
            arguments += [flag] if value else []
        elif isinstance(value, dict) or value is None:
            raise CampaignFileError(f"{path}: {key} needs a value or a list of values")
        else:
            values = value if isinstance(value, list) else [value]
            arguments += [flag, ",".join(str(v) for v in values)]
    return arguments


def load_campaign_file(path: str) -> object:
    """The YAML document of a campaign file (PyYAML: in the launcher's environment)."""
    import yaml  # the launcher's environment has it; the stdlib parse before the re-exec does not

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as error:
        raise CampaignFileError(f"cannot read campaign file {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise CampaignFileError(f"{path}{where}: not valid YAML: {getattr(error, 'problem', error)}") from None


def parse_with_file(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments with the campaign file's flags first, so that the command line wins."""
    args = parser.parse_args(argv)
    if args.campaign is None:
        return args
    try:
        from_file = file_arguments(parser, args.campaign, load_campaign_file(args.campaign))
    except CampaignFileError as error:
        parser.exit(EXIT_USAGE, error_line(error) + "\n")
    checked = build_parser(parser.prog)  # a bad value in the file is reported with the file's name
    checked.error = lambda message: checked.exit(EXIT_USAGE, error_line(f"{args.campaign}: {message}") + "\n")
    checked.parse_args(from_file)
    return parser.parse_args([*from_file, *argv])


def main(argv: list[str] | None = None, prog: str = "python -m launchers.compare") -> int:
    parser = build_parser(prog)
    argv = parser.current_spelling(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # usage errors before any environment is built
    if args.campaign is not None and not os.path.isfile(args.campaign):
        return fail(f"campaign file {args.campaign} does not exist")
    overrides_or_exit(args.python)
    reexec_in_host_env("launchers.compare", argv)
    args = parse_with_file(build_parser(prog), argv)
    from launchers.campaign import run_campaign_cli  # after the re-exec: pandas, rich, the adapters' records

    return run_campaign_cli(args, argv)


if __name__ == "__main__":
    sys.exit(main())
