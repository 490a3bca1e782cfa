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

Nothing measured is lost to a failing store or disk:

- the schema carries its version (``PRAGMA user_version``, `SCHEMA_VERSION`); opening an
  older store runs the `MIGRATIONS` above its version, and a store newer than this code is
  refused for writing; columns the record contract gained are added whenever missing;
- every open runs ``PRAGMA quick_check`` first: a damaged store (`StoreDamaged`) is never
  written to, and `repair_campaign` salvages its readable rows into a new store, keeping
  the damaged file beside it;
- a failed write (a full disk) is one line (`StoreError`) with SQLite's own cause, and
  leaves the store as it was: SQLite may have rolled the transaction back itself, so the
  ROLLBACK that follows never hides the cause;
- each run folder keeps the run's ``record.json`` (`launchers.campaign`); `import_pending`
  stores the ones the store lacks (the next campaign with the same --out, and
  ``python -m analysis.report``);
- one writer per campaign folder (`CampaignLock`, an flock the kernel drops when its holder
  dies however it dies, so a dead campaign's lock is simply taken over).

``python -m analysis.store repair DIR`` salvages a damaged store from the command line.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import sqlite3
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import quote

from core.cli import EXIT_NOT_WRITTEN, EXIT_USAGE, OneLineParser, fail
from core.envs import reexec_in_host_env

if __name__ == "__main__":  # `python3 -m analysis.store` from any Python: pandas is in the host env
    reexec_in_host_env("analysis.store", sys.argv[1:])

import pandas as pd  # noqa: E402

from analysis.calibration import CalibrationFit, summarize  # noqa: E402
from analysis.record import PHASES, RUN_COLUMNS, RUN_FIELDS, STATUSES  # noqa: E402

STORE_FILENAME = "results.sqlite"
LOCK_FILENAME = ".dlcompare.lock"
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
    """The store cannot be opened or written; the message is one line, fit for a CLI, and
    `exit_code` the status a command ends with for it (core.cli)."""

    exit_code = EXIT_NOT_WRITTEN


class NoStore(StoreError):
    """A reader was pointed at a folder without a store: bad input."""

    exit_code = EXIT_USAGE


class StoreDamaged(StoreError):
    """The store failed its integrity check: it is not written to; the message says how to
    recover."""


class CampaignBusy(StoreError):
    """Another live process holds the campaign folder's lock: nothing was run."""

    exit_code = EXIT_USAGE


def damage_message(path: Path, problem: str) -> str:
    return (f"result store {path} is damaged ({problem.strip().splitlines()[0][:200]}); nothing "
            f"was written to it: salvage its readable runs into a new store (the damaged file "
            f"is kept) with --repair or `python -m analysis.store repair {path.parent}`, or use "
            f"a new --out folder")


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


# --------------------------------------------------------------------------- schema

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


def _add_contract_columns(conn: sqlite3.Connection) -> None:
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


def _connect(path: Path, create: bool, read_only: bool) -> sqlite3.Connection:
    """A connection that creates the file only when `create`, and writes nothing when
    `read_only`: a WAL store in a folder without write access cannot be opened ``mode=ro``
    (SQLite would create its -shm file), so it is read as ``immutable``, which is what it is
    to this process."""
    def connect(target: str, uri: bool) -> sqlite3.Connection:
        return sqlite3.connect(target, timeout=60, isolation_level=None, uri=uri,
                               check_same_thread=False)

    if not read_only:
        return connect(f"file:{quote(str(path))}?mode=rw", True) if not create else connect(str(path), False)
    conn = connect(f"file:{quote(str(path))}?mode=ro", True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        conn.close()
        if os.access(path.parent, os.W_OK):
            raise
        return connect(f"file:{quote(str(path))}?immutable=1", True)


def integrity_problem(conn: sqlite3.Connection) -> str | None:
    """None when `PRAGMA quick_check` passes, else its first complaint (or SQLite's error
    when the file cannot even be read as a database)."""
    try:
        rows = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        return str(exc)
    return None if rows == ["ok"] else (rows[0] if rows else "quick_check returned nothing")


# --------------------------------------------------------------------------- the store

class ResultStore:
    """One campaign's records in SQLite.

    ``ResultStore(path)`` opens (creating if needed) the file at `path`; its folder must
    exist.  ``create=False`` refuses to create a store (for readers such as the report);
    ``read_only=True`` also never writes, not even to migrate an older schema, and works in
    a folder without write access (a dry run).  Every open checks the store's integrity
    first (`StoreDamaged`).  Opening an existing store never truncates it.  `lock`, a held
    `CampaignLock`, is released when the store is closed.
    """

    def __init__(self, path: str | Path, create: bool = True, read_only: bool = False,
                 lock: "CampaignLock | None" = None):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._folder_lock = lock
        self._conn = None
        try:
            if (read_only or not create) and not self.path.is_file():
                raise NoStore(f"no result store at {self.path}")
            if self.path.is_dir():
                raise StoreError(f"cannot open result store {self.path}: it is a directory")
            if not self.path.parent.is_dir():
                raise StoreError(f"cannot open result store {self.path}: {self.path.parent} "
                                 "is not an existing folder")
            self._conn = _connect(self.path, create, read_only)
            self._conn.row_factory = sqlite3.Row
            self._check_integrity()
            if not read_only:
                self._migrate(writer=create)
        except BaseException as exc:
            self.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open result store {self.path}: {exc}") from None
            raise

    @classmethod
    def for_campaign(cls, out_dir: str | Path, create: bool = True,
                     read_only: bool = False) -> "ResultStore":
        """The store of the campaign folder `out_dir` (created with its folder if needed)."""
        out_dir = Path(out_dir)
        if create and not read_only:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create campaign folder {out_dir}: {exc.strerror or exc}") from None
        return cls(out_dir / STORE_FILENAME, create=create, read_only=read_only)

    # -- integrity and schema ----------------------------------------------------------------

    def _check_integrity(self) -> None:
        """`PRAGMA quick_check` (every page and cell readable, no index checked against its
        table: linear in the file's size, milliseconds for a campaign); StoreDamaged if not."""
        problem = integrity_problem(self._conn)
        if problem:
            raise StoreDamaged(damage_message(self.path, problem))

    def _migrate(self, writer: bool) -> None:
        """Bring the schema to `SCHEMA_VERSION` and the record contract's columns; write only
        when something is missing, or always for a writer, whose open then fails early when
        the file is not writable.

        WAL lets the report read while a campaign appends; ``busy_timeout`` (via the
        connect timeout) makes concurrent writers wait instead of failing.
        """
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"result store {self.path} has schema version {version}, newer than "
                             f"this dlcompare's {SCHEMA_VERSION}: open it with a newer dlcompare")
        if not writer and version == SCHEMA_VERSION and self._columns_complete():
            return
        if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._conn.execute("PRAGMA journal_mode=WAL")
        with self._writing("prepare") as conn:
            for target in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[target](conn)
            _add_contract_columns(conn)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _existing_columns(self, table: str) -> list[str]:
        return table_columns(self._conn, table)

    def _columns_complete(self) -> bool:
        runs = set(self._existing_columns("runs"))
        return (runs >= set(RUN_COLUMNS) | {"env_json", "extra_json"}
                and set(self._existing_columns("calibration")) >= set(CALIBRATION_COLUMNS))

    # -- writing --------------------------------------------------------------------------

    @contextmanager
    def _writing(self, what: str = "write") -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: everything in the block lands, or nothing.

        On a full disk (SQLITE_FULL) or an I/O error SQLite may already have rolled the
        transaction back; the ROLLBACK after it then fails with "no transaction is active",
        which must not replace the cause the user needs to see."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:
                        try:
                            self._conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # rolled back already; the error being raised says why
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"cannot {what} result store {self.path}: {exc}") from None

    def _transaction(self, statements: Iterable[tuple[str, tuple]]) -> None:
        """Run statements in one IMMEDIATE transaction: all land, or none."""
        with self._writing() as conn:
            for sql, params in statements:
                conn.execute(sql, params)

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
        with self._writing() as conn:
            old = [r[0] for r in conn.execute(
                f"SELECT calibration_id FROM calibration WHERE {key}", calibration_key(row))]
            for calibration_id in old:
                conn.execute("DELETE FROM calibration_points WHERE calibration_id = ?", (calibration_id,))
                conn.execute("DELETE FROM calibration WHERE calibration_id = ?", (calibration_id,))
            cursor = conn.execute(
                f"INSERT INTO calibration ({names}) VALUES ({marks})",
                (*[_plain(row[k]) for k in CALIBRATION_COLUMNS], measured_at,
                 json.dumps(env or {}, sort_keys=True, default=str),
                 json.dumps(extra or {}, sort_keys=True, default=str)))
            calibration_id = cursor.lastrowid
            for kind, data in (("collective", points), ("reduction", reduction_points or {})):
                for item in summarize(data):
                    values = [float(v) for v in data.get(item.nbytes, data.get(str(item.nbytes), []))]
                    conn.execute(
                        "INSERT INTO calibration_points (calibration_id, kind, bytes, median_s, p10_s, "
                        "p90_s, repeats, values_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (calibration_id, kind, item.nbytes, item.median, item.p10, item.p90,
                         item.repeats, json.dumps(values)))
        return calibration_id

    def set_predictions(self, predictions: Iterable[dict]) -> None:
        """Write the performance model's predictions onto stored runs, in one transaction.

        Each item: ``run_id``, ``predicted_iter_time``, ``prediction_error``, ``phases``
        ({phase: predicted seconds}) and ``prediction`` (a dict kept as
        ``extra["prediction"]``; None removes it).  Runs not stored are skipped; a phase
        the run did not measure gets a row with only its prediction.
        """
        predictions = list(predictions)
        with self._writing() as conn:
            for item in predictions:
                run_id = item["run_id"]
                found = conn.execute("SELECT extra_json FROM runs WHERE run_id = ?", (run_id,)).fetchall()
                if not found:
                    continue
                extra = json.loads(found[0]["extra_json"] or "{}")
                if item.get("prediction") is None:
                    extra.pop("prediction", None)
                else:
                    extra["prediction"] = item["prediction"]
                conn.execute(
                    "UPDATE runs SET predicted_iter_time = ?, prediction_error = ?, extra_json = ? "
                    "WHERE run_id = ?",
                    (_coerce("predicted_iter_time", item.get("predicted_iter_time")),
                     _coerce("prediction_error", item.get("prediction_error")),
                     json.dumps(extra, sort_keys=True, default=str), run_id))
                phases = item.get("phases") or {}
                conn.execute("UPDATE phases SET predicted_s = NULL WHERE run_id = ?", (run_id,))
                for phase, value in phases.items():
                    value = _real(phase, value)
                    updated = conn.execute(
                        "UPDATE phases SET predicted_s = ? WHERE run_id = ? AND phase = ?",
                        (value, run_id, phase)).rowcount
                    if not updated:
                        conn.execute(
                            "INSERT INTO phases (run_id, phase, measured_s, predicted_s) VALUES (?, ?, NULL, ?)",
                            (run_id, phase, value))

    def import_pending(self, out_dir: str | Path) -> tuple[list[str], list[str]]:
        """Store the run folders' records (``runs/*/record.json``) that the store lacks: runs
        measured while the store could not be written (a full disk), or whose campaign died
        between the run's end and its storing.  Returns (the run ids imported, one line per
        record that could not be read); a StoreError when the store cannot be written."""
        stored = self.run_ids()
        imported, unreadable = [], []
        for path in sorted(Path(out_dir).glob(f"runs/*/{RECORD_FILENAME}")):
            try:
                record = json.loads(path.read_text())
                if not isinstance(record, dict) or record.get("run_id") in stored:
                    continue
                self.add(record)
            except (OSError, ValueError) as error:
                unreadable.append(f"{path}: {error}")
            else:
                imported.append(record["run_id"])
        return imported, unreadable

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
        flattened with ``_``; numbers as numbers, see `free_column`), and per phase ``phase_<name>_s`` (measured) and
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
            if column.startswith(("env_", "extra_")):
                frame[column] = free_column([row.get(column) for row in base], frame.index)
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
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._folder_lock is not None:
            self._folder_lock.release()
            self._folder_lock = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self._query("SELECT COUNT(*) AS n FROM runs")[0]["n"]

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"


def free_column(values: list, index) -> pd.Series:
    """A free-form ``env_``/``extra_`` column: whole numbers as nullable Int64 (16 stays 16,
    not 16.0), numbers as float64, anything else (text, booleans, mixed) as objects."""
    present = [v for v in values if v is not None]
    numbers = [v for v in present if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not present or len(numbers) != len(present):
        return pd.Series(values, index=index, dtype=object)
    if all(isinstance(v, int) for v in numbers):
        return pd.Series(values, index=index, dtype="Int64")
    return pd.Series([math.nan if v is None else float(v) for v in values], index=index, dtype="float64")


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


# --------------------------------------------------------------------------- one writer per folder

class CampaignLock:
    """An advisory lock on a campaign folder, so that two campaigns (or a campaign and a
    calibration) never write the same store and run folders at once.

    `flock` on ``.dlcompare.lock``: the kernel drops it when the holder's process ends,
    however it ends (SIGKILL and the OOM killer included), so a dead holder's lock is simply
    taken over.  The file names the holder (pid and command) for the refusal message, and is
    emptied on release, so a pid found in it by the next holder is one that died holding it.
    The descriptor is not inherited by the processes a campaign starts (Python opens files
    close-on-exec)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILENAME
        self._fd: int | None = None
        self.took_over: str | None = None  # the holder that died holding it, if one did

    def acquire(self, wait: bool = False, on_wait: Callable[[str], None] | None = None) -> "CampaignLock":
        """Take the lock; CampaignBusy (one line, the holder's pid) when another live process
        holds it, unless `wait`: then block until it is free (Ctrl-C ends the wait)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot lock campaign folder {self.folder}: {exc.strerror or exc}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self.holder(fd)
                if not wait:
                    raise CampaignBusy(f"campaign folder {self.folder} is in use by {holder}: wait for "
                                       "it to end (or pass --wait), or use another --out") from None
                if on_wait:
                    on_wait(f"campaign folder {self.folder} is in use by {holder}: waiting (--wait)")
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.took_over = self.holder(fd) if os.fstat(fd).st_size else None
        try:
            os.ftruncate(fd, 0)
            command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
            os.pwrite(fd, f"{os.getpid()} {command[:500]}\n".encode(), 0)
        except OSError:
            pass  # a full disk cannot take the holder's name; the lock itself is held
        return self

    @staticmethod
    def holder(fd: int) -> str:
        """'pid N (command)' as the holder wrote it, or 'another process'."""
        try:
            pid, _, command = os.pread(fd, 600, 0).decode(errors="replace").strip().partition(" ")
        except OSError:
            return "another process"
        if not pid.isdigit():
            return "another process"
        if len(command) > 60:
            command = command[:59] + "…"
        return f"pid {pid}" + (f" ({command})" if command else "")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> "CampaignLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def open_campaign(out_dir: str | Path, wait: bool = False, repair: bool = False,
                  log: Callable[[str], None] = print) -> ResultStore:
    """The store of a campaign about to write to it: the folder locked (`CampaignLock`, held
    until the store is closed), repaired first when asked and damaged, checked, and the run
    folders' records it lacked imported (`import_pending`). Raises StoreError (CampaignBusy,
    StoreDamaged) with one line."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create campaign folder {out_dir}: {exc.strerror or exc}") from None
    lock = CampaignLock(out_dir).acquire(wait=wait, on_wait=log)
    try:
        if lock.took_over:
            log(f"campaign folder: {lock.took_over} ended without releasing it; taken over")
        if repair:
            log(repair_campaign(out_dir) or f"--repair: {out_dir / STORE_FILENAME} is intact")
        store = ResultStore(out_dir / STORE_FILENAME, lock=lock)
    except BaseException:
        lock.release()
        raise
    try:
        imported, unreadable = store.import_pending(out_dir)
    except BaseException:
        store.close()
        raise
    for line in unreadable:
        log(f"not imported: {line}")
    if imported:
        log(imported_line(imported))
    return store


def imported_line(run_ids: list[str]) -> str:
    """What a command says when it stored records that run folders kept (their runs ended
    while the store could not take them)."""
    return f"imported {len(run_ids)} run(s) measured but not yet stored: {', '.join(run_ids)}"


# --------------------------------------------------------------------------- repair

def repair_campaign(out_dir: str | Path) -> str | None:
    """Salvage a damaged store: move it aside (kept as ``results.sqlite.damaged-<UTC time>``
    with its -wal file), copy every row SQLite can still read into a new store, then import
    the run folders' records the salvage missed.  Returns one line saying what was saved;
    None when the store is absent or intact.  The caller holds the folder's lock."""
    out_dir = Path(out_dir)
    path = out_dir / STORE_FILENAME
    if not path.is_file():
        return None
    with sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True) as probe:
        problem = integrity_problem(probe)
    probe.close()
    if problem is None:
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = path.with_name(f"{STORE_FILENAME}.damaged-{stamp}")
    try:
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{kept}{suffix}")
    except OSError as exc:
        raise StoreError(f"cannot move the damaged store {path} aside: {exc.strerror or exc}") from None
    with ResultStore(path) as store:
        salvaged = salvage_rows(kept, store)
        imported, _ = store.import_pending(out_dir)
        runs = len(store)
    counts = ", ".join(f"{n} {table}" for table, n in salvaged.items() if n)
    return (f"repaired {path}: salvaged {counts or 'nothing'}; imported {len(imported)} run(s) from "
            f"their run folders; {runs} run(s) stored now; the damaged file is kept as {kept.name}")


def salvage_rows(damaged: Path, store: ResultStore) -> dict[str, int]:
    """Copy the rows of every table that SQLite can still read from `damaged` into `store`
    (a healthy one); rows on damaged pages are skipped. Returns rows copied per table."""
    copied = {}
    try:
        source = sqlite3.connect(f"file:{quote(str(damaged))}?mode=ro", uri=True)
    except sqlite3.Error:
        return {}
    try:
        for table in TABLES:
            try:
                columns = [c for c in table_columns(source, table) if c in table_columns(store._conn, table)]
            except sqlite3.DatabaseError:
                continue  # the schema itself is unreadable
            if not columns:
                continue
            rows = readable_rows(source, table, columns)
            names, marks = ", ".join(columns), ", ".join("?" * len(columns))
            with store._writing() as conn:
                conn.executemany(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})", rows)
            copied[table] = len(rows)
    finally:
        source.close()
    return copied


def readable_rows(conn: sqlite3.Connection, table: str, columns: list[str],
                  give_up_after: int = 1000) -> list[tuple]:
    """Every row of `table` SQLite can read: all at once when the table reads whole, else
    row by row through its rowids (a damaged page costs the rows on it), up to the largest
    rowid or, when even that is unreadable, `give_up_after` missing rowids in a row."""
    select = f"SELECT {', '.join(columns)} FROM {table}"
    try:
        return [tuple(row) for row in conn.execute(select).fetchall()]
    except sqlite3.DatabaseError:
        pass
    try:
        top = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    except sqlite3.DatabaseError:
        top = None
    rows, rowid, missing = [], 1, 0
    while (rowid <= top) if top is not None else (missing < give_up_after):
        try:
            row = conn.execute(f"{select} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row is None:
            missing += 1
        else:
            rows.append(tuple(row))
            missing = 0
        rowid += 1
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.store repair DIR``: salvage a campaign's damaged store."""
    parser = OneLineParser(prog="python -m analysis.store",
                           description="Repair a campaign's damaged results.sqlite: its readable "
                                       "rows and the run folders' records go into a new store; "
                                       "the damaged file is kept beside it.")
    parser.add_argument("action", choices=["repair"])
    parser.add_argument("out_dir", metavar="DIR", help="campaign folder holding results.sqlite")
    args = parser.parse_args(argv)
    try:
        with CampaignLock(args.out_dir).acquire():
            print(repair_campaign(args.out_dir) or f"{Path(args.out_dir) / STORE_FILENAME} is intact "
                  "(or absent): nothing to repair")
    except StoreError as exc:
        return fail(exc, exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
