"""`ResultStore`: one campaign's records in SQLite, written one transaction at a time.

WAL mode lets the report read while a campaign appends; a failed write (a full disk) is one
line (`StoreError`) with SQLite's own cause and leaves the store as it was.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator
from urllib.parse import quote

from analysis.calibration import CalibrationFit, summarize
from analysis.record import RUN_COLUMNS
from analysis.store.errors import NoStore, StoreDamaged, StoreError, damage_message
from analysis.store.schema import (CALIBRATION_COLUMNS, CALIBRATION_KEY, MIGRATIONS,
                                   PHASE_CONTEXT_COLUMNS, RECORD_FILENAME, SCHEMA_VERSION,
                                   STORE_FILENAME, add_contract_columns, calibration_key,
                                   check_keys, coerce, integrity_problem, json_dict, phase_rows,
                                   phase_time, plain_scalar, table_columns)

if TYPE_CHECKING:
    from analysis.store.lock import CampaignLock


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
            add_contract_columns(conn)
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
        check_keys(record)
        values = [coerce(name, record.get(name)) for name in RUN_COLUMNS]
        env = json_dict("env", record.get("env"))
        extra = json_dict("extra", record.get("extra"))
        run_id = values[0]
        phases = phase_rows(run_id, record.get("phases"))
        names = ", ".join(RUN_COLUMNS + ("env_json", "extra_json"))
        marks = ", ".join("?" * (len(RUN_COLUMNS) + 2))
        statements = [(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", (*values, env, extra)),
                      ("DELETE FROM phases WHERE run_id = ?", (run_id,))]
        statements += [("INSERT INTO phases (run_id, phase, measured_s, predicted_s) VALUES (?, ?, ?, ?)", row)
                       for row in phases]
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
                (*[plain_scalar(row[k]) for k in CALIBRATION_COLUMNS], measured_at,
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
                    (coerce("predicted_iter_time", item.get("predicted_iter_time")),
                     coerce("prediction_error", item.get("prediction_error")),
                     json.dumps(extra, sort_keys=True, default=str), run_id))
                phases = item.get("phases") or {}
                conn.execute("UPDATE phases SET predicted_s = NULL WHERE run_id = ?", (run_id,))
                for phase, value in phases.items():
                    value = phase_time(phase, value)
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
        from analysis.store import frames  # pandas only for frames: the store starts on the standard library
        return frames.calibration_frame(self.calibrations())

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
        flattened with ``_``; numbers as numbers, see `frames.free_column`), and per phase
        ``phase_<name>_s`` (measured) and ``phase_<name>_pred_s`` (predicted) so that tables
        need no join.  Every phase of `record.PHASES` has its columns even when no run
        measured it.
        """
        from analysis.store import frames  # pandas only for frames: the store starts on the standard library
        runs = self._query("SELECT * FROM runs ORDER BY started_at, rowid")
        phases = self._query("SELECT run_id, phase, measured_s, predicted_s FROM phases ORDER BY rowid") \
            if runs else []
        return frames.runs_frame(runs, phases)

    def campaign_frame(self):
        """`runs_frame` limited to the launches the campaign last asked for (its settings'
        ``launches``): a campaign resumed with fewer launches keeps the others stored, and
        the tables, the verdict and the report read the first ones only."""
        from analysis.store import frames  # pandas only for frames: the store starts on the standard library
        settings = self.meta().get("settings")
        launches = settings.get("launches") if isinstance(settings, dict) else None
        return frames.first_launches(self.runs_frame(), launches)

    def phases_frame(self):
        """The long phase table joined with the run's identity and topology, for plotting.

        Columns: run_id, phase, phase_order (position in `record.PHASES`, others after),
        measured_s, predicted_s, and `PHASE_CONTEXT_COLUMNS`.
        """
        from analysis.store import frames  # pandas only for frames: the store starts on the standard library
        context = ", ".join(f"r.{name}" for name in PHASE_CONTEXT_COLUMNS)
        return frames.phases_frame(self._query(
            f"SELECT p.run_id, p.phase, p.measured_s, p.predicted_s, {context} "
            "FROM phases p JOIN runs r ON r.run_id = p.run_id ORDER BY r.started_at, r.rowid, p.rowid"))

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
