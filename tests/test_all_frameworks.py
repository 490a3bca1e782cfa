"""Every framework of the registry in one campaign, as the study compared them: one report.

The end-to-end promise: `compare --frameworks torch,tf,mxnet,cntk,cntk-style,
caffe-mpi-style,horovod,jax --model googlenet-tiny --workers 1,2` (every registered framework)
gives one report with every framework that can run here side by side, every 2-worker record
measuring every phase and describing its scheme as the catalogue does, every run's trace
holding each of its ranks, and a clear line for
any that cannot (real CNTK needs a Python 3.6 interpreter, which a machine may lack).
"""

from __future__ import annotations

import pytest

from adapters.registry import FRAMEWORKS
from analysis.record import PHASES
from core import schemes as catalogue
from tests.conftest import assert_described_as_the_catalogue, run_cli, worker_processes
from tests.test_trace import assert_traced

MODEL = "googlenet-tiny"
ALL = tuple(FRAMEWORKS)  # a framework joins the campaign by being registered
FAST = ["--iterations", "2", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1",
        "--batch-size", "4"]


def assert_measures_its_phases_and_describes_its_scheme(record: dict) -> None:
    """A 2-worker record: every phase of the iteration measured, and the scheme it ran
    described as the catalogue describes the framework's default mode."""
    name = record["framework"]
    phases = {p["phase"]: p["measured_s"] for p in record["phases"]}
    assert set(phases) >= set(PHASES), f"{name}: phases {sorted(phases)}"
    assert phases["forward"] > 0 and phases["backward"] > 0, f"{name}: {phases}"
    assert_described_as_the_catalogue(record["extra"]["comm_scheme"], catalogue.scheme(name, record["mode"]))


@pytest.mark.slow
def test_every_framework_in_one_campaign_gives_one_report(tmp_path):
    out = tmp_path / "all"
    result = run_cli("launchers.compare", "--frameworks", ",".join(ALL), "--model",
                     MODEL, "--workers", "1,2", "--out", str(out), *FAST,
                     env={"COLUMNS": "200"}, timeout=2400)
    output = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
    assert result.returncode == 0, output[-4000:]
    from analysis.store import ResultStore

    records = ResultStore.for_campaign(out, create=False).records()
    by_run = {(r["framework"], r["world_size"]): r for r in records}
    assert set(by_run) == {(name, n) for name in ALL for n in (1, 2)}
    unavailable = {r["framework"] for r in records if r.get("extra", {}).get("unavailable")}
    for name in unavailable:  # a clear line saying why, in the output and in the record
        assert f"{name}: cannot run on this machine" in output \
            or "unavailable" in by_run[(name, 1)]["error"], output[-2000:]
    for (name, n), record in sorted(by_run.items()):
        if name not in unavailable:
            assert record["status"] == "ok", f"{name} x{n}: {record['error']}"
            assert record["throughput"] > 0
            assert_traced(out, record)
            if n == 2:
                assert_measures_its_phases_and_describes_its_scheme(record)
        print(f"{name:16s} x{n} {record['status']:7s} "
              f"{(record['iter_time_median'] or 0) * 1e3:8.1f} ms  overlap "
              f"{record.get('overlap')}")
    assert unavailable <= {"cntk"}, f"only real CNTK may be missing here, not {unavailable}"
    assert all(record["synchronous"] == 1 for record in records)  # every default mode is
    assert {n: by_run[("mxnet", n)]["servers"] for n in (1, 2)} == {1: 1, 2: 1}  # ps-lite's server
    assert {by_run[(name, 2)]["servers"] for name in ALL if name not in ("mxnet", *unavailable)} == {0}
    assert worker_processes(str(out)) == []
    report = (out / "report.html").read_text()
    labels = {FRAMEWORKS[name].label for name in ALL}
    assert all(label in report for label in labels), labels - {l for l in labels if l in report}
    ran = {FRAMEWORKS[name].label for name in ALL if name not in unavailable}
    assert all(label in output for label in ran), ran - {l for l in ran if l in output}  # the summary
    for name in ("study_single", f"study_scaling_{MODEL}"):
        table = (out / "tables" / f"{name}.md").read_text()
        assert all(FRAMEWORKS[f].label in table for f in ALL if f not in unavailable), table
