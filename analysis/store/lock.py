"""One writer per campaign folder: `CampaignLock`, a file lock the kernel drops when its
holder dies however it dies, so a dead campaign's lock is simply taken over."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from core.files import FileLock
from analysis.store.errors import CampaignBusy, StoreError

LOCK_FILENAME = ".dlcompare.lock"


class CampaignLock:
    """An advisory lock on a campaign folder, so that two campaigns (or a campaign and a
    calibration) never write the same store and run folders at once.

    A `core.files.FileLock` on ``.dlcompare.lock``: a dead holder's lock is simply taken
    over, and the processes a campaign starts do not inherit it.  The file names the holder
    (pid and command) for the refusal message, and is emptied on release, so a pid found in
    it by the next holder is one that died holding it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILENAME
        self._lock = FileLock(self.path)
        self.took_over: str | None = None  # the holder that died holding it, if one did

    def acquire(self, wait: bool = False, on_wait: Callable[[str], None] | None = None) -> "CampaignLock":
        """Take the lock; CampaignBusy (one line, the holder's pid) when another live process
        holds it, unless `wait`: then block until it is free (Ctrl-C ends the wait)."""
        try:
            free = self._lock.acquire(wait=False)
        except OSError as exc:
            raise StoreError(f"cannot lock campaign folder {self.folder}: {exc.strerror or exc}") from None
        try:
            if not free:
                holder = self.holder(self._lock.fd)
                if not wait:
                    raise CampaignBusy(f"campaign folder {self.folder} is in use by {holder}: wait for "
                                       "it to end (or pass --wait), or use another --out") from None
                if on_wait:
                    on_wait(f"campaign folder {self.folder} is in use by {holder}: waiting (--wait)")
                self._lock.acquire()
        except BaseException:
            self._lock.release()
            raise
        fd = self._lock.fd
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
        if self._lock.fd is None:
            return
        try:
            os.ftruncate(self._lock.fd, 0)
        except OSError:
            pass
        self._lock.release()

    def __enter__(self) -> "CampaignLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
