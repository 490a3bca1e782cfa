"""ResultStore: round trip, resume queries, validation, reopening, concurrency, errors."""

from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest

from analysis.record import PHASES, RUN_COLUMNS, empty_record
from analysis.store import STORE_FILENAME, ResultStore, StoreError
from tests.test_analysis_data import make_failed_record, make_record, make_records


@pytest.fixture
def store(tmp_path):
    with ResultStore.for_campaign(tmp_path / "campaign") as s:
        yield s


def test_round_trip_returns_the_record_as_added(store):
    for record in make_records():
        store.add(record)
    for record in make_records():
        assert store.get(record["run_id"]) == record


def test_has_and_run_ids_answer_the_resume_questions(store):
    records = make_records()
    for record in records:
        store.add(record)
    ok = {r["run_id"] for r in records if r["status"] == "ok"}
    assert store.has(records[0]["run_id"]) and not store.has("never-ran")
    assert store.run_ids() == {r["run_id"] for r in records}
    assert store.run_ids(status="ok") == ok
    assert store.run_ids(status="failed") == {make_failed_record()["run_id"]}
    assert store.run_ids(status="timeout") == set()
    assert len(store) == len(records)


def test_reopening_keeps_rows_and_meta(tmp_path):
    out = tmp_path / "campaign"
    with ResultStore.for_campaign(out) as first:
        for record in make_records():
            first.add(record)
        first.set_meta("command", ["python", "-m", "launchers.compare"])
    with ResultStore.for_campaign(out) as again:  # opening an existing store never truncates it
        assert len(again) == len(make_records())
        assert again.meta() == {"command": ["python", "-m", "launchers.compare"]}
    with ResultStore(out / STORE_FILENAME, create=False) as reader:
        assert reader.run_ids() == {r["run_id"] for r in make_records()}


def test_add_replaces_a_run_and_its_phases(store):
    record = make_records()[0]
    store.add(record)
    record = dict(record, iter_time_median=0.2, phases=record["phases"][:2])
    store.add(record)
    assert len(store) == 1
    assert store.get(record["run_id"])["iter_time_median"] == 0.2
    assert len(store.phases_frame()) == 2


def test_delete_forgets_run_and_phases(store):
    record = make_records()[0]
    store.add(record)
    store.delete(record["run_id"])
    store.delete("not-there")
    assert not store.has(record["run_id"]) and store.phases_frame().empty


@pytest.mark.parametrize("change, message", [
    ({"run_id": None}, "run_id"),
    ({"framework": ""}, "framework"),
    ({"status": None}, "status"),
    ({"status": "done"}, "status"),
    ({"iter_time_medain": 0.1}, "iter_time_medain"),  # a typo must not vanish silently
    ({"throughput": "fast"}, "throughput"),
    ({"world_size": 1.5}, "world_size"),
    ({"env": ["python"]}, "env"),
    ({"phases": [{"phase": "io", "measured_s": 0.1}, {"phase": "io", "measured_s": 0.2}]}, "twice"),
    ({"phases": [{"phase": "io", "measured": 0.1}]}, "measured"),
])
def test_bad_records_are_rejected_and_leave_the_store_unchanged(store, change, message):
    record = dict(make_records()[0], **change)
    with pytest.raises(ValueError, match=message):
        store.add(record)
    assert len(store) == 0


def test_numpy_scalars_and_integral_floats_are_accepted(store):
    record = make_records()[0]
    record.update(world_size=np.int64(1), iter_time_median=np.float32(0.1), nodes=1.0, synchronous=True)
    store.add(record)
    back = store.get(record["run_id"])
    assert back["world_size"] == 1 and back["nodes"] == 1 and back["synchronous"] == 1
    assert back["iter_time_median"] == pytest.approx(0.1)


def test_minimal_record_is_enough(store):
    store.add(empty_record(run_id="r1", framework="fw", model="m", status="timeout", error="killed"))
    assert store.get("r1")["error"] == "killed" and store.get("r1")["phases"] == []


def test_runs_frame_flattens_env_and_widens_phases(store):
    for record in make_records():
        store.add(record)
    frame = store.runs_frame()
    assert len(frame) == 5
    assert set(RUN_COLUMNS) <= set(frame.columns)
    assert {"env_python", "env_cpu", "env_torch", "extra_threads", "extra_backend_bucket_mb"} <= set(frame.columns)
    assert all(f"phase_{p}_s" in frame.columns and f"phase_{p}_pred_s" in frame.columns for p in PHASES)
    assert str(frame["world_size"].dtype) == "Int64"
    row = frame.set_index("run_id").loc["torch-ddp-alexnet-w2-b16"]
    assert row["phase_comm_s"] == pytest.approx(0.3 * 0.125)


def test_empty_store_frames_have_columns(store):
    frame = store.runs_frame()
    assert frame.empty and "framework_label" in frame.columns and "phase_comm_s" in frame.columns
    assert store.phases_frame().empty and "world_size" in store.phases_frame().columns


def test_phases_frame_is_long_and_joined(store):
    for record in make_records():
        store.add(record)
    phases = store.phases_frame()
    assert len(phases) == 4 * len(PHASES)  # the failed run measured no phase
    assert {"framework_label", "model", "world_size", "measured_s", "predicted_s", "phase_order"} <= set(phases.columns)
    first = phases[phases["run_id"] == "torch-ddp-alexnet-w1-b16"]
    assert list(first["phase"]) == list(PHASES)


def test_concurrent_writers_lose_nothing(tmp_path):
    """Two connections (as two launcher processes would) appending at once."""
    out = tmp_path / "campaign"
    ResultStore.for_campaign(out).close()

    def write(prefix):
        with ResultStore.for_campaign(out) as s:
            for i in range(15):
                s.add(make_record("L", "fw", prefix, 1, 0.1, run_id=f"{prefix}-{i}"))

    threads = [threading.Thread(target=write, args=(p,)) for p in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with ResultStore.for_campaign(out) as s:
        assert len(s) == 30
        assert s._query("PRAGMA journal_mode")[0][0] == "wal"


def test_old_store_gains_new_columns(tmp_path):
    """A store written before the record contract grew still opens; old rows get NULLs."""
    path = tmp_path / STORE_FILENAME
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, framework TEXT, model TEXT, status TEXT)")
    con.execute("INSERT INTO runs VALUES ('old', 'fw', 'm', 'ok')")
    con.commit()
    con.close()
    with ResultStore(path) as s:
        assert s.get("old")["throughput"] is None and s.get("old")["status"] == "ok"
        s.add(make_records()[0])
        assert len(s) == 2


def test_unwritable_path_raises_store_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for attempt in (lambda: ResultStore(blocker / STORE_FILENAME),
                    lambda: ResultStore.for_campaign(blocker / "campaign"),
                    lambda: ResultStore(tmp_path),  # a folder, not a file
                    lambda: ResultStore(tmp_path / "missing" / STORE_FILENAME, create=False)):
        with pytest.raises(StoreError) as info:
            attempt()
        assert "\n" not in str(info.value) and str(info.value)


def test_garbage_file_raises_store_error(tmp_path):
    path = tmp_path / STORE_FILENAME
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        ResultStore(path)


def test_get_unknown_run_raises_key_error(store):
    with pytest.raises(KeyError):
        store.get("nope")
