"""`dlcompare diff A B`: configurations matched across two campaigns, the change with its
interval over launches, the shared test (analysis.noise) that can say "within noise" and "too
few launches", mismatches listed, `--fail-above` as a CI gate, bad input in one line; and two
real campaigns compared."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from analysis import diff
from tests.conftest import REPO_ROOT, run_cli
from tests.test_analysis_data import make_campaign, make_record

SCHEMES = (("PyTorch DDP", "torch", "ddp"), ("MXNet", "mxnet", "dist_sync"))


def records(slower: dict[tuple[str, int], float] | None = None, launches: int = 4, seed: int = 0,
            worlds=(1, 2)) -> list[dict]:
    """Both schemes at 1 and 2 workers, `launches` launches each with 2 % noise between them;
    `slower` multiplies a (framework, world) configuration's times."""
    rng = np.random.default_rng(seed)
    found = []
    for label, framework, mode in SCHEMES:
        for world in worlds:
            t = 0.1 * world * (slower or {}).get((framework, world), 1.0)
            for launch, time in enumerate(t * (1 + 0.02 * rng.standard_normal(launches)), start=1):
                record = make_record(label, framework, mode, world, float(time),
                                     run_id=f"{framework}-{mode}-w{world}-l{launch}", config_hash=f"{framework}-{world}")
                record["extra"] = {**record["extra"], "launch": launch}
                found.append(record)
    return found


def diffed(tmp_path, a_records, b_records, *args):
    a, b = make_campaign(tmp_path / "a", a_records), make_campaign(tmp_path / "b", b_records)
    done = subprocess.run([sys.executable, "-m", "analysis.diff", str(a), str(b), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "160"})
    return done, b


def test_a_slower_configuration_is_beyond_noise_and_the_rest_within(tmp_path):
    done, b = diffed(tmp_path, records(seed=1), records({("torch", 2): 1.2}, seed=2), "--fail-above", "10")
    assert done.returncode == 1, done.stderr
    assert "regression: 1 configuration(s) slower by more than 10%: PyTorch DDP 1×2 b16 +" in done.stderr
    table = pd.read_csv(b / "diff" / "diff.csv")
    ddp = table[(table["scheme"] == "PyTorch DDP") & (table["topology"] == "1×2")].iloc[0]
    assert ddp["change_pct"] == pytest.approx(20, abs=3) and ddp["verdict"] == "beyond noise"
    assert ddp["change_low_pct"] < ddp["change_pct"] < ddp["change_high_pct"] and ddp["a_launches"] == 4
    rest = table.drop(ddp.name)
    assert (rest["change_pct"].abs() < 5).all() and set(rest["verdict"]) <= {"within noise", "beyond noise"}
    assert (b / "diff" / "diff.png").stat().st_size > 5_000 and "Environments" in (b / "diff" / "diff.md").read_text()


def test_a_campaign_against_its_own_records_is_within_noise_and_passes_the_gate(tmp_path):
    same = records(seed=3)
    done, b = diffed(tmp_path, same, same, "--fail-above", "1")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(b / "diff" / "diff.csv")
    assert len(table) == 4 and (table["verdict"] == "within noise").all() and (table["change_pct"] == 0).all()


def test_one_launch_each_is_too_few_to_tell(tmp_path):
    done, b = diffed(tmp_path, records(launches=1), records({("torch", 2): 1.3}, launches=1), "--fail-above", "10")
    assert done.returncode == 1, done.stderr  # too few to tell counts against the gate
    assert "too few launches" in done.stdout and "--launches 2 or more" in done.stdout
    assert pd.read_csv(b / "diff" / "diff.csv")["beyond_noise"].isna().all()


def test_configurations_only_one_campaign_has_are_listed(tmp_path):
    done, _ = diffed(tmp_path, records(), records(worlds=(1,)))
    assert done.returncode == 0, done.stderr
    assert "only in A (2): MXNet (dist_sync) · alexnet · 1×2 · b16, PyTorch DDP · alexnet · 1×2 · b16" in done.stdout


@pytest.mark.parametrize("case, words", [("disjoint", "no configuration in common"),
                                         ("no-store", "no result store")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, words):
    a = make_campaign(tmp_path / "a", records(worlds=(1,)))
    b = make_campaign(tmp_path / "b", records(worlds=(2,))) if case == "disjoint" else tmp_path / "empty"
    b.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "analysis.diff", str(a), str(b)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert words in done.stderr, done.stderr
    assert not (b / "diff").exists()


@pytest.mark.slow  # two real campaigns
def test_two_real_campaigns_are_compared(tmp_path, torch_python):
    common = ("--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "1,2", "--iterations", "5",
              "--repeats", "2", "--warmup", "2", "--profile-iterations", "1", "--launches", "2")
    for name in ("a", "b"):
        done = run_cli("launchers.compare", *common, "--out", str(tmp_path / name), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    done = run_cli("launchers.cli", "diff", str(tmp_path / "a"), str(tmp_path / "b"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = pd.read_csv(tmp_path / "b" / "diff" / "diff.csv").iloc[0]
    assert row["scheme"] == "PyTorch DDP" and row["a_launches"] == row["b_launches"] == 2
    assert row["verdict"] in ("within noise", "beyond noise") and abs(row["change_pct"]) < 100
    assert "torch" in done.stdout and "Environments" in done.stdout and 0 <= row["p_value"] <= 1
