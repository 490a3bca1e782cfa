"""Files several processes share: one lock and one atomic writer for every layer.

- `FileLock`: an exclusive advisory lock (``flock``) on a file. The kernel drops it when the
  holder's process ends, however it ends (SIGKILL and the OOM killer included), so a dead
  holder's lock is simply taken over; its descriptor is close-on-exec, so the processes the
  holder starts do not hold it too.
- `write_text_atomic` (and `write_json_atomic`): a file written whole or not at all, so a
  reader, a crash or a full disk never leaves half a file where a whole one is expected.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any


class FileLock:
    """An exclusive advisory lock on `path` (created if missing, never truncated: a holder may
    keep a note in it). ``with FileLock(path):`` holds it for the block, waiting for it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd: int | None = None  # open while held, and after an acquire that found it taken

    def acquire(self, wait: bool = True) -> bool:
        """Take the lock: True once held. With ``wait=False``, False at once when another
        process holds it; the file stays open (`fd`) so the caller can read the holder's note
        and then wait with ``acquire()``. OSError when the file cannot be opened."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        except BaseException:
            self.release()
            raise
        return True

    def release(self) -> None:
        """Drop the lock (closing the file drops the flock); nothing when not held."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def file_lock(path: str | Path) -> FileLock:
    """The lock on `path` for a ``with`` block, its folder made first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` whole or not at all: written beside it under a hidden
    temporary name, then renamed over it; a failed write leaves the old file as it was and
    no temporary file behind."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.tmp")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """`data` as JSON (indented by one, NumPy numbers as floats), written atomically: the
    format of rank files and run records."""
    write_text_atomic(path, json.dumps(data, indent=1, default=float))
