"""Opening a campaign's store for writing: the folder locked, the store repaired when asked,
and the records the run folders kept imported."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from analysis.store.errors import StoreError
from analysis.store.lock import CampaignLock
from analysis.store.repair import repair_campaign
from analysis.store.result_store import ResultStore
from analysis.store.schema import STORE_FILENAME
from core.cli import listed


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
    return f"imported {len(run_ids):,} run(s) measured but not yet stored: {listed(run_ids)}"
