"""A framework's ranks in an interpreter the user already has (--python FRAMEWORK=PATH and
DLCOMPARE_PYTHON): the flag's form, the check that the interpreter imports the framework, the
one-line errors, and the interpreter recorded with every run."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from adapters.registry import FRAMEWORKS, framework_info
from launchers.interpreters import (PYTHON_VARIABLE, InterpreterError, Interpreters,
                                    parse_overrides, prepare_interpreters, probe_interpreter,
                                    probe_modules, versions_line)
from tests.conftest import run_cli
from tests.test_bad_input import assert_one_line_error

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: no torch (nor NumPy) in it


def python_without_torch() -> str:
    if not os.path.exists(SYSTEM_PYTHON) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} is missing or has torch")
    return SYSTEM_PYTHON


def executable_script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------------- the flag's form

def test_the_variable_first_then_each_flag_framework_by_framework(tmp_path):
    a = executable_script(tmp_path / "a", "#!/bin/sh\n")
    b = executable_script(tmp_path / "b", "#!/bin/sh\n")
    environ = {PYTHON_VARIABLE: f"torch={a},jax={a}"}
    assert parse_overrides(None, environ) == {"torch": a, "jax": a}
    assert parse_overrides([f"torch={b}", f"tf={b},mxnet={a}"], environ) == \
        {"torch": b, "jax": a, "tf": b, "mxnet": a}
    assert parse_overrides([], {}) == {}


def test_a_bare_name_is_found_on_path():
    assert parse_overrides(["torch=sh"], {}) == {"torch": shutil.which("sh")}


@pytest.mark.parametrize("entry, needle", [
    ("torch", "takes FRAMEWORK=PATH"),
    ("torch=", "takes FRAMEWORK=PATH"),
    ("caffe3=/bin/sh", "unknown framework 'caffe3'"),
    ("torch=/no/such/python", "no such interpreter"),
    ("torch=no-such-python-anywhere", "no such interpreter"),
    ("torch={plain}", "not an executable file"),
    ("torch=sh,,tf=sh", "empty item"),
    ("torch=sh,", "empty item"),
])
def test_malformed_entries_are_one_line_errors(tmp_path, entry, needle):
    plain = tmp_path / "plain.txt"
    plain.write_text("no interpreter")
    plain.chmod(0o644)
    entry = entry.format(plain=plain)
    with pytest.raises(InterpreterError, match=needle):
        parse_overrides([entry], {})
    with pytest.raises(InterpreterError, match=f"{PYTHON_VARIABLE}.*{needle}"):
        parse_overrides(None, {PYTHON_VARIABLE: entry})


def test_every_framework_says_what_its_interpreter_must_import():
    for info in FRAMEWORKS.values():
        modules = probe_modules(info)
        assert info.imports and modules[:len(info.imports)] == list(info.imports), info.name
        if info.backend_env:  # the backend imports the framework, the worker runs elsewhere
            assert "adapters.worker" not in modules
        else:
            assert {"numpy", "PIL", "adapters.worker", info.module} <= set(modules)


# --------------------------------------------------------------------------- the check

def test_the_torch_environment_passes_with_its_versions(torch_python):
    found = probe_interpreter(framework_info("torch"), torch_python)
    assert found["executable"] and found["python"].count(".") == 2
    assert {"torch", "numpy", "PIL"} <= set(found), found
    line = versions_line(found)
    assert line.startswith(f"Python {found['python']}") and f"torch {found['torch']}" in line


def test_a_python_without_the_framework_is_refused():
    python = python_without_torch()
    with pytest.raises(InterpreterError, match="cannot import torch .*No module named 'torch'"):
        probe_interpreter(framework_info("torch"), python)


def test_an_executable_that_is_no_python_is_refused(tmp_path):
    fake = executable_script(tmp_path / "python", "#!/bin/sh\necho 'not python' >&2\nexit 3\n")
    with pytest.raises(InterpreterError, match="not a Python interpreter that runs .*not python"):
        probe_interpreter(framework_info("torch"), fake)


def test_a_named_interpreter_stands_in_for_the_environment_which_is_not_built(tmp_path, monkeypatch,
                                                                                  torch_python):
    """With no requirement files at all any build would fail at once: the override is used
    as it is, and the ranks get the variable the worker records."""
    monkeypatch.setenv("DLCOMPARE_REQUIREMENTS", str(tmp_path))
    lines = []
    chosen = prepare_interpreters([(framework_info("torch"), "ddp")], {"torch": torch_python},
                                  log=lines.append)
    assert chosen.pythons == {"torch": torch_python} and chosen.overrides == {"torch": torch_python}
    assert chosen.rank_env(framework_info("torch")) == {"DLC_PYTHON_OVERRIDE": torch_python}
    assert len(lines) == 1 and lines[0].startswith(f"torch: {torch_python} (Python ")
    assert Interpreters().rank_env(framework_info("torch")) == {}


# --------------------------------------------------------------------------- the command lines

@pytest.mark.parametrize("module", ["launchers.compare", "launchers.calibrate", "launchers.check"])
def test_a_wrong_path_stops_every_command_before_anything_runs(tmp_path, module):
    extra = ["--model", "alexnet-tiny"] if module == "launchers.check" else ["--out", str(tmp_path / "c")]
    result = run_cli(module, *extra, "--python", "torch=/no/such/python", timeout=120)
    assert_one_line_error(result, "--python torch=/no/such/python: no such interpreter")
    assert not (tmp_path / "c").exists()


def test_a_python_without_the_framework_ends_the_campaign_in_one_line(tmp_path):
    python = python_without_torch()
    out = tmp_path / "campaign"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--workers", "1", "--out", str(out), env={PYTHON_VARIABLE: f"torch={python}"},
                     timeout=300)
    assert_one_line_error(result, f"--python torch={python}: cannot import torch")
    with sqlite3.connect(out / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_containers_take_their_images_interpreters(tmp_path, torch_python):
    result = run_cli("launchers.compare", "--runtime", "container", "--python", f"torch={torch_python}",
                     "--out", str(tmp_path / "c"), "--dry-run", timeout=120)
    assert_one_line_error(result, "--python names a local interpreter")


@pytest.mark.slow
def test_a_campaign_in_a_named_interpreter_records_it(tmp_path, torch_python):
    """A real run in the named interpreter: its record's environment says which one, and the
    report shows it."""
    out = tmp_path / "campaign"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--workers", "1", "--batch-size", "4", "--iterations", "2", "--repeats", "2",
                     "--warmup", "1", "--profile-iterations", "1", "--out", str(out),
                     "--python", f"torch={torch_python}", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"torch: {torch_python} (Python " in result.stderr
    with sqlite3.connect(out / "results.sqlite") as db:
        env = json.loads(db.execute("SELECT env_json FROM runs").fetchone()[0])
    assert env["python_override"] == torch_python and env["python_executable"]
    assert torch_python in (out / "report.html").read_text()
