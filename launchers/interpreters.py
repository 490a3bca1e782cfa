"""Which interpreter runs each framework's ranks: its virtualenv (built once from
envs/<env>.txt, core/envs.py), its container image's (launchers/images.py), or one the user
named.

A GPU node is often offline or managed: its users already have a PyTorch or JAX environment and
cannot let dlcompare build one from the internet.  `--python FRAMEWORK=PATH` (repeatable or a
comma list; also the DLCOMPARE_PYTHON variable, which the flag overrides framework by
framework) runs that framework's ranks with PATH instead of its virtualenv.  Before anything
runs, PATH must be an executable interpreter that imports the worker and the framework's
adapter (so the framework itself, NumPy and Pillow); the versions it finds are printed, and
every rank it runs records `python_override: PATH` in its record's environment.  A framework
driven through a backend interpreter (CNTK's Python 3.6) takes that backend's path: it must
import the framework itself, and the worker side keeps its environment.

Standard library only at import: the command lines check the flag's form before they move
into the launcher's environment (core.envs.reexec_in_host_env).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from adapters.registry import FrameworkInfo, UnknownFramework, framework_info
from core.cli import comma_list, fail
from core.envs import PYTHON_OVERRIDE_VAR, REPO_ROOT, EnvUnavailable, ensure_environment

PYTHON_VARIABLE = "DLCOMPARE_PYTHON"
PROBE_TIMEOUT_S = 180.0  # importing TensorFlow on a cold disk takes a while

# Run by the named interpreter (any Python 3, CNTK's 3.6 too): import each module named on the
# command line, then print one JSON line: the Python version and each top-level package's
# version, or the first module that failed and why.
PROBE = r"""
import importlib, json, platform, sys
found = {"python": platform.python_version(), "executable": sys.executable}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as error:
        print(json.dumps({"failed": name, "error": "%s: %s" % (type(error).__name__, error)}))
        sys.exit(0)
for name in sys.argv[1:]:
    top = name.split(".")[0]
    if top != "adapters":
        found[top] = str(getattr(sys.modules[top], "__version__", "") or "unknown")
print(json.dumps(found))
"""


class InterpreterError(ValueError):
    """A named interpreter that cannot run its framework; one line, bad input (exit 2)."""


def add_python_argument(parser) -> None:
    """The --python flag of every command that starts ranks (compare, calibrate, check)."""
    parser.add_argument("--python", action="append", metavar="FRAMEWORK=PATH",
                        help="run FRAMEWORK's ranks with the interpreter PATH (an environment you "
                             "have: checked to import it, versions printed and recorded) instead "
                             "of building its virtualenv; repeatable or a comma list; also "
                             f"{PYTHON_VARIABLE}=torch=PATH,jax=PATH")


def overrides_or_exit(flags: Iterable[str] | None) -> dict[str, str]:
    """`parse_overrides`, a bad entry ending the command in its one line (exit 2): called
    before the move into the launcher's environment, so nothing is built for a typo."""
    try:
        return parse_overrides(flags)
    except InterpreterError as error:
        raise SystemExit(fail(error)) from None


def parse_overrides(flags: Iterable[str] | None,
                    environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """framework name -> interpreter path, from DLCOMPARE_PYTHON then the --python flags (each
    FRAMEWORK=PATH or a comma list of them; a later entry wins).  Checks the names against the
    registry and that each path is an executable file (a bare name is looked up on PATH);
    what it imports is `probe_interpreter`'s business."""
    variable = environ.get(PYTHON_VARIABLE, "")
    entries = [(PYTHON_VARIABLE, item) for item in
               (comma_list(variable, PYTHON_VARIABLE, InterpreterError) if variable.strip() else [])]
    entries += [("--python", item) for flag in flags or ()
                for item in comma_list(flag, "--python", InterpreterError)]
    overrides = {}
    for source, item in entries:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InterpreterError(f"{source} takes FRAMEWORK=PATH, got {item!r}")
        try:
            info = framework_info(name.strip())
        except UnknownFramework as error:
            raise InterpreterError(f"{source}: {error}") from None
        overrides[info.name] = executable(path.strip(), f"{source} {info.name}={path.strip()}")
    return overrides


def executable(path: str, what: str) -> str:
    """The absolute path of an executable file (`path`, or a bare name found on PATH), not
    resolved through symbolic links: a virtualenv's python is a link whose location matters."""
    expanded = os.path.expanduser(path)
    found = expanded if os.sep in expanded else shutil.which(expanded)
    if not found or not os.path.exists(found):
        raise InterpreterError(f"{what}: no such interpreter")
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise InterpreterError(f"{what}: not an executable file")
    return os.path.abspath(found)


def probe_modules(info: FrameworkInfo) -> list[str]:
    """What the named interpreter of `info` must import: the framework first (the likeliest
    to be missing, and the error should say so); then, without a backend, the worker's own
    libraries, the worker and the framework's adapter."""
    if info.backend_env:
        return list(info.imports)
    return [*info.imports, "numpy", "PIL", "adapters.worker", info.module]


def probe_interpreter(info: FrameworkInfo, path: str) -> dict[str, str]:
    """Run `path` once to import what `info`'s ranks need; the versions found (python and each
    package), or InterpreterError in one line."""
    what = f"--python {info.name}={path}"
    try:
        result = subprocess.run([path, "-c", PROBE, *probe_modules(info)], capture_output=True,
                                text=True, timeout=PROBE_TIMEOUT_S, cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    except subprocess.TimeoutExpired:
        raise InterpreterError(f"{what}: importing {info.name} took over {PROBE_TIMEOUT_S:.0f} s") from None
    except OSError as error:
        raise InterpreterError(f"{what}: cannot be run: {error.strerror or error}") from None
    lines = result.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        found = None
    if result.returncode != 0 or not isinstance(found, dict):
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise InterpreterError(f"{what}: is not a Python interpreter that runs (exit "
                               f"{result.returncode}: {tail})")
    if "failed" in found:
        raise InterpreterError(f"{what}: cannot import {found['failed']} ({found['error']})")
    return found


def versions_line(found: Mapping[str, str]) -> str:
    """'Python 3.12.3, torch 2.5.1, numpy 2.1.0, PIL 11.0.0' from `probe_interpreter`'s dict."""
    packages = ", ".join(f"{name} {version}" for name, version in found.items()
                         if name not in ("python", "executable"))
    return f"Python {found.get('python', '?')}" + (f", {packages}" if packages else "")


@dataclass
class Interpreters:
    """The interpreter of each framework's ranks here, and the frameworks that cannot run."""

    pythons: dict[str, str] = field(default_factory=dict)  # framework -> its ranks' python
    backends: dict[str, str] = field(default_factory=dict)  # framework -> backend's python
    overrides: dict[str, str] = field(default_factory=dict)  # framework -> the user's python
    unavailable: dict[str, str] = field(default_factory=dict)  # framework -> why not here

    def ready(self, info: FrameworkInfo) -> bool:
        return info.name in self.pythons and (not info.backend_env or info.name in self.backends)

    def python(self, info: FrameworkInfo) -> str:
        return self.pythons[info.name]

    def rank_env(self, info: FrameworkInfo) -> dict[str, str]:
        """Variables every rank of `info` gets: its backend's interpreter (DLC_BACKEND_PYTHON)
        and, where the user named one, the override the record keeps."""
        env = {}
        if info.name in self.backends:
            env["DLC_BACKEND_PYTHON"] = self.backends[info.name]
        if info.name in self.overrides:
            env[PYTHON_OVERRIDE_VAR] = self.overrides[info.name]
        return env


def prepare_interpreters(frameworks: Iterable[tuple[FrameworkInfo, str]],
                         overrides: Mapping[str, str], log: Callable[[str], object] = print,
                         warn: Callable[[str], object] | None = None,
                         status: Callable[[str], contextlib.AbstractContextManager] | None = None
                         ) -> Interpreters:
    """Each framework's interpreter: the one named in `overrides` after `probe_interpreter`
    (InterpreterError when it cannot run the framework), else its virtualenv, built once and
    reused (core.envs.ensure_environment; EnvBuildError when a build fails).  A framework
    whose environment this machine cannot host at all (EnvUnavailable: no Python 3.6 for
    CNTK) is reported through `warn` and listed in `unavailable`, so a campaign skips it.
    `status(text)` wraps each build (a spinner)."""
    warn = warn or log
    status = status or (lambda text: contextlib.nullcontext())
    chosen = Interpreters()
    built: dict[str, str] = {}

    def environment(name: str, info: FrameworkInfo) -> str:
        if name not in built:
            with status(f"environment {name} for {info.name} ..."):
                built[name] = str(ensure_environment(name, log=log).python)
        return built[name]

    for info, _ in frameworks:
        if info.name in chosen.pythons or info.name in chosen.unavailable:
            continue
        named = overrides.get(info.name)
        if named:
            log(f"{info.name}: {named} ({versions_line(probe_interpreter(info, named))})")
            chosen.overrides[info.name] = named
        try:
            worker = named if named and not info.backend_env else environment(info.env, info)
            if info.backend_env:
                chosen.backends[info.name] = named or environment(info.backend_env, info)
        except EnvUnavailable as error:
            chosen.unavailable[info.name] = str(error)
            warn(f"{info.name}: cannot run on this machine: {error}")
            continue
        chosen.pythons[info.name] = worker
    return chosen
