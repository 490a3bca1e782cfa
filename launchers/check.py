"""Cross-framework conformance: `python -m launchers.check --frameworks torch,tf --model NAME`.

Every framework's worker runs in check mode in that framework's own environment (through the
local launcher, one worker, dropout off): it loads the canonical weights of `--seed`, computes
the loss and its local gradients on the same synthetic batch (adapters.data), then takes one
SGD step and dumps the weights. This process (the launcher's environment, no framework)
compares every pair of frameworks (analysis/equivalence.py: what is compared, and the measured
tolerances). It exits 0 when every number is within the tolerance, 1 when one is above it (or a
framework's run failed), 2 on bad input (one line on stderr).

With ``--workers N`` (N >= 2) every scheme runs N ranks for ``--steps K`` steps on the same
data from the same weights: each run's ranks must end with identical weights; the schemes
that send their gradients exactly (the catalogue's ``lossy`` empty: DDP, ZeRO, CNTK-style ...)
are compared pair by pair as above (rank 0's local gradients, the weights after K steps); a
compressing scheme (``torch:ddp-fp16``, ``torch:ddp-powersgd``) is not held to a tolerance but
reported with its cost to the loss: rank 0's loss on its first batch after K steps against the
first exact scheme's.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from adapters.registry import UnknownFramework, parse_framework_mode
from core.cli import OneLineParser, comma_list, fail
from core.envs import REPO_ROOT, EnvBuildError, reexec_in_host_env
from launchers.interpreters import (InterpreterError, add_python_argument, overrides_or_exit,
                                    prepare_interpreters)


class UsageError(ValueError):
    pass


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m launchers.check",
        description="Load the same canonical weights and batch into each framework and compare "
                    "the loss, the gradients and one SGD step across every pair.")
    parser.add_argument("--frameworks", default="torch,tf",
                        help="comma list of FRAMEWORK[:MODE], at least two (default: %(default)s)")
    parser.add_argument("--model", required=True, help="model name (python -m models list)")
    parser.add_argument("--batch-size", type=int, default=2, help="batch size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="weights and data seed (default: 0)")
    parser.add_argument("--workers", type=int, default=1,
                        help="ranks per scheme; 2 or more compares distributed schemes, compressing "
                             "ones by their loss (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=None,
                        help="SGD steps before the weights and the loss are compared (default: 1; "
                             "20 with --workers 2 or more)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="relative L2 limit on gradients and updates (default: measured per "
                             "model, see analysis/equivalence.py)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads per framework (default: all cores)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds per framework run (default: %(default)s)")
    parser.add_argument("--keep", default=None,
                        help="folder to keep the dumps in (default: a temporary one)")
    parser.add_argument("--verbose", action="store_true",
                        help="print every tensor, not only the worst ones")
    add_python_argument(parser)
    return parser


def validate(args):
    from analysis.equivalence import tolerance  # host env: NumPy
    from models import MODEL_NAMES  # host env: NumPy

    entries = comma_list(args.frameworks, "--frameworks", UsageError)
    try:
        frameworks = list(dict.fromkeys(parse_framework_mode(e) for e in entries))
    except UnknownFramework as error:
        raise UsageError(str(error)) from None
    if len(frameworks) < 2:
        raise UsageError("--frameworks needs at least two different frameworks to compare")
    if args.model not in MODEL_NAMES:
        raise UsageError(f"unknown model {args.model!r} (known: {', '.join(MODEL_NAMES)})")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.seed < 0:
        raise UsageError("--seed cannot be negative")
    if args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.workers > 1:
        single = [f"{info.name}:{mode}" for info, mode in frameworks
                  if not info.scheme(mode).synchronous or info.scheme(mode).one_process]
        if single:
            raise UsageError(f"--workers {args.workers}: {single[0]} has no synchronous ranks to compare "
                             f"(one process, or asynchronous)")
    if args.tolerance is not None and not args.tolerance > 0:
        raise UsageError("--tolerance must be positive")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return frameworks, args.tolerance or tolerance(args.model)


def run_framework(info, mode: str, args, out: Path, python: str,
                  extra_env: dict[str, str] | None = None) -> Path:
    """One worker in check mode in the framework's environment; returns its dump folder."""
    from adapters.base import RunConfig  # host env: NumPy
    from launchers.local import run_local  # host env: psutil

    folder = out / f"{info.name}-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    config = RunConfig(run_id=folder.name, framework=info.name, mode=mode, model=args.model,
                       batch_per_worker=args.batch_size, workers_per_node=args.workers, dropout=False,
                       seed=args.seed, threads_per_worker=threads,
                       servers=1 if mode in info.server_modes else 0,
                       rank_dir=str(folder), check={"steps": steps_of(args), "out_dir": str(folder)})
    outcome = run_local(config, python, folder, info.rendezvous, REPO_ROOT, args.timeout,
                        extra_env=extra_env)
    if outcome.status != "ok":
        raise RuntimeError(f"{info.name}:{mode} {outcome.status}: {outcome.error}")
    return folder


def steps_of(args) -> int:
    return args.steps or (DISTRIBUTED_STEPS if args.workers > 1 else 1)


# steps a distributed check takes by default: enough for a compression's error to show in the loss
DISTRIBUTED_STEPS = 20


def compare_all(folders: dict, frameworks, args, initial: dict, tolerance: float) -> bool:
    """Exact schemes pair by pair; with several ranks, every run's ranks equal and each
    compressing scheme's cost to the loss against the first exact scheme."""
    from analysis.equivalence import compare_pair, loss_cost, ranks_agree  # host env: NumPy

    lossy = {f"{info.name}:{mode}" for info, mode in frameworks if info.scheme(mode).lossy}
    exact = {name: folder for name, folder in folders.items() if name not in lossy}
    ok = True
    if args.workers > 1:
        print(f"\n{args.workers} ranks, {steps_of(args)} steps")
        for name, folder in folders.items():
            ok &= ranks_agree(name, folder, args.workers)
    for (name_a, a), (name_b, b) in itertools.combinations(exact.items(), 2):
        ok &= compare_pair(name_a, a, name_b, b, initial, tolerance, args.verbose)
    if lossy and exact:
        reference, reference_folder = next(iter(exact.items()))
        print(f"\ncompressing schemes (not held to the tolerance), seed {args.seed}:")
        for name in sorted(lossy):
            loss_cost(name, folders[name], reference, reference_folder, steps_of(args))
    elif lossy:
        print("\nno exact scheme to measure the compressing ones' loss against: add torch:ddp")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = parser.current_spelling(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    overrides = overrides_or_exit(args.python)
    reexec_in_host_env("launchers.check", argv)
    from analysis.equivalence import LOSS_TOLERANCE  # host env: NumPy
    from models import canonical_weights, get_model  # host env: NumPy

    try:
        frameworks, tolerance = validate(args)
    except UsageError as error:
        return fail(error)
    out = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="dlc-check-"))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return fail(f"--keep {out} is not writable: {error.strerror}")
    print(f"check {args.model}: batch {args.batch_size}, seed {args.seed}, dropout off; limits: "
          f"loss {min(LOSS_TOLERANCE, tolerance):.0e}, gradients and one-step updates "
          f"{tolerance:.0e} (relative L2 per tensor)", flush=True)
    folders = {}
    try:
        try:
            pythons = prepare_interpreters(frameworks, overrides, log=print, warn=lambda _: None)
        except (InterpreterError, EnvBuildError) as error:
            return fail(error)
        for name, reason in pythons.unavailable.items():  # a check needs every framework it names
            return fail(f"{name}: cannot run on this machine: {reason}")
        for info, mode in frameworks:
            label = f"{info.name}:{mode}"
            try:
                folders[label] = run_framework(info, mode, args, out, pythons.python(info),
                                               pythons.rank_env(info))
            except RuntimeError as error:
                print(f"{label}: run failed: {error}", file=sys.stderr)
                return 1
            print(f"  ran {label}", flush=True)
        initial = canonical_weights(get_model(args.model), args.seed)
        ok = compare_all(folders, frameworks, args, initial, tolerance)
        print(f"\n{'PASS' if ok else 'FAIL'}: {args.model} within {tolerance:.0e}" if ok else
              f"\nFAIL: {args.model} above tolerance {tolerance:.0e}")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
