"""The campaign's result store: one SQLite file per campaign folder.

Why SQLite: the launcher appends one record as each run finishes and must resume an
interrupted campaign by asking which runs are already stored; SQLite gives atomic
appends (a crash mid-write leaves the previous state), concurrent readers while a
campaign writes (WAL mode), and needs no server.  Tables:

- ``runs``: one row per run, the columns of `analysis.record.RUN_COLUMNS` with their
  declared types, plus ``env_json`` and ``extra_json`` (the record's free dicts as JSON);
- ``phases``: a long table (run_id, phase, measured_s, predicted_s), one row per phase
  of one run, in the order the record listed them;
- ``campaign_meta``: key/value facts about the whole campaign (command line, plan, ...),
  values stored as JSON so lists and dicts round-trip;
- ``calibration``: one row per calibrated transport and topology (`launchers.calibrate`):
  the fitted T(n) = a + b n and the link-level alpha, beta, gamma of
  `analysis.calibration.CalibrationFit`; a new calibration of the same framework, mode,
  device and topology replaces the old one;
- ``calibration_points``: its timings, one row per message size (kind ``collective``) or
  local reduction size (kind ``reduction``): median, p10, p90 and the raw values as JSON.

The performance model's predictions (`analysis.predict`) are written back onto stored runs
with `set_predictions`: the run's predicted columns, the phases' ``predicted_s`` and
``extra["prediction"]``.

Records are validated on the way in (identity fields present, no unknown keys, values of
the declared type) so that a typo in an adapter fails loudly at the first run instead of
leaving a silently empty column in the report.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from analysis.calibration import CalibrationFit, summarize
from analysis.record import PHASES, RUN_COLUMNS, RUN_FIELDS, STATUSES

STORE_FILENAME = "results.sqlite"

# Fields without which a record cannot be found again, grouped or reported.
REQUIRED_FIELDS: tuple[str, ...] = ("run_id", "framework", "model", "status")

# Top-level keys of a record besides the scalar run columns.
NESTED_KEYS: tuple[str, ...] = ("phases", "env", "extra")

PHASE_ENTRY_KEYS = frozenset({"phase", "measured_s", "predicted_s"})

# Columns of `runs` joined onto each phase row by `phases_frame`, for plotting.
PHASE_CONTEXT_COLUMNS: tuple[str, ...] = (
    "campaign", "framework", "framework_label", "mode", "synchronous", "model",
    "device_kind", "device_name", "nodes", "workers_per_node", "world_size",
    "batch_per_worker", "global_batch", "scaling", "status", "iter_time_median",
    "profile_iter_time", "overlap", "predicted_iter_time",
)

_COLUMN_TYPES: dict[str, str] = {name: sqltype for name, sqltype, _ in RUN_FIELDS}

_CALIBRATION_TYPES = {str: "TEXT", int: "INTEGER", float: "REAL"}
CALIBRATION_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (name, _CALIBRATION_TYPES[f.type if isinstance(f.type, type) else
                              {"str": str, "int": int, "float": float}[f.type]])
    for name, f in CalibrationFit.__dataclass_fields__.items())
CALIBRATION_COLUMNS: tuple[str, ...] = tuple(name for name, _ in CALIBRATION_FIELDS)
# A calibration of the same key replaces the previous one.
CALIBRATION_KEY: tuple[str, ...] = ("framework", "mode", "device_kind", "nodes", "workers_per_node", "servers",
                                     "bandwidth", "latency")


def calibration_key(row: Mapping[str, Any]) -> tuple:
    """A calibration's identity: its CALIBRATION_KEY values, a missing one as '' (the store
    compares them the same way when a new calibration replaces an old one)."""
    return tuple("" if row.get(name) is None else row[name] for name in CALIBRATION_KEY)


class StoreError(Exception):
    """The store cannot be opened or written; the message is one line, fit for a CLI."""


# --------------------------------------------------------------------------- validation

def _plain(value: Any) -> Any:
    """NumPy scalars -> Python scalars, so that sqlite3 can bind them."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes, dict, list, tuple)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


def _coerce(name: str, value: Any) -> Any:
    """Check `value` against the column's declared SQLite type; return what to bind.

    INTEGER accepts ints, bools and integral floats; REAL accepts ints and floats (NaN
    is stored as NULL, which SQLite would do anyway); TEXT accepts strings only.
    """
    value = _plain(value)
    if value is None:
        return None
    sqltype = _COLUMN_TYPES[name]
    if sqltype == "INTEGER":
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif sqltype == "REAL":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return None if math.isnan(value) else float(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"record field {name!r} must be {sqltype}, got {type(value).__name__} {value!r}")


def _check_keys(record: dict) -> None:
    """Reject records that lack identity fields or carry unknown top-level keys."""
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a dict, got {type(record).__name__}")
    unknown = sorted(set(record) - set(RUN_COLUMNS) - set(NESTED_KEYS))
    if unknown:
        raise ValueError(f"unknown record field(s): {', '.join(unknown)}")
    missing = [name for name in REQUIRED_FIELDS if record.get(name) in (None, "")]
    if missing:
        raise ValueError(f"record lacks required field(s): {', '.join(missing)}")
    if record["status"] not in STATUSES:
        raise ValueError(f"record status must be one of {', '.join(STATUSES)}, got {record['status']!r}")


def _phase_rows(run_id: str, phases: Any) -> list[tuple]:
    """Validate the record's ``phases`` list and turn it into rows of the phases table."""
    if phases is None:
        return []
    if not isinstance(phases, (list, tuple)):
        raise ValueError(f"record field 'phases' must be a list, got {type(phases).__name__}")
    rows, seen = [], set()
    for entry in phases:
        if not isinstance(entry, dict) or "phase" not in entry:
            raise ValueError(f"each phase entry must be a dict with a 'phase' key, got {entry!r}")
        unknown = sorted(set(entry) - PHASE_ENTRY_KEYS)
        if unknown:
            raise ValueError(f"unknown phase entry field(s): {', '.join(unknown)}")
        name = entry["phase"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        if name in seen:
            raise ValueError(f"phase {name!r} listed twice")
        seen.add(name)
        rows.append((run_id, name, _real(name, entry.get("measured_s")), _real(name, entry.get("predicted_s"))))
    return rows


def _real(phase: str, value: Any) -> float | None:
    value = _plain(value)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if math.isnan(value) else float(value)
    raise ValueError(f"phase {phase!r} time must be a number, got {value!r}")


def _json_dict(name: str, value: Any) -> str:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"record field {name!r} must be a dict, got {type(value).__name__}")
    return json.dumps(value, sort_keys=True, default=str)


def flatten(prefix: str, value: dict) -> dict[str, Any]:
    """Nested dict -> flat ``prefix_key[_subkey]`` columns; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, item in value.items():
        column = f"{prefix}_{key}"
        if isinstance(item, dict):
            flat.update(flatten(column, item))
        elif isinstance(item, (list, tuple)):
            flat[column] = json.dumps(item, default=str)
        else:
            flat[column] = item
    return flat


# --------------------------------------------------------------------------- the store

class ResultStore:
    """One campaign's records in SQLite.

    ``ResultStore(path)`` opens (creating if needed) the file at `path`; its folder must
    exist.  ``create=False`` refuses to create a store (for readers such as the report).
    Opening an existing store never truncates it; a store written by an older record
    contract gains the new columns (NULL for old rows).
    """

    def __init__(self, path: str | Path, create: bool = True):
        self.path = Path(path)
        self._lock = threading.Lock()
        if not create and not self.path.is_file():
            raise StoreError(f"no result store at {self.path}")
        if self.path.is_dir():
            raise StoreError(f"cannot open result store {self.path}: it is a directory")
        if not self.path.parent.is_dir():
            raise StoreError(f"cannot open result store {self.path}: {self.path.parent} is not an existing folder")
        self._conn = None
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None,
                                         check_same_thread=False)
            self._conn.row_factory = sqlite3.Row
            self._init_schema(writable_check=create)
        except sqlite3.Error as exc:
            if self._conn is not None:
                self._conn.close()
            raise StoreError(f"cannot open result store {self.path}: {exc}") from None

    @classmethod
    def for_campaign(cls, out_dir: str | Path, create: bool = True) -> "ResultStore":
        """The store of the campaign folder `out_dir` (created with its folder if needed)."""
        out_dir = Path(out_dir)
        if create:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create campaign folder {out_dir}: {exc.strerror or exc}") from None
        return cls(out_dir / STORE_FILENAME, create=create)

    # -- schema ---------------------------------------------------------------------------

    def _init_schema(self, writable_check: bool) -> None:
        """Create missing tables/columns; write only when something is missing.

        WAL lets the report read while a campaign appends; ``busy_timeout`` (via the
        connect timeout) makes concurrent writers wait instead of failing.
        """
        if writable_check or not self._schema_complete():
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("BEGIN IMMEDIATE")  # fails early when the file is not writable
            try:
                self._create_tables()
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _existing_columns(self, table: str) -> list[str]:
        return [row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")]

    def _schema_complete(self) -> bool:
        runs = set(self._existing_columns("runs"))
        return (runs >= set(RUN_COLUMNS) | {"env_json", "extra_json"}
                and bool(self._existing_columns("phases"))
                and bool(self._existing_columns("campaign_meta"))
                and set(self._existing_columns("calibration")) >= set(CALIBRATION_COLUMNS)
                and bool(self._existing_columns("calibration_points")))

    def _create_tables(self) -> None:
        columns = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in RUN_FIELDS)
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS runs ({columns}, env_json TEXT, extra_json TEXT, "
            "PRIMARY KEY (run_id))")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS phases (run_id TEXT NOT NULL, phase TEXT NOT NULL, "
            "measured_s REAL, predicted_s REAL, PRIMARY KEY (run_id, phase))")
        self._conn.execute("CREATE TABLE IF NOT EXISTS campaign_meta (key TEXT PRIMARY KEY, value TEXT)")
        calibration = ", ".join(f"{name} {sqltype}" for name, sqltype in CALIBRATION_FIELDS)
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS calibration (calibration_id INTEGER PRIMARY KEY AUTOINCREMENT, "
            f"{calibration}, measured_at TEXT, env_json TEXT, extra_json TEXT)")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS calibration_points (calibration_id INTEGER NOT NULL, kind TEXT NOT NULL, "
            "bytes INTEGER NOT NULL, median_s REAL, p10_s REAL, p90_s REAL, repeats INTEGER, values_json TEXT, "
            "PRIMARY KEY (calibration_id, kind, bytes))")
        existing = set(self._existing_columns("runs"))
        for name, sqltype, _ in RUN_FIELDS:
            if name not in existing:  # the record contract grew since this store was made
                self._conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {sqltype}")
        for name in ("env_json", "extra_json"):
            if name not in existing:
                self._conn.execute(f"ALTER TABLE runs ADD COLUMN {name} TEXT")
        existing = set(self._existing_columns("calibration"))
        for name, sqltype in CALIBRATION_FIELDS:
            if name not in existing:  # calibrations grew the emulated links they ran on
                self._conn.execute(f"ALTER TABLE calibration ADD COLUMN {name} {sqltype}")

    # -- writing --------------------------------------------------------------------------

    def _transaction(self, statements: Iterable[tuple[str, tuple]]) -> None:
        """Run statements in one IMMEDIATE transaction: all land, or none."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for sql, params in statements:
                        self._conn.execute(sql, params)
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write result store {self.path}: {exc}") from None

    def add(self, record: dict) -> None:
        """Insert or replace one run and its phase rows, atomically.

        Raises ValueError for a record without run_id/framework/model/status, with an
        unknown top-level key, or with a value of the wrong type.
        """
        _check_keys(record)
        values = [_coerce(name, record.get(name)) for name in RUN_COLUMNS]
        env = _json_dict("env", record.get("env"))
        extra = _json_dict("extra", record.get("extra"))
        run_id = values[0]
        phase_rows = _phase_rows(run_id, record.get("phases"))
        names = ", ".join(RUN_COLUMNS + ("env_json", "extra_json"))
        marks = ", ".join("?" * (len(RUN_COLUMNS) + 2))
        statements = [(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", (*values, env, extra)),
                      ("DELETE FROM phases WHERE run_id = ?", (run_id,))]
        statements += [("INSERT INTO phases (run_id, phase, measured_s, predicted_s) VALUES (?, ?, ?, ?)", row)
                       for row in phase_rows]
        self._transaction(statements)

    def delete(self, run_id: str) -> None:
        """Forget one run (e.g. to redo it); a missing run_id is not an error."""
        self._transaction([("DELETE FROM phases WHERE run_id = ?", (run_id,)),
                           ("DELETE FROM runs WHERE run_id = ?", (run_id,))])

    def set_meta(self, key: str, value: Any) -> None:
        """Record a campaign-level fact; `value` must be JSON-serialisable."""
        self._transaction([("INSERT OR REPLACE INTO campaign_meta (key, value) VALUES (?, ?)",
                            (key, json.dumps(value, default=str)))])

    def add_calibration(self, fit: CalibrationFit, points: dict, reduction_points: dict | None = None,
                        measured_at: str | None = None, env: dict | None = None,
                        extra: dict | None = None) -> int:
        """Store one fitted calibration with its timings ({bytes: [seconds, ...]}); a stored
        calibration with the same framework, mode, device and topology is replaced.  Returns
        the new calibration_id."""
        row = fit.as_row()
        names = ", ".join(CALIBRATION_COLUMNS + ("measured_at", "env_json", "extra_json"))
        marks = ", ".join("?" * (len(CALIBRATION_COLUMNS) + 3))
        key = " AND ".join(f"IFNULL({k}, '') = ?" for k in CALIBRATION_KEY)
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    old = [r[0] for r in self._conn.execute(
                        f"SELECT calibration_id FROM calibration WHERE {key}", calibration_key(row))]
                    for calibration_id in old:
                        self._conn.execute("DELETE FROM calibration_points WHERE calibration_id = ?", (calibration_id,))
                        self._conn.execute("DELETE FROM calibration WHERE calibration_id = ?", (calibration_id,))
                    cursor = self._conn.execute(
                        f"INSERT INTO calibration ({names}) VALUES ({marks})",
                        (*[_plain(row[k]) for k in CALIBRATION_COLUMNS], measured_at,
                         json.dumps(env or {}, sort_keys=True, default=str),
                         json.dumps(extra or {}, sort_keys=True, default=str)))
                    calibration_id = cursor.lastrowid
                    for kind, data in (("collective", points), ("reduction", reduction_points or {})):
                        for item in summarize(data):
                            values = [float(v) for v in data.get(item.nbytes, data.get(str(item.nbytes), []))]
                            self._conn.execute(
                                "INSERT INTO calibration_points (calibration_id, kind, bytes, median_s, p10_s, "
                                "p90_s, repeats, values_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                (calibration_id, kind, item.nbytes, item.median, item.p10, item.p90,
                                 item.repeats, json.dumps(values)))
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write result store {self.path}: {exc}") from None
        return calibration_id

    def set_predictions(self, predictions: Iterable[dict]) -> None:
        """Write the performance model's predictions onto stored runs, in one transaction.

        Each item: ``run_id``, ``predicted_iter_time``, ``prediction_error``, ``phases``
        ({phase: predicted seconds}) and ``prediction`` (a dict kept as
        ``extra["prediction"]``; None removes it).  Runs not stored are skipped; a phase
        the run did not measure gets a row with only its prediction.
        """
        predictions = list(predictions)
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for item in predictions:
                        run_id = item["run_id"]
                        found = self._conn.execute("SELECT extra_json FROM runs WHERE run_id = ?", (run_id,)).fetchall()
                        if not found:
                            continue
                        extra = json.loads(found[0]["extra_json"] or "{}")
                        if item.get("prediction") is None:
                            extra.pop("prediction", None)
                        else:
                            extra["prediction"] = item["prediction"]
                        self._conn.execute(
                            "UPDATE runs SET predicted_iter_time = ?, prediction_error = ?, extra_json = ? "
                            "WHERE run_id = ?",
                            (_coerce("predicted_iter_time", item.get("predicted_iter_time")),
                             _coerce("prediction_error", item.get("prediction_error")),
                             json.dumps(extra, sort_keys=True, default=str), run_id))
                        phases = item.get("phases") or {}
                        self._conn.execute("UPDATE phases SET predicted_s = NULL WHERE run_id = ?", (run_id,))
                        for phase, value in phases.items():
                            value = _real(phase, value)
                            updated = self._conn.execute(
                                "UPDATE phases SET predicted_s = ? WHERE run_id = ? AND phase = ?",
                                (value, run_id, phase)).rowcount
                            if not updated:
                                self._conn.execute(
                                    "INSERT INTO phases (run_id, phase, measured_s, predicted_s) VALUES (?, ?, NULL, ?)",
                                    (run_id, phase, value))
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot write result store {self.path}: {exc}") from None

    # -- reading --------------------------------------------------------------------------

    def calibrations(self) -> list[dict]:
        """Every stored calibration: the `CalibrationFit` columns plus calibration_id,
        measured_at, env and extra (decoded)."""
        rows = self._query("SELECT * FROM calibration ORDER BY calibration_id")
        out = []
        for row in rows:
            item = {k: row[k] for k in ("calibration_id", *CALIBRATION_COLUMNS, "measured_at")}
            item["env"] = json.loads(row["env_json"] or "{}")
            item["extra"] = json.loads(row["extra_json"] or "{}")
            out.append(item)
        return out

    def calibration_fits(self) -> list[CalibrationFit]:
        """The stored calibrations as `CalibrationFit` values (what the model uses)."""
        return [CalibrationFit.from_row(row) for row in self.calibrations()]

    def calibration_points(self, calibration_id: int | None = None) -> list[dict]:
        """Stored timings (all, or one calibration's), sizes ascending, raw values decoded."""
        sql = "SELECT * FROM calibration_points"
        params: tuple = ()
        if calibration_id is not None:
            sql += " WHERE calibration_id = ?"
            params = (calibration_id,)
        rows = self._query(sql + " ORDER BY calibration_id, kind, bytes", params)
        return [{**{k: row[k] for k in ("calibration_id", "kind", "bytes", "median_s", "p10_s", "p90_s", "repeats")},
                 "values": json.loads(row["values_json"] or "[]")} for row in rows]

    def calibration_frame(self):
        """One row per stored calibration as a pandas DataFrame (columns of `calibrations`
        without env and extra, plus ``windows``: the own fit of each calibration pooled into
        it, a list of {measured_at, fit_a_s, fit_b_s_per_byte}; empty in older stores)."""
        rows = [{**{k: v for k, v in row.items() if k not in ("env", "extra")},
                 "windows": row["extra"].get("windows") or []} for row in self.calibrations()]
        return pd.DataFrame(rows, columns=["calibration_id", *CALIBRATION_COLUMNS, "measured_at", "windows"])


    def _query(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot read result store {self.path}: {exc}") from None

    def meta(self) -> dict[str, Any]:
        """All campaign-level facts, decoded."""
        return {row["key"]: json.loads(row["value"]) for row in self._query("SELECT key, value FROM campaign_meta")}

    def has(self, run_id: str) -> bool:
        """Whether the run is stored (whatever its status): the launcher's resume test."""
        return bool(self._query("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)))

    def run_ids(self, status: str | None = None) -> set[str]:
        """Stored run ids, optionally only those with the given status."""
        if status is None:
            rows = self._query("SELECT run_id FROM runs")
        else:
            rows = self._query("SELECT run_id FROM runs WHERE status = ?", (status,))
        return {row["run_id"] for row in rows}

    def get(self, run_id: str) -> dict:
        """The record as it was added (every run column, phases, env, extra); KeyError if absent."""
        rows = self._query("SELECT * FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise KeyError(run_id)
        row = rows[0]
        record = {name: row[name] for name in RUN_COLUMNS}
        record["phases"] = [
            {"phase": p["phase"], "measured_s": p["measured_s"], "predicted_s": p["predicted_s"]}
            for p in self._query("SELECT * FROM phases WHERE run_id = ? ORDER BY rowid", (run_id,))
        ]
        record["env"] = json.loads(row["env_json"] or "{}")
        record["extra"] = json.loads(row["extra_json"] or "{}")
        return record

    def records(self) -> list[dict]:
        """Every stored record, in the order the runs started."""
        rows = self._query("SELECT run_id FROM runs ORDER BY started_at, rowid")
        return [self.get(row["run_id"]) for row in rows]

    def runs_frame(self):
        """One row per run as a pandas DataFrame.

        Besides the run columns: ``env_<key>`` and ``extra_<key>`` columns (nested dicts
        flattened with ``_``), and per phase ``phase_<name>_s`` (measured) and
        ``phase_<name>_pred_s`` (predicted) so that tables need no join.  Every phase of
        `record.PHASES` has its columns even when no run measured it.
        """
        rows = self._query("SELECT * FROM runs ORDER BY started_at, rowid")
        base = []
        for row in rows:
            flat = {name: row[name] for name in RUN_COLUMNS}
            flat.update(flatten("env", json.loads(row["env_json"] or "{}")))
            flat.update(flatten("extra", json.loads(row["extra_json"] or "{}")))
            base.append(flat)
        frame = pd.DataFrame(base, columns=None if base else list(RUN_COLUMNS))
        for column in frame.columns:
            if column.startswith(("env_", "extra_")):  # free-form: keep 16 as 16, not 16.0
                frame[column] = pd.Series([row.get(column) for row in base], index=frame.index, dtype=object)
        frame = _typed(frame)
        return frame.join(self._phase_columns(), on="run_id") if len(frame) else _with_phase_columns(frame)

    def _phase_columns(self):
        """Wide per-run phase times: index run_id, columns phase_<p>_s / phase_<p>_pred_s."""
        rows = self._query("SELECT run_id, phase, measured_s, predicted_s FROM phases ORDER BY rowid")
        long = pd.DataFrame([dict(row) for row in rows], columns=["run_id", "phase", "measured_s", "predicted_s"])
        names = list(PHASES) + [p for p in dict.fromkeys(long["phase"]) if p not in PHASES]
        wide = pd.DataFrame(index=pd.Index(sorted(set(long["run_id"])), name="run_id"))
        for name in names:
            sub = long[long["phase"] == name].set_index("run_id")
            wide[f"phase_{name}_s"] = pd.to_numeric(sub["measured_s"], errors="coerce").reindex(wide.index)
            wide[f"phase_{name}_pred_s"] = pd.to_numeric(sub["predicted_s"], errors="coerce").reindex(wide.index)
        return wide.astype("float64")

    def phases_frame(self):
        """The long phase table joined with the run's identity and topology, for plotting.

        Columns: run_id, phase, phase_order (position in `record.PHASES`, others after),
        measured_s, predicted_s, and `PHASE_CONTEXT_COLUMNS`.
        """
        context = ", ".join(f"r.{name}" for name in PHASE_CONTEXT_COLUMNS)
        rows = self._query(
            f"SELECT p.run_id, p.phase, p.measured_s, p.predicted_s, {context} "
            "FROM phases p JOIN runs r ON r.run_id = p.run_id ORDER BY r.started_at, r.rowid, p.rowid")
        columns = ["run_id", "phase", "measured_s", "predicted_s", *PHASE_CONTEXT_COLUMNS]
        frame = _typed(pd.DataFrame([dict(row) for row in rows], columns=columns))
        frame["measured_s"] = pd.to_numeric(frame["measured_s"], errors="coerce").astype("float64")
        frame["predicted_s"] = pd.to_numeric(frame["predicted_s"], errors="coerce").astype("float64")
        order = {name: i for i, name in enumerate(PHASES)}
        frame.insert(2, "phase_order", [order.get(p, len(PHASES)) for p in frame["phase"]])
        return frame

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self._query("SELECT COUNT(*) AS n FROM runs")[0]["n"]

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"


def _typed(frame):
    """Give run columns stable dtypes: nullable Int64 for INTEGER, float64 for REAL."""
    for name in frame.columns:
        sqltype = _COLUMN_TYPES.get(name)
        if sqltype == "INTEGER":
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("Int64")
        elif sqltype == "REAL":
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
        elif sqltype == "TEXT":
            frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    return frame


def _with_phase_columns(frame):
    """An empty runs frame still carries the phase columns."""
    for name in PHASES:
        frame[f"phase_{name}_s"] = pd.Series(dtype="float64")
        frame[f"phase_{name}_pred_s"] = pd.Series(dtype="float64")
    return frame
