"""The launcher's own packages carried to a node that cannot install them: wheels downloaded
here (online) at envs/host.txt's pins, unpacked there into a folder on the path where missing,
and a wrapper interpreter for ranks whose Python lacks what the worker imports.

A device machine with a framework preinstalled but no network (``bench.gpu_study`` runs there)
has NumPy, pandas, matplotlib and seaborn (`REQUIRED_HERE`: too large for a wheel that travels)
but may lack the small packages the launcher imports (`LAUNCHER_PACKAGES`). A wheel is a zip of
what site-packages holds, so unpacking one is installing it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable

from core.envs import REPO_ROOT

# Packages the launcher imports that a node's python may lack, by import name: the
# distribution whose wheel supplies it (rich's and Jinja2's own dependencies with them).
LAUNCHER_PACKAGES = {"rich": "rich", "markdown_it": "markdown-it-py", "mdurl": "mdurl",
                     "pygments": "pygments", "tabulate": "tabulate", "psutil": "psutil",
                     "PIL": "pillow", "yaml": "PyYAML", "jinja2": "Jinja2", "markupsafe": "MarkupSafe"}
# versions of envs/host.txt
PINNED_WHEELS = ("rich", "tabulate", "psutil", "pillow", "PyYAML", "Jinja2", "MarkupSafe")
# The launcher's packages carried by no wheel (too large; a GPU node's Python has them)
REQUIRED_HERE = ("numpy", "pandas", "matplotlib", "seaborn")
WORKER_PACKAGES = ("numpy", "PIL")


class StagingError(RuntimeError):
    """The wheels cannot be downloaded or do not supply what is missing; one line."""


def host_pins() -> dict[str, str]:
    """name (lower case) -> version pinned in envs/host.txt."""
    pins = {}
    for line in (REPO_ROOT / "envs" / "host.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower()] = version.strip()
    return pins


def prepare_wheels(folder: Path, python_version: str, log: Callable[[str], None] = print) -> None:
    """Download (here, online) the wheels of the launcher's packages for the node's Python,
    at envs/host.txt's pins, and say how much they and the repository weigh."""
    pins = host_pins()
    requirements = [f"{name}=={pins[name.lower()]}" for name in PINNED_WHEELS]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
               "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
               "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
               "-d", str(folder), *requirements]
    if subprocess.run(command).returncode != 0:
        raise StagingError("pip could not download the wheels (is PyPI reachable from here?)")
    wheels = sum(path.stat().st_size for path in folder.glob("*.whl"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True).stdout
    repository = sum((REPO_ROOT / name).stat().st_size for name in tracked.decode().split("\0")
                     if name and (REPO_ROOT / name).is_file())
    log(f"wheels: {wheels / 2**20:.1f} MiB in {folder}; repository: {repository / 2**20:.1f} MiB; "
        f"together {(wheels + repository) / 2**20:.1f} MiB of the 64 MiB a device call carries")


def present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def installed_version(name: str) -> str | None:
    """The version of the package imported as `name` here ('present' without its metadata),
    None when it is not importable."""
    if not present(name):
        return None
    try:
        return importlib.metadata.version(LAUNCHER_PACKAGES.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return "present"


def wheel_for(folder: Path, distribution: str) -> Path | None:
    normal = re.sub(r"[-_.]+", "_", distribution).lower()
    return next((wheel for wheel in sorted(folder.glob("*.whl"))
                 if wheel.name.split("-")[0].lower() == normal), None)


def unpack_missing(names: list[str], wheels: Path, site: Path,
                   log: Callable[[str], None] = print) -> list[str]:
    """Unpack the wheels of the import `names` into `site` (a wheel is a zip of what
    site-packages holds); the names no wheel supplies."""
    lacking = []
    for name in names:
        wheel = wheel_for(wheels, LAUNCHER_PACKAGES.get(name, name))
        if wheel is None:
            lacking.append(name)
            continue
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        log(f"  {name}: unpacked {wheel.name}")
    return lacking


def missing_in(python: str, names) -> list[str]:
    """The import names another interpreter cannot find."""
    code = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if not importlib.util.find_spec(n)))"
    result = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=60)
    return result.stdout.split()


def supply_packages(framework_pythons: dict[str, str], wheels: Path, site: Path,
                    log: Callable[[str], None] = print) -> dict[str, str]:
    """Make the launcher's packages importable here (and in every child), and the worker's in
    each framework interpreter, from the wheels where missing; returns the framework
    interpreters to use (a wrapper that adds the unpacked wheels where one needed them).
    StagingError when a missing package has no wheel."""
    missing = [name for name in LAUNCHER_PACKAGES if not present(name)]
    lacking_workers = {framework: missing_in(python, WORKER_PACKAGES)
                       for framework, python in framework_pythons.items()}
    wanted = list(dict.fromkeys(missing + [n for names in lacking_workers.values() for n in names]))
    if wanted:
        log(f"from the wheels in {wheels}: {', '.join(wanted)}")
        site.mkdir(parents=True, exist_ok=True)
        lacking = unpack_missing(wanted, wheels, site, log)
        if lacking:
            raise StagingError(f"{', '.join(lacking)} missing here and not among the wheels in "
                               f"{wheels} (python -m bench.gpu_study --prepare downloads them)")
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    chosen = {}
    for framework, python in framework_pythons.items():
        chosen[framework] = python if not lacking_workers[framework] else wrapper(python, site)
    return chosen


def wrapper(python: str, site: Path) -> str:
    """An executable that runs `python` with the unpacked wheels on its path: the ranks' own
    PYTHONPATH is the repository's alone (launchers/local.py)."""
    path = site / f"python-{hashlib.sha256(python.encode()).hexdigest()[:8]}"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" "$@"\n')
    path.chmod(0o755)
    return str(path)
