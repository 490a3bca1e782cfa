"""Shared fixtures: the CLI as a user runs it, and the framework environments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `python -m <args>` from the repository root in this interpreter, as a user would
    (the bootstrap is skipped: the test process already runs in the launcher's environment)."""
    full_env = {**os.environ, "DLCOMPARE_NO_BOOTSTRAP": "1", "PYTHONPATH": str(REPO_ROOT),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def worker_processes(marker: str) -> list:
    """Live processes whose command line mentions `marker` (a campaign folder, say)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if marker in cmdline and process.pid != os.getpid():
            found.append(process)
    return found


@pytest.fixture(scope="session")
def torch_python() -> str:
    """The PyTorch environment's interpreter, built from envs/torch.txt on first use."""
    from launchers.envs import ensure_environment

    return str(ensure_environment("torch", log=print).python)


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    """The MXNet environment's interpreter, built from envs/mxnet.txt on first use."""
    from launchers.envs import ensure_environment

    return str(ensure_environment("mxnet", log=print).python)


@pytest.fixture(scope="session")
def tf_python() -> str:
    """The TensorFlow environment's interpreter, built from envs/tf.txt (+ tf.nodeps.txt)."""
    from launchers.envs import ensure_environment

    return str(ensure_environment("tf", log=print).python)
