"""Bad input: one line on stderr, exit code 2, and nothing already stored is lost."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli

BAD_ARGUMENTS = {
    "unknown framework": ["--frameworks", "caffe3", "--model", "alexnet-tiny"],
    "unknown mode": ["--frameworks", "torch:nope", "--model", "alexnet-tiny"],
    "unknown model": ["--frameworks", "torch", "--model", "vgg99"],
    "zero workers": ["--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "0"],
    "zero batch": ["--frameworks", "torch", "--model", "alexnet-tiny", "--batch-size", "0"],
    "bad number": ["--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "two"],
    "zero iterations": ["--frameworks", "torch", "--model", "alexnet-tiny", "--iterations", "0"],
    "unknown option": ["--frameworks", "torch", "--model", "alexnet-tiny", "--frobnicate"],
    "zero launches": ["--frameworks", "torch", "--model", "alexnet-tiny", "--launches", "0"],
    "negative launches": ["--frameworks", "torch", "--model", "alexnet-tiny", "--launches", "-2"],
    "fractional launches": ["--frameworks", "torch", "--model", "alexnet-tiny", "--launches", "2.5"],
}


def seeded_store(folder: Path) -> Path:
    """A campaign folder that already holds one stored record."""
    from analysis.record import empty_record
    from analysis.store import ResultStore

    folder.mkdir(parents=True, exist_ok=True)
    store = ResultStore.for_campaign(folder)
    store.add(empty_record(run_id="kept", framework="torch", framework_label="PyTorch DDP",
                           model="alexnet-tiny", status="ok", world_size=1,
                           iter_time_median=0.1))
    store.close()
    return folder


def stored_ids(folder: Path) -> list[str]:
    with sqlite3.connect(folder / "results.sqlite") as db:
        return [row[0] for row in db.execute("SELECT run_id FROM runs")]


def assert_one_line_error(result, needle: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert lines and lines[-1].startswith("dlcompare: error:"), result.stderr
    assert sum(line.startswith("dlcompare: error:") for line in lines) == 1
    assert needle in lines[-1], lines[-1]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments(tmp_path, case):
    out = seeded_store(tmp_path / "campaign")
    result = run_cli("launchers.compare", *BAD_ARGUMENTS[case], "--out", str(out))
    needle = {"unknown framework": "caffe3", "unknown mode": "nope", "unknown model": "vgg99",
              "zero workers": "--workers", "zero batch": "--batch-size",
              "bad number": "--workers", "zero iterations": "--iterations",
              "unknown option": "--frobnicate", "zero launches": "--launches", "negative launches": "--launches",
              "fractional launches": "--launches"}[case]
    assert_one_line_error(result, needle)
    assert stored_ids(out) == ["kept"]


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--out", str(blocker / "campaign"))
    assert_one_line_error(result, "not writable")


def test_gpu_without_gpu(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    result = run_cli("launchers.compare", "--device", "gpu", "--model", "alexnet-tiny",
                     "--out", str(tmp_path / "c"))
    assert_one_line_error(result, "no GPU")


@pytest.mark.slow
def test_environment_that_cannot_be_built(tmp_path):
    """A pin that does not exist: the environment build fails, exit 2, the store is intact."""
    pins = tmp_path / "pins"
    pins.mkdir()
    (pins / "torch.txt").write_text("dlcompare-no-such-package-anywhere==0.0.1\n")
    out = seeded_store(tmp_path / "campaign")
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--workers", "1", "--out", str(out),
                     env={"DLCOMPARE_REQUIREMENTS": str(pins), "DLCOMPARE_HOME": str(tmp_path / "home"),
                          # the pins folder has no host.txt: the launcher runs in the test's interpreter
                          "DLCOMPARE_NO_BOOTSTRAP": "1"}, timeout=600)
    assert_one_line_error(result, "could not be built")
    assert stored_ids(out) == ["kept"]


@pytest.mark.parametrize("module", ["analysis.report", "analysis.summary", "analysis.predict", "analysis.diff"])
def test_analysis_commands_run_from_any_python(tmp_path, module):
    """The README's `python3 -m analysis.report DIR` from a Python without pandas (a user's,
    CI's): the command moves itself into the host environment first, so a missing campaign
    is the one-line error, not a ModuleNotFoundError."""
    import os
    import subprocess
    import sys

    python = shutil.which("python3") or sys.executable
    env = {key: value for key, value in os.environ.items()
           if key not in ("DLCOMPARE_NO_BOOTSTRAP", "DLCOMPARE_HOST_ENV", "PYTHONPATH", "VIRTUAL_ENV")}
    args = {"analysis.predict": ["--from", str(tmp_path / "none"), "--model", "alexnet"],
            "analysis.diff": [str(tmp_path / "none"), str(tmp_path / "other")]}.get(module, [str(tmp_path / "none")])
    result = subprocess.run([python, "-m", module, *args], cwd=Path(__file__).resolve().parents[1],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "ModuleNotFoundError" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stderr
