"""What every command-line entry point shares: one error format, usage errors in one line, the
exit codes, and interrupts that end a command the way Ctrl-C does.

Exit codes: 0 everything ran, 1 something ran and failed (recorded), 2 bad input (nothing was
run), 130 interrupted (what was measured is kept).
"""

from __future__ import annotations

import argparse
import signal
import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def error_line(message: object) -> str:
    """The one error format of every entry point: `dlcompare: error: <first line>`."""
    text = str(message).strip().splitlines()
    return f"dlcompare: error: {text[0] if text else type(message).__name__}"


def fail(message: object, code: int = EXIT_USAGE) -> int:
    """Print `message` as the one error line on stderr and return `code` for the caller to exit."""
    print(error_line(message), file=sys.stderr, flush=True)
    return code


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one `dlcompare: error:` line on stderr and exit code 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, error_line(message) + "\n")


def raise_interrupt(signum, frame):
    """A signal handler that ends the command like Ctrl-C (KeyboardInterrupt): runs are killed,
    clusters torn down, stored results kept."""
    raise KeyboardInterrupt


def interrupt_on_termination() -> None:
    """SIGTERM ends the command like Ctrl-C."""
    signal.signal(signal.SIGTERM, raise_interrupt)
