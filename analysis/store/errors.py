"""What the store raises: one line each, fit for a command line, with the exit status a command
ends with for it (core.cli)."""

from __future__ import annotations

from pathlib import Path

from core.cli import EXIT_NOT_WRITTEN, EXIT_USAGE


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
