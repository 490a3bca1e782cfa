"""Salvaging a damaged store: its readable rows and the run folders' records go into a new
store, the damaged file is kept beside it (``python -m analysis.store repair DIR``)."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from core.cli import OneLineParser, fail
from analysis.store.errors import StoreError
from analysis.store.lock import CampaignLock
from analysis.store.result_store import ResultStore
from analysis.store.schema import STORE_FILENAME, TABLES, integrity_problem, table_columns


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

