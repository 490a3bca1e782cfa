"""bench/gpu_study.py: the GPU study in its tiny CPU mode (the same campaigns, tables and
archive as on a GPU, what only a GPU has marked as such), and the wheels it brings the
launcher's packages with on a node that lacks them (launchers/wheels.py)."""

from __future__ import annotations

import csv
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from analysis.gpu_study_tables import TABLES
from launchers.wheels import unpack_missing, wheel_for, wrapper
from models import get_model
from tests.conftest import run_cli
from tests.test_bad_input import assert_one_line_error


def rows(folder: Path, name: str) -> list[dict]:
    with open(folder / "gpu_study" / f"{name}.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def number(value: str) -> float:
    return float(value) if value not in ("", None) else float("nan")


def test_a_wheel_is_unpacked_where_the_interpreter_and_its_ranks_find_it(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "dlc_probe_pkg-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("dlc_probe_pkg/__init__.py", "VERSION = '1.0'\n")
    assert wheel_for(wheels, "dlc-probe-pkg").name.startswith("dlc_probe_pkg-1.0")
    assert unpack_missing(["dlc_probe_pkg", "absent_pkg"], wheels, site) == ["absent_pkg"]
    python = wrapper(sys.executable, site)
    result = subprocess.run([python, "-c", "import dlc_probe_pkg; print(dlc_probe_pkg.VERSION)"],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert result.stdout.strip() == "1.0", result.stderr


@pytest.mark.parametrize("arguments, needle", [
    (["--sections", "phases,warp"], "--sections: unknown warp"),
    (["--deadline", "10"], "--deadline must be above"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, arguments, needle):
    result = run_cli("bench.gpu_study", "--tiny", "--out", str(tmp_path / "s"), *arguments, timeout=60)
    assert_one_line_error(result, needle)


@pytest.mark.slow
def test_the_tiny_study_writes_every_table_and_the_archive(tmp_path, torch_python):
    """Every section on tiny models on the CPU, through the real launchers with --python:
    measured rows have sane numbers, GPU-only variants say they were skipped on CPU, the
    2-rank calibration found its contention shares, and the export holds what a device
    machine's $OUT brings back."""
    from core.envs import ensure_environment

    jax_python = str(ensure_environment("jax", log=print).python)
    out, export = tmp_path / "study", tmp_path / "export"
    result = run_cli("bench.gpu_study", "--tiny", "--out", str(out), "--python", torch_python,
                     "--jax-python", jax_python, "--export", str(export), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in TABLES:
        assert (out / "gpu_study" / f"{name}.md").exists() and (out / "gpu_study" / f"{name}.csv").exists()
    assert (out / "results.sqlite").exists() and (out / "report.html").exists()

    phases = {row["framework"]: row for row in rows(out, "gpu_phases")}
    assert set(phases) == {"PyTorch DDP", "JAX"}
    for row in phases.values():
        assert row["status"] == "measured", row
        assert number(row["iteration_ms"]) > 0 and number(row["images_per_s"]) > 0
        assert min(number(row[f"{p}_ms"]) for p in ("io", "h2d", "forward", "backward", "update")) >= 0
        assert number(row["forward_ms"]) > 0 and number(row["backward_ms"]) > 0

    layouts = rows(out, "cudnn_layout")
    assert [(r["layout"], r["status"]) for r in layouts] == [
        ("NCHW", "measured"), ("NCHW", "skipped on CPU"), ("NHWC", "measured"), ("NHWC", "skipped on CPU")]
    assert number(layouts[2]["backward_ms"]) > 0 and number(layouts[2]["speedup"]) > 0

    (h2d,) = rows(out, "h2d")
    assert h2d["pinned_status"] == h2d["pageable_status"] == "n/a on CPU: no copy"
    channels, height, width = get_model("alexnet-tiny").input_shape
    assert number(h2d["batch_MB"]) == pytest.approx(4 * (channels * height * width * 4 + 8) / 1e6, abs=0.05)

    precision = {row["precision"]: row for row in rows(out, "precision")}
    assert precision["tf32"]["status"] == "skipped on CPU"
    assert precision["bfloat16"]["status"] == "measured" and number(precision["bfloat16"]["speedup"]) > 0

    (fit,) = rows(out, "contention")
    assert fit["status"] == "ok" and number(fit["alpha_us"]) > 0 and number(fit["bandwidth_GBps"]) > 0
    assert 0 <= number(fit["kappa"]) <= 1 and 0 <= number(fit["kappa_c"]) <= 1
    (overlap,) = rows(out, "overlap")
    assert overlap["status"] == "measured" and number(overlap["two_ranks_ms"]) > 0
    assert 0 <= number(overlap["overlap"]) <= 1 and number(overlap["comm_ms"]) > 0

    assert {path.name for path in export.iterdir()} == {"gpu_study.tar.gz", "gpu_study.md", "gpu_study.log"}
    with tarfile.open(export / "gpu_study.tar.gz") as archive:
        names = archive.getnames()
    assert "study/results.sqlite" in names and "study/gpu_study/precision.md" in names
    summary = (export / "gpu_study.md").read_text()
    assert "## Inventory" in summary and f"torch: {torch_python} (Python" in summary
    assert "deadline" not in (out / "gpu_study.md").read_text().split("## One GPU")[0]
