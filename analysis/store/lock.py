"""One writer per campaign folder: `CampaignLock`, an flock the kernel drops when its holder
dies however it dies, so a dead campaign's lock is simply taken over."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Callable

from analysis.store.errors import CampaignBusy, StoreError

LOCK_FILENAME = ".dlcompare.lock"


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
