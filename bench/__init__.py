"""Benchmarks: performance targets, kept out of the timed unit tests (`python -m bench.NAME`).

Shared pieces: moving a benchmark into its framework's environment, timing several ways of
doing the same step in interleaved rounds (so machine noise hits each alike), and running a
campaign through the compare launcher and reading its store.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

IN_ENV_VAR = "DLCOMPARE_BENCH_IN_ENV"


def reexec_in_framework_env(env_name: str, module: str, **variables: str) -> None:
    """Re-run `python -m module` (same arguments) in the framework's environment, once."""
    if os.environ.get(IN_ENV_VAR) == "1":
        return
    from core.envs import REPO_ROOT, ensure_environment

    env = ensure_environment(env_name, log=print)
    os.environ.update({IN_ENV_VAR: "1", "PYTHONPATH": str(REPO_ROOT), **variables})
    os.execv(str(env.python), [str(env.python), "-m", module, *sys.argv[1:]])


def seconds_per_call(fn: Callable[[], object], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - start) / iterations


def interleaved_rounds(steps: dict[str, Callable[[], object]], iterations: int, rounds: int,
                       warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per step of each named way, `rounds` times, the ways taking turns in each round.
    Every way is warmed up (traced, compiled, allocated) before any round is timed. A way that
    is asynchronous must wait for its device inside its step function."""
    for step in steps.values():
        seconds_per_call(step, warmup)
    timings: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            timings[name].append(seconds_per_call(step, iterations))
    return timings


def medians(timings: dict[str, list[float]]) -> dict[str, float]:
    return {f"{name}_s": statistics.median(values) for name, values in timings.items()}


def run_compare(arguments: list[str], out: Path, **how) -> int:
    """`python -m launchers.compare ARGUMENTS --out OUT` as a user runs it (so every number is
    also in that campaign's store, report and tables); returns its exit code. `how`: as
    `run_command`'s (a time limit, a log file)."""
    return run_command(["launchers.compare", *arguments, "--out", str(out)], **how)


def run_command(module_and_arguments: list[str], timeout: float | None = None,
                log: Path | None = None, grace: float = 30.0) -> int:
    """`python -m MODULE ARGUMENTS` with this interpreter in the repository, its output to
    `log` when given (else inherited); returns its exit code.  Past `timeout` seconds it gets
    SIGTERM, which the launchers take as Ctrl-C (ranks killed, what was measured stored), and
    `grace` seconds later SIGKILL; the code is then that of the ended command (negative for
    a signal)."""
    from core.envs import REPO_ROOT

    output = open(log, "ab") if log else None
    try:
        process = subprocess.Popen([sys.executable, "-m", *module_and_arguments], cwd=REPO_ROOT,
                                   stdout=output, stderr=subprocess.STDOUT if output else None)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                return process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.kill()
                return process.wait()
    finally:
        if output:
            output.close()


def stored_runs(out: Path, columns: str) -> list[tuple]:
    """Rows of the campaign store's `runs` table (`columns`: an SQL column list)."""
    with sqlite3.connect(out / "results.sqlite") as db:
        return db.execute(f"SELECT {columns} FROM runs").fetchall()
