"""Per-framework virtual environments built from pinned requirement files, and the bootstrap
that moves the launcher itself into its own environment.

Frameworks' dependencies clash (MXNet 1.9 needs NumPy < 1.24, TensorFlow a new NumPy), so each
framework runs in its own virtualenv built from `envs/<name>.txt`, the same pins the Docker
images use. An optional `envs/<name>.nodeps.txt` is installed after it with `pip --no-deps`, for
packages whose declared dependencies must not be resolved (tf-keras would pull the full GPU
`tensorflow` wheel beside `tensorflow-cpu`); a requirement file cannot say --no-deps per line.
An optional `envs/<name>.build.txt` is installed last with `--no-build-isolation --no-cache-dir`,
for packages compiled from source against what the environment already holds (Horovod against
its torch); its `# env: NAME=VALUE` lines are set for that step only, `{envs}` in a value standing
for the folder of the requirement files (so a helper script there can be given as, say, CXX).
An environment lives in `$DLCOMPARE_HOME/envs/<name>-<digest>`, where the digest covers the
requirement files and the interpreter, so changing a pin builds a new one and an unchanged one
is reused: a second campaign installs nothing.

Standard library only: this module runs before any environment exists.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from core.cli import EXIT_FAILED, EXIT_OK, OneLineParser, fail
from core.files import file_lock

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST_ENV = "host"
COMPLETE_MARKER = ".dlcompare-complete"
BOOTSTRAP_VAR = "DLCOMPARE_HOST_ENV"
# Set for the ranks that run in an interpreter the user named instead of their environment
# (launchers/interpreters.py); the worker records it with every result.
PYTHON_OVERRIDE_VAR = "DLC_PYTHON_OVERRIDE"


class EnvBuildError(RuntimeError):
    """An environment could not be built; the message is one line and names the log."""


class EnvUnavailable(EnvBuildError):
    """This machine lacks what the environment needs at all (an interpreter version): the
    framework cannot run here, which is a fact to report, not a broken build."""


def dlcompare_home() -> Path:
    return Path(os.environ.get("DLCOMPARE_HOME", "~/.cache/dlcompare")).expanduser()


def requirements_dir() -> Path:
    """Where the pinned requirement files are; overridable for tests of broken pins."""
    return Path(os.environ.get("DLCOMPARE_REQUIREMENTS", REPO_ROOT / "envs"))


@dataclass(frozen=True)
class Environment:
    name: str
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def ready(self) -> bool:
        return (self.path / COMPLETE_MARKER).exists()


def requirements_file(name: str) -> Path:
    path = requirements_dir() / f"{name}.txt"
    if not path.exists():
        raise EnvBuildError(f"no requirement file for environment {name!r} ({path})")
    return path


def nodeps_requirements_file(name: str) -> Path | None:
    """`envs/<name>.nodeps.txt`, installed with --no-deps after `<name>.txt`, if it exists."""
    path = requirements_dir() / f"{name}.nodeps.txt"
    return path if path.exists() else None


def build_requirements_file(name: str) -> Path | None:
    """`envs/<name>.build.txt`, compiled against the environment after everything else."""
    path = requirements_dir() / f"{name}.build.txt"
    return path if path.exists() else None


def build_variables(text: str) -> dict[str, str]:
    """The `# env: NAME=VALUE` lines of a build file, `{envs}` replaced by the envs folder."""
    folder = str(requirements_dir())
    return {name: value.strip().replace("{envs}", folder)
            for name, value in re.findall(r"^#\s*env:\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$", text,
                                          re.MULTILINE)}


def build_helper_files(text: str) -> list[Path]:
    """Files of the envs folder that a build file's variables name as `{envs}/...`."""
    return [requirements_dir() / relative
            for relative in re.findall(r"\{envs\}/([\w.\-/]+)", text)]


def expanded_requirements(path: Path) -> str:
    """The file's text with every `-r other.txt` it includes appended."""
    text = path.read_text()
    for match in re.finditer(r"^-r\s+(\S+)\s*$", text, re.MULTILINE):
        text += "\n" + expanded_requirements(path.parent / match.group(1))
    return text


def requirements_text(name: str) -> str:
    """Everything the environment is built from (the digest and the ready marker cover it)."""
    text = expanded_requirements(requirements_file(name))
    nodeps = nodeps_requirements_file(name)
    if nodeps is not None:
        text = f"{text}\n# --no-deps:\n{nodeps.read_text()}"
    build = build_requirements_file(name)
    if build is not None:  # the build step's pins, variables and helper scripts
        build_text = build.read_text()
        text = f"{text}\n# --no-build-isolation:\n{build_text}"
        for helper in build_helper_files(build_text):
            text += f"\n# {helper.name}:\n{helper.read_text()}"
    return text


def apt_packages(requirements: str) -> list[str]:
    """System packages a requirement file asks for with '# apt: pkg pkg' lines."""
    return [package for line in re.findall(r"^#\s*apt:\s*(.+)$", requirements, re.MULTILINE)
            for package in line.split()]


def ensure_apt_packages(packages: list[str], log) -> None:
    """Install missing Debian packages (as root), or say in one line what to install."""
    missing = [p for p in packages
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
                                 text=True).stdout.strip() != "install ok installed"]
    if not missing:
        return
    command = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EnvBuildError(f"needs system packages {' '.join(missing)}: run "
                            f"'sudo {' '.join(command)}'")
    if log:
        log(f"installing system packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with file_lock(dlcompare_home() / "apt.lock"):  # dpkg takes one apt-get at a time
        for step in (["apt-get", "update", "-qq"], command):
            result = subprocess.run(step, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
                raise EnvBuildError(f"could not install {' '.join(missing)}: {tail[0]}")


def base_interpreter(requirements: str) -> str:
    """The interpreter a requirement file asks for with a '# python: X.Y' line, else ours.

    Searched on PATH and among pyenv's versions; never assumed to exist.
    """
    match = re.search(r"^#\s*python:\s*(\d+\.\d+)\s*$", requirements, re.MULTILINE)
    if not match:
        return os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    version = match.group(1)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser()
    # PATH may hold pyenv's shim, which exists but fails unless that version is selected: a
    # candidate counts only if it runs and is that version.
    candidates = [shutil.which(f"python{version}"),
                  *map(str, sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}")))]
    for candidate in filter(None, candidates):
        if interpreter_version(candidate) == version:
            return candidate
    raise EnvUnavailable(f"needs Python {version}, which is not on this machine "
                         f"(looked on PATH and in {pyenv_root}/versions)")


def interpreter_version(python: str) -> str | None:
    """'X.Y' of an interpreter that runs, else None."""
    try:
        result = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def environment_for(name: str) -> Environment:
    requirements = requirements_text(name)
    interpreter = base_interpreter(requirements)
    digest = hashlib.sha256(f"{requirements}\n{interpreter}".encode()).hexdigest()[:12]
    return Environment(name, dlcompare_home() / "envs" / f"{name}-{digest}")


def ensure_environment(name: str, log=None) -> Environment:
    """Return the ready environment `name`, building it first if needed.

    Built into a '.partial' folder and renamed when pip succeeded, under a file lock, so an
    interrupted or concurrent build never leaves a half environment that looks ready.
    """
    env = environment_for(name)
    if env.ready:
        return env
    with file_lock(env.path.with_suffix(".lock")):
        if env.ready:
            return env
        ensure_apt_packages(apt_packages(requirements_text(name)), log)
        if log:
            log(f"building environment {name!r} in {env.path} (once; later runs reuse it)")
        build_environment(env)
    return env


def install_commands(name: str, python: str) -> list[tuple[list[str], dict[str, str]]]:
    """The pip steps that fill an environment `name` into the venv of `python`, each with the
    variables set for that step only: the requirement file, its `--no-deps` file, its build
    file. The virtualenv builder and the container images (`install` below) run the same."""
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    steps = [([*pip, "-r", str(requirements_file(name))], {})]
    nodeps = nodeps_requirements_file(name)
    if nodeps is not None:
        steps.append(([*pip, "--no-deps", "-r", str(nodeps)], {}))
    build = build_requirements_file(name)
    if build is not None:
        # No cache: a wheel cached from another build (other flags) must not stand in.
        steps.append(([*pip, "--no-build-isolation", "--no-cache-dir", "-r", str(build)],
                      build_variables(build.read_text())))
    return steps


def build_environment(env: Environment) -> None:
    requirements = requirements_file(env.name)
    partial = env.path.with_name(env.path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log_path = env.path.with_name(env.path.name + ".build.log")
    interpreter = base_interpreter(requirements.read_text())
    with open(log_path, "w") as log:
        steps = [([interpreter, "-m", "venv", str(partial)], {}),
                 *install_commands(env.name, str(partial / "bin" / "python"))]
        for command, extra in steps:
            log.write("$ " + " ".join([*(f"{k}={v}" for k, v in extra.items()), *command]) + "\n")
            log.flush()
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **extra} if extra else None)
            if result.returncode != 0:
                raise EnvBuildError(
                    f"environment {env.name!r} could not be built: {last_error_line(log_path)}"
                    f" (full log: {log_path})")
    (partial / COMPLETE_MARKER).write_text(requirements_text(env.name))
    shutil.rmtree(env.path, ignore_errors=True)
    partial.rename(env.path)


def install_into(venv: Path, names: list[str], log=print) -> None:
    """Install the environments `names` one after the other into one virtualenv at `venv`
    (made with this interpreter if missing), system packages first: what a container image
    does, so an image holds exactly the pins of the local environments. Output streams."""
    texts = {name: requirements_text(name) for name in names}
    ensure_apt_packages([p for text in texts.values() for p in apt_packages(text)], log)
    python = venv / "bin" / "python"
    if not python.exists():
        interpreter = base_interpreter(next(iter(texts.values()), ""))
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
    for name in names:
        for command, extra in install_commands(name, str(python)):
            log("$ " + " ".join([*(f"{k}={v}" for k, v in extra.items()), *command]))
            if subprocess.run(command, env={**os.environ, **extra}).returncode != 0:
                raise EnvBuildError(f"environment {name!r} could not be installed into {venv}")


def last_error_line(log_path: Path) -> str:
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()
             if line.strip()]
    for line in reversed(lines):
        if line.startswith("ERROR") or "Error" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def reexec_in_host_env(module: str, argv: list[str]) -> None:
    """Make sure this process runs in the launcher's own environment (envs/host.txt).

    The README's commands are run with any Python 3; the first time, this builds the host
    environment (pandas, seaborn, rich, pytest ...), then replaces the process with the same
    command inside it. Set DLCOMPARE_NO_BOOTSTRAP=1 to run in the current interpreter.
    """
    if os.environ.get("DLCOMPARE_NO_BOOTSTRAP") == "1" or os.environ.get(BOOTSTRAP_VAR):
        return
    try:
        env = ensure_environment(HOST_ENV, log=lambda m: print(m, file=sys.stderr, flush=True))
    except EnvBuildError as error:
        raise SystemExit(fail(error)) from None
    os.environ[BOOTSTRAP_VAR] = str(env.path)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.execv(str(env.python), [str(env.python), "-m", module, *argv])


def environment_names() -> list[str]:
    """Every environment with a requirement file in envs/ (its extra files not counted)."""
    return sorted(path.stem for path in requirements_dir().glob("*.txt") if "." not in path.stem)


def build_side_by_side(names: list[str], log=print) -> list[str]:
    """Build the environments `names` at once (each under its own lock, so a later
    `ensure_environment` reuses them), logging each one's outcome; returns the errors.

    Most of a build waits on downloads and disk, a compile step on one core, so side by side
    they take about as long as the longest rather than the sum. An environment this machine
    cannot have (`EnvUnavailable`: an interpreter it lacks) is logged, not an error."""
    def build(name: str) -> str | None:
        started = time.monotonic()
        try:
            env = ensure_environment(name)
        except EnvUnavailable as error:
            log(f"{name}: unavailable here: {error}")
            return None
        except EnvBuildError as error:
            return f"{name}: {error}"
        log(f"{name}: ready in {time.monotonic() - started:.0f} s ({env.path})")
        return None

    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return [error for error in pool.map(build, names) if error]


def main(argv: list[str]) -> int:
    """`python -m core.envs build [NAME ...]`: the cached environments (every one by default);
    `python -m core.envs install --venv DIR NAME [NAME ...]`: into one venv (docker/*)."""
    parser = OneLineParser(prog="python -m core.envs")
    parser.add_argument("action", choices=["build", "install"])
    parser.add_argument("--venv", type=Path, help="install: the virtualenv to fill")
    parser.add_argument("names", nargs="*", help="environments (envs/NAME.txt); build: all by default")
    args = parser.parse_intermixed_args(argv)  # names may follow --venv DIR
    try:
        if args.action == "build":
            unknown = sorted(set(args.names) - set(environment_names()))
            if unknown:
                parser.error(f"no environment {', '.join(unknown)} (known: {', '.join(environment_names())})")
            errors = build_side_by_side(args.names or environment_names(), log=lambda m: print(m, flush=True))
            return fail("; ".join(errors), EXIT_FAILED) if errors else EXIT_OK
        if args.venv is None or not args.names:
            parser.error("install needs --venv DIR and at least one environment")
        install_into(args.venv, args.names, log=lambda m: print(m, flush=True))
    except EnvBuildError as error:
        return fail(error)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
