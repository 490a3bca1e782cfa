"""The store's tables, their migrations, and a record checked against them on its way in.

The layout is described in `analysis.store`; its version is ``PRAGMA user_version``, and
`MIGRATIONS` holds the step up to each version.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any, Callable, Mapping

from analysis.calibration import CalibrationFit
from analysis.record import RUN_COLUMNS, RUN_FIELDS, STATUSES

STORE_FILENAME = "results.sqlite"
RECORD_FILENAME = "record.json"  # in each run folder: runs/<run id>/record.json
# The layout of the tables; each step up has its entry in MIGRATIONS.
SCHEMA_VERSION = 1
TABLES = ("runs", "phases", "campaign_meta", "calibration", "calibration_points")

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

COLUMN_TYPES: dict[str, str] = {name: sqltype for name, sqltype, _ in RUN_FIELDS}

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


# --------------------------------------------------------------------------- validation

def plain_scalar(value: Any) -> Any:
    """NumPy scalars -> Python scalars, so that sqlite3 can bind them."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (str, bytes, dict, list, tuple)):
        try:
            return item()
        except (TypeError, ValueError):
            return value
    return value


def coerce(name: str, value: Any) -> Any:
    """Check `value` against the column's declared SQLite type; return what to bind.

    INTEGER accepts ints, bools and integral floats; REAL accepts ints and floats (NaN
    is stored as NULL, which SQLite would do anyway); TEXT accepts strings only.
    """
    value = plain_scalar(value)
    if value is None:
        return None
    sqltype = COLUMN_TYPES[name]
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


def check_keys(record: dict) -> None:
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


def phase_rows(run_id: str, phases: Any) -> list[tuple]:
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
        rows.append((run_id, name, phase_time(name, entry.get("measured_s")), phase_time(name, entry.get("predicted_s"))))
    return rows


def phase_time(phase: str, value: Any) -> float | None:
    value = plain_scalar(value)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if math.isnan(value) else float(value)
    raise ValueError(f"phase {phase!r} time must be a number, got {value!r}")


def json_dict(name: str, value: Any) -> str:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"record field {name!r} must be a dict, got {type(value).__name__}")
    return json.dumps(value, sort_keys=True, default=str)


# --------------------------------------------------------------------------- tables and migrations

def _schema_v1(conn: sqlite3.Connection) -> None:
    """Version 1: the five tables (stores made before the version was kept have some or all
    of them: every statement is IF NOT EXISTS)."""
    columns = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in RUN_FIELDS)
    conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({columns}, env_json TEXT, extra_json TEXT, "
                 "PRIMARY KEY (run_id))")
    conn.execute("CREATE TABLE IF NOT EXISTS phases (run_id TEXT NOT NULL, phase TEXT NOT NULL, "
                 "measured_s REAL, predicted_s REAL, PRIMARY KEY (run_id, phase))")
    conn.execute("CREATE TABLE IF NOT EXISTS campaign_meta (key TEXT PRIMARY KEY, value TEXT)")
    calibration = ", ".join(f"{name} {sqltype}" for name, sqltype in CALIBRATION_FIELDS)
    conn.execute(f"CREATE TABLE IF NOT EXISTS calibration (calibration_id INTEGER PRIMARY KEY "
                 f"AUTOINCREMENT, {calibration}, measured_at TEXT, env_json TEXT, extra_json TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS calibration_points (calibration_id INTEGER NOT NULL, "
                 "kind TEXT NOT NULL, bytes INTEGER NOT NULL, median_s REAL, p10_s REAL, p90_s REAL, "
                 "repeats INTEGER, values_json TEXT, PRIMARY KEY (calibration_id, kind, bytes))")


# Schema version -> the step that brings a store of the version below up to it. A store
# opens at any version up to SCHEMA_VERSION: the steps above its version run in order, in
# one transaction with the new user_version.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _schema_v1}


def add_contract_columns(conn: sqlite3.Connection) -> None:
    """Columns the record contract (analysis/record.py) or the calibration fit gained since
    the store was made: added with NULL for the old rows."""
    wanted = {"runs": [(name, sqltype) for name, sqltype, _ in RUN_FIELDS]
              + [("env_json", "TEXT"), ("extra_json", "TEXT")],
              "calibration": list(CALIBRATION_FIELDS)}
    for table, columns in wanted.items():
        existing = set(table_columns(conn, table))
        for name, sqltype in columns:
            if name not in existing:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sqltype}")


def table_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def integrity_problem(conn: sqlite3.Connection) -> str | None:
    """None when `PRAGMA quick_check` passes, else its first complaint (or SQLite's error
    when the file cannot even be read as a database)."""
    try:
        rows = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if rows == ["ok"] else (rows[0] if rows else "quick_check returned nothing")
