"""The `dlcompare` command: installed by `pip install -e .` into a fresh virtualenv, its
subcommands, campaign files, and what `--dry-run` says a campaign costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from core import schemes as catalogue
from launchers import compare, dryrun
from launchers import plan as planning
from models import model_facts
from tests.conftest import REPO_ROOT, run_cli

EXAMPLE = REPO_ROOT / "examples" / "campaign.yaml"


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlcompare: error: "), result.stderr
    return lines[0]


@pytest.mark.slow  # a virtualenv, pip and the launcher's own environment
def test_pip_install_e_gives_a_dlcompare_command_that_dry_runs_the_example(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # a fresh interpreter, not the test's: the bootstrap into the launcher's environment is real
    env = {k: v for k, v in os.environ.items()
           if k not in ("DLCOMPARE_HOST_ENV", "DLCOMPARE_NO_BOOTSTRAP", "PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-e", str(REPO_ROOT)], env=env,
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    dlcompare = str(venv / "bin" / "dlcompare")
    result = subprocess.run([dlcompare, "run", "--dry-run", "examples/campaign.yaml", "--out", str(tmp_path / "c")],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Plan: 12 runs in 2 rounds" in result.stderr and "Estimated duration: 12 runs to run" in result.stderr
    assert not (tmp_path / "c").exists()  # a dry run stores nothing
    helped = subprocess.run([dlcompare, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and all(name in helped.stdout for name in ("run", "report", "predict"))
    one_error_line(subprocess.run([dlcompare, "bogus"], env=env, capture_output=True, text=True, timeout=60))


def test_every_subcommand_is_its_module():
    assert "googlenet-tiny" in run_cli("launchers.cli", "models", "list").stdout
    assert run_cli("launchers.cli", "run", "--help").stdout.startswith("usage: dlcompare run")
    for command in ("report", "summary"):
        assert "results.sqlite" in one_error_line(run_cli("launchers.cli", command, "/nonexistent/campaign"))
    assert "--from" in one_error_line(run_cli("launchers.cli", "predict", "--model", "alexnet"))
    assert "COMMAND" in one_error_line(run_cli("launchers.cli"))


def test_module_aliases_run_their_commands():
    """`python -m adapters.check` and `python -m launchers.envs` run the equivalence check and
    the environment builder, whose modules are `launchers.check` and `core.envs`."""
    checked = run_cli("adapters.check", "--frameworks", "nosuch", "--model", "alexnet-tiny")
    assert checked.returncode == 2 and checked.stderr.startswith("dlcompare: error: unknown framework 'nosuch'")
    assert run_cli("adapters.check", "--help").stdout.startswith("usage: python -m launchers.check")
    built = run_cli("launchers.envs", "--help")
    assert built.returncode == 0 and "install" in built.stdout


def test_environments_are_built_ahead_by_name_and_a_wrong_name_is_one_line():
    """`python -m core.envs build` (what .ci/run does first): a ready environment is reused."""
    built = run_cli("core.envs", "build", "host")
    assert built.returncode == 0 and built.stdout.startswith("host: ready in "), built.stderr
    wrong = run_cli("core.envs", "build", "host", "nosuch")
    assert wrong.returncode == 2 and wrong.stderr.startswith("dlcompare: error: no environment nosuch (known: ")
    # the Dockerfiles' form: the names after --venv DIR
    image_form = run_cli("core.envs", "install", "--venv", "/nonexistent/venv", "nosuch")
    assert image_form.returncode == 2, image_form.stderr
    assert image_form.stderr.startswith("dlcompare: error: no requirement file for environment 'nosuch'")


def test_campaign_file_keys_are_flags_and_lists_are_sweeps():
    parser = compare.build_parser()
    document = {"frameworks": ["torch", "tf:ps"], "workers": [1, 2], "batch_size": 16, "batch-size": 8,
                "calibrate": True, "no-dropout": False}
    assert compare.file_arguments(parser, "c.yaml", document) == [
        "--frameworks", "torch,tf:ps", "--workers", "1,2", "--batch-size", "16", "--batch-size", "8", "--calibrate"]
    for bad, said in (({"bogus": 1}, "unknown key 'bogus'"), ({"calibrate": "yes"}, "is a switch"),
                      ({"workers": {"a": 1}}, "needs a value"), ([1, 2], "expected keys and values")):
        with pytest.raises(compare.CampaignFileError, match=said):
            compare.file_arguments(parser, "c.yaml", bad)


def test_flags_on_the_command_line_override_the_file(tmp_path):
    result = run_cli("launchers.compare", str(EXAMPLE), "--dry-run", "--workers", "1,2,4", "--out", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Plan: 9 runs" in result.stderr  # three schemes x three worker counts
    assert "googlenet-tiny" in result.stderr  # the rest from the file


@pytest.mark.parametrize("text,said", [("bogus: 1\n", "unknown key 'bogus'"),
                                       ("iterations: many\n", "argument --iterations: invalid int value"),
                                       ("frameworks: [torch\n", "not valid YAML")])
def test_a_bad_campaign_file_is_one_line_naming_it(tmp_path, text, said):
    path = tmp_path / "campaign.yaml"
    path.write_text(text)
    line = one_error_line(run_cli("launchers.compare", str(path), "--dry-run"))
    assert str(path) in line and said in line


def test_a_missing_campaign_file_is_one_line():
    assert "does not exist" in one_error_line(run_cli("launchers.compare", "/nonexistent.yaml"))


def campaign_of(**settings) -> planning.Campaign:
    defaults = dict(frameworks=planning.parse_frameworks("torch,cntk-style"), models=["alexnet-tiny"],
                    workers=[1, 2], nodes=[1], servers=[1], batch_sizes=[16], iterations=10, warmup=3, repeats=3,
                    profile_iterations=3, data="synthetic", device="cpu", out=Path("/tmp/unused"), timeout=60,
                    channels_last=False, dropout=True, seed=0, loader_workers=0, cpus=2, launches=1)
    return planning.Campaign(**{**defaults, **settings})


def test_dry_run_names_environments_to_build_with_their_measured_time(tmp_path, monkeypatch):
    monkeypatch.setenv("DLCOMPARE_HOME", str(tmp_path))  # nothing built there
    rows = dryrun.environment_rows(campaign_of())
    assert rows == [("torch", "missing: built first", dryrun.ENV_BUILD_S["torch"])]


def test_duration_from_the_measured_defaults_by_hand():
    run = planning.expand(campaign_of())[1]  # torch, 1 node x 2 workers: 1 thread each
    assert (run.workers_per_node, run.threads_per_worker) == (2, 1)
    steps = 3 + 2 * 5 + 10 * 3 + 3 * 3  # warm-up: fixed, then two windows of 5; timed; profile
    expected = (catalogue.FRAMEWORKS["torch"].startup_s
                + steps * model_facts("alexnet-tiny").step_s_per_sample * 16)
    assert dryrun.estimate_run(run, pd.DataFrame()) == (pytest.approx(expected), "defaults")
    gpu = planning.expand(campaign_of(device="gpu"))[0]
    assert dryrun.estimate_run(gpu, pd.DataFrame()) == (None, "unknown")


def test_duration_from_a_stored_run_of_the_same_configuration():
    run = planning.expand(campaign_of())[0]
    stored = pd.DataFrame([{"framework": "torch", "mode": "ddp", "model": "alexnet-tiny", "batch_per_worker": 16,
                            "nodes": 1, "workers_per_node": 1, "world_size": 1, "iter_time_median": 0.02,
                            "warmup": 1, "iterations": 5, "repeats": 2, "duration_s": 5.22, "status": "ok",
                            "threads_per_worker": 2}])
    seconds, source = dryrun.estimate_run(run, stored)
    # its start-up: 5.22 s - 11 steps x 20 ms = 5.0 s; then this run's 52 steps at 20 ms
    assert source == "stored" and seconds == pytest.approx(5.0 + 52 * 0.02)
    total, sources = dryrun.estimate(planning.expand(campaign_of()), stored)
    assert sources == {"stored": 4, "defaults": 0, "unknown": 0}  # the others scale its iteration time


# --------------------------------------------------------------------------- one flag vocabulary

def deprecation_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("dlcompare: warning: ")]


def test_run_takes_the_old_spellings_with_one_warning_each(tmp_path):
    """Said once each, though the command moves into the launcher's environment after reading
    its flags and reads them again there."""
    result = run_cli("launchers.compare", "--schemes", "torch", "--model", "alexnet-tiny", "--workers-per-node", "1",
                     "--batch=8", "--dry-run", "--out", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert deprecation_lines(result) == [
        "dlcompare: warning: --schemes is deprecated; use --frameworks",
        "dlcompare: warning: --workers-per-node is deprecated; use --workers",
        "dlcompare: warning: --batch is deprecated; use --batch-size"]
    assert "Plan: 1 runs" in result.stderr and "torch-ddp-alexnet-tiny-1x1-b8-" in result.stderr


def test_a_campaign_file_takes_the_old_keys_with_one_warning_each(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text("schemes: [torch, cntk-style]\nmodel: alexnet-tiny\nworkers_per_node: 1\nbatch: 8\n")
    result = run_cli("launchers.compare", str(path), "--dry-run", "--out", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert deprecation_lines(result) == [
        f"dlcompare: warning: {path}: key schemes is deprecated; use frameworks",
        f"dlcompare: warning: {path}: key workers_per_node is deprecated; use workers",
        f"dlcompare: warning: {path}: key batch is deprecated; use batch-size"]
    assert "Plan: 2 runs" in result.stderr and "cntk-style-allreduce-alexnet-tiny-1x1-b8-" in result.stderr


def test_predict_takes_the_old_spellings_with_one_warning_each():
    result = run_cli("analysis.predict", "--cluster", str(REPO_ROOT / "examples" / "cluster.toml"), "--schemes", "tf:ps",
                     "--workers-per-node", "2", "--batch", "16", "--ps", "2", "--nodes", "1,2", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line.split(":")[2].split()[0] for line in deprecation_lines(result)] == [
        "--cluster", "--schemes", "--workers-per-node", "--batch", "--ps"]
    assert "use --cluster-file" in result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["scheme"], r["nodes"], r["workers_per_node"]) for r in rows] == [("tf:ps", 1, 2), ("tf:ps", 2, 2)]


def test_calibrate_takes_the_old_spellings_with_one_warning_each(tmp_path):
    """The old flags reach the calibration's own checks (a single worker cannot time an
    all-reduce), after one warning each."""
    result = run_cli("launchers.calibrate", "--schemes", "cntk-style", "--workers-per-node", "1", "--ps", "2",
                     "--out", str(tmp_path / "c"))
    assert result.returncode == 2
    assert len(deprecation_lines(result)) == 3 and "use --servers" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "dlcompare: error: cntk-style:allreduce needs at least 2 workers to time an all-reduce")


def test_check_takes_the_old_spellings_with_one_warning_each():
    result = run_cli("launchers.check", "--schemes", "torch,tf", "--model", "alexnet-tiny", "--batch", "0")
    assert result.returncode == 2
    assert deprecation_lines(result) == ["dlcompare: warning: --schemes is deprecated; use --frameworks",
                                         "dlcompare: warning: --batch is deprecated; use --batch-size"]
    assert result.stderr.strip().splitlines()[-1] == "dlcompare: error: --batch-size must be at least 1, got 0"
