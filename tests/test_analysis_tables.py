"""Tables: speedup/efficiency against hand-computed cases, baselines, failures, writers."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from analysis import tables
from analysis.store import ResultStore
from tests.test_analysis_data import FAILED_ERROR, make_campaign, make_record, make_records


def frame_of(tmp_path, records) -> pd.DataFrame:
    with ResultStore.for_campaign(make_campaign(tmp_path / "c", records)) as store:
        return store.runs_frame()


@pytest.fixture
def frame(tmp_path):
    return frame_of(tmp_path, make_records())


def row(table, label, world_size):
    hit = table[(table["framework_label"] == label) & (table["world_size"] == world_size)]
    assert len(hit) == 1, hit
    return hit.iloc[0]


def test_speedup_and_efficiency_formulas_by_hand():
    # t(1) = 0.10 s, t(2) = 0.125 s: S = 2 * 0.10 / 0.125 = 1.6, E = 1.6 / 2 = 0.8
    assert tables.speedup(0.10, 0.125, 2) == pytest.approx(1.6)
    assert tables.efficiency(1.6, 2) == pytest.approx(0.8)
    # four workers as fast per iteration as one: perfect weak scaling
    assert tables.speedup(0.2, 0.2, 4) == pytest.approx(4.0)
    # strong scaling (fixed global batch): S = t(1) / t(N)
    assert tables.speedup(0.4, 0.125, 4, scaling="strong") == pytest.approx(3.2)
    assert math.isnan(tables.speedup(math.nan, 0.1, 2)) and math.isnan(tables.speedup(None, 0.1, 2))
    assert math.isnan(tables.efficiency(math.nan, 2))


def test_scaling_table_from_records(frame):
    scaling = tables.scaling_table(frame)
    assert row(scaling, "PyTorch DDP", 2)["speedup"] == pytest.approx(1.6)
    assert row(scaling, "PyTorch DDP", 2)["efficiency"] == pytest.approx(0.8)
    assert row(scaling, "MXNet dist_sync", 2)["speedup"] == pytest.approx(1.5)
    assert row(scaling, "MXNet dist_sync", 2)["efficiency"] == pytest.approx(0.75)
    assert row(scaling, "PyTorch DDP", 1)["speedup"] == pytest.approx(1.0)
    assert "TensorFlow PS" not in set(scaling["framework_label"])  # failed runs have no timing


def test_missing_baseline_gives_nan_never_an_invented_one(tmp_path):
    records = [r for r in make_records() if r["world_size"] != 1]
    scaling = tables.scaling_table(frame_of(tmp_path, records))
    assert scaling["speedup"].isna().all() and scaling["efficiency"].isna().all()
    assert scaling["baseline_mode"].isna().all()


def test_baseline_needs_the_same_per_worker_batch(tmp_path):
    one = make_record("PyTorch DDP", "torch", "ddp", 1, 0.10)
    two = make_record("PyTorch DDP", "torch", "ddp", 2, 0.20, run_id="big", batch_per_worker=32, global_batch=64)
    scaling = tables.scaling_table(frame_of(tmp_path, [one, two]))
    assert math.isnan(row(scaling, "PyTorch DDP", 2)["speedup"])


def test_baseline_falls_back_to_the_frameworks_single_mode(tmp_path):
    single = make_record("TensorFlow", "tf", "single", 1, 0.10)
    ps = make_record("TensorFlow PS", "tf", "ps", 2, 0.125)
    other = make_record("PyTorch DDP", "torch", "ddp", 1, 0.05)  # another framework: never a baseline
    scaling = tables.scaling_table(frame_of(tmp_path, [single, ps, other]))
    got = row(scaling, "TensorFlow PS", 2)
    assert got["baseline_mode"] == "single" and got["speedup"] == pytest.approx(1.6)


def test_repeated_runs_are_summarised_by_their_median(tmp_path):
    runs = [make_record("PyTorch DDP", "torch", "ddp", 1, t, run_id=f"r{i}") for i, t in enumerate((0.1, 0.3, 0.2))]
    table = tables.throughput_table(frame_of(tmp_path, runs))
    assert len(table) == 1 and table.iloc[0]["runs"] == 3
    assert table.iloc[0]["iter_ms_median"] == pytest.approx(200.0)


def test_throughput_table_columns_and_values(frame):
    table = tables.throughput_table(frame)
    assert list(table.columns) == tables.THROUGHPUT_COLUMNS
    assert len(table) == 4  # the failed run is not there
    got = row(table, "PyTorch DDP", 2)
    assert got["images_per_s"] == pytest.approx(32 / 0.125)
    assert got["iter_ms_median"] == pytest.approx(125.0)
    assert got["iter_ms_p10"] < got["iter_ms_median"] < got["iter_ms_p90"]
    assert got["spread_pct"] == pytest.approx((1.08 - 0.95) * 100)


def test_throughput_is_derived_when_the_worker_did_not_report_it(tmp_path):
    record = make_record("L", "fw", "m", 2, 0.5, throughput=None, throughput_per_worker=None)
    got = tables.throughput_table(frame_of(tmp_path, [record])).iloc[0]
    assert got["images_per_s"] == pytest.approx(32 / 0.5) and got["images_per_s_per_worker"] == pytest.approx(32)


def test_phase_table(frame):
    table = tables.phase_table(frame)
    for column in ("io_ms", "h2d_ms", "forward_ms", "backward_ms", "comm_ms", "update_ms", "overlap", "phase_sum_ms",
                   "profile_iter_ms", "iter_ms"):
        assert column in table.columns
    assert not [c for c in table.columns if c.endswith("_s")]  # one unit: milliseconds
    got = row(table, "PyTorch DDP", 2)
    assert got["comm_ms"] == pytest.approx(0.3 * 0.125 * 1e3)
    assert got["overlap"] == pytest.approx(0.5)
    assert got["comm_pred_ms"] == pytest.approx(1.1 * 0.3 * 0.125 * 1e3)
    assert got["iter_ms"] == pytest.approx(125.0) and got["profile_iter_ms"] == pytest.approx(125.0 * 1.05)


def test_failures_table_lists_error_last_line(frame):
    failures = tables.failures_table(frame)
    assert list(failures.columns) == tables.FAILURE_COLUMNS
    assert len(failures) == 1
    assert failures.iloc[0]["error_last_line"] == FAILED_ERROR.strip().splitlines()[-1]
    assert failures.iloc[0]["status"] == "failed"


def test_error_last_line():
    assert tables.error_last_line("a\nb\n\n  ") == "b"
    assert tables.error_last_line(None) == "" and tables.error_last_line("") == ""
    assert len(tables.error_last_line("x" * 500)) == 200


def test_empty_frame_gives_empty_tables_with_columns(frame):
    for name, table in tables.build_tables(frame.iloc[0:0]).items():
        assert table.empty and len(table.columns) > 3, name


def test_only_failed_runs(frame):
    built = tables.build_tables(frame[frame["status"] != "ok"])
    assert built["throughput"].empty and built["scaling"].empty and len(built["failures"]) == 1


def test_write_tables_markdown_and_csv(frame, tmp_path):
    written = tables.write_tables(frame, tmp_path / "out")
    assert set(written) == set(tables.TABLE_NAMES)
    for name, paths in written.items():
        assert paths.markdown == tmp_path / "out" / "tables" / f"{name}.md" and paths.markdown.is_file()
        assert paths.csv.suffix == ".csv" and paths.csv.is_file()
        assert paths.markdown.read_text().startswith(f"# {tables.TABLE_TITLES[name]}")
    csv = pd.read_csv(written["scaling"].csv)
    assert list(csv.columns) == tables.SCALING_COLUMNS
    assert list(pd.read_csv(written["throughput"].csv).columns) == tables.THROUGHPUT_COLUMNS
    assert {"io_ms", "comm_ms", "overlap"} <= set(pd.read_csv(written["phases"].csv).columns)
    md = written["scaling"].markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert "speedup" in header and "efficiency" in header and "1.600" in md


def test_analysis_imports_no_ml_framework():
    """The analysis runs in the launcher's environment, which has no framework installed."""
    code = ("import sys, analysis.store, analysis.tables, analysis.figures, analysis.report, analysis.summary, "
            "analysis.perfmodel, analysis.calibration, analysis.predict; "
            "bad = {'torch', 'tensorflow', 'mxnet', 'cntk', 'horovod', 'jax', 'mpi4py'} & set(sys.modules); "
            "print(sorted(bad)); sys.exit(1 if bad else 0)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
