"""How the ranks of one run hand their results to rank 0: each writes its own file atomically
(`core.files.write_json_atomic`) before a barrier, rank 0 then reads them all.  Every result carries the environment it was
measured in."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from adapters.base import cpu_name
from core.envs import PYTHON_OVERRIDE_VAR


def environment(versions: dict) -> dict:
    """The facts every result carries: Python and its interpreter (`python_override` where the
    user named it with --python instead of the framework's environment), the platform, the
    CPU, NumPy, and the adapter's `versions`."""
    override = os.environ.get(PYTHON_OVERRIDE_VAR)
    return {"python": platform.python_version(), "python_executable": sys.executable,
            **({"python_override": override} if override else {}),
            "platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "numpy": np.__version__, **versions}


def wait_for_rank_files(rank_dir: Path, world_size: int, timeout: float = 60.0,
                        name: str = "rank{rank}.json") -> list[dict]:
    """Read every rank's file `name` (formatted with rank); they are written before a barrier,
    so this is brief."""
    deadline = time.monotonic() + timeout
    paths = [rank_dir / name.format(rank=r) for r in range(world_size)]
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise RuntimeError(f"rank results missing after barrier: {missing}")
        time.sleep(0.05)
    return [json.loads(p.read_text()) for p in paths]
