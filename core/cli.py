"""What every command-line entry point shares: one error format, usage errors in one line, the
exit codes, and interrupts that end a command the way Ctrl-C does.

Exit codes: 0 everything ran, 1 something ran and failed (recorded), 2 bad input or the
campaign folder in use by another campaign (nothing was run), 3 results could not be written
(a full disk, a damaged store; what was measured is kept in its run folder and stored by the
next run of the command), 130 interrupted (Ctrl-C, SIGTERM, SIGHUP: what was measured is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Mapping

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_WRITTEN = 3
EXIT_INTERRUPTED = 130

# Separate launches of each configuration a campaign runs by default: the fewest that give the
# verdict's test a between-launch variance (analysis.noise) while keeping the example campaign
# within twice the time of one launch each (bench/launch_noise.py measures the noise and the cost).
DEFAULT_LAUNCHES = 2


def error_line(message: object) -> str:
    """The one error format of every entry point: `dlcompare: error: <first line>`."""
    text = str(message).strip().splitlines()
    return f"dlcompare: error: {text[0] if text else type(message).__name__}"


def warning_line(message: object) -> str:
    """The one warning format of every entry point: `dlcompare: warning: <message>`."""
    return f"dlcompare: warning: {message}"


def listed(items, first: int = 3) -> str:
    """Items for a message that must stay one readable line however many there are:
    'a, b, c' for a few, 'a, b, c … and 1,197 more' beyond `first`."""
    items = [str(item) for item in items]
    shown = ", ".join(items[:first])
    return shown if len(items) <= first else f"{shown} … and {len(items) - first:,} more"


def warn(message: object) -> None:
    """Print `message` as one warning line on stderr (a terminal that is gone is no error)."""
    try:
        print(warning_line(message), file=sys.stderr, flush=True)
    except OSError:
        pass


def fail(message: object, code: int = EXIT_USAGE) -> int:
    """Print `message` as the one error line on stderr and return `code` for the caller to exit.
    A terminal that is gone (SIGHUP, then EIO on every write) does not change the exit code."""
    try:
        print(error_line(message), file=sys.stderr, flush=True)
    except OSError:
        pass
    return code


# One spelling per thing across the commands (run, predict, calibrate, check): the flags a
# command used to spell otherwise, by their current spelling. They keep working, each with
# one warning line; a command gives its own besides (predict's --cluster is --cluster-file).
RENAMED_FLAGS: Mapping[str, str] = {
    "--schemes": "--frameworks",
    "--workers-per-node": "--workers",
    "--batch": "--batch-size",
    "--ps": "--servers",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one `dlcompare: error:` line on stderr and exit code 2,
    and the flags of RENAMED_FLAGS (and `renamed`) still work: `current_spelling` rewrites
    them, with one warning line each."""

    def __init__(self, *args, renamed: Mapping[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.renamed = {**RENAMED_FLAGS, **(renamed or {})}

    def error(self, message: str):
        self.exit(EXIT_USAGE, error_line(message) + "\n")

    def current_flag(self, flag: str) -> str | None:
        """The current spelling of an old `flag` this command has, else None."""
        new = self.renamed.get(flag)
        return new if new is not None and new in self._option_string_actions else None

    def current_spelling(self, argv: list[str]) -> list[str]:
        """`argv` with every old spelling of a flag (`--schemes X`, `--schemes=X`) replaced by
        the current one and said once on stderr. Called once, before the arguments are parsed
        and before the command moves into the launcher's environment with the result, so
        the warning is printed once per command. Words after `--` are left as they are."""
        rewritten, said = [], set()
        for position, word in enumerate(argv):
            if word == "--":
                return rewritten + list(argv[position:])
            flag, equals, value = word.partition("=")
            new = self.current_flag(flag) if flag.startswith("--") else None
            if new is None:
                rewritten.append(word)
                continue
            if flag not in said:
                warn(f"{flag} is deprecated; use {new}")
                said.add(flag)
            rewritten.append(new + equals + value)
        return rewritten


INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


@contextlib.contextmanager
def interrupts_held(signals: frozenset[int] = INTERRUPTS):
    """Hold Ctrl-C, SIGTERM and SIGHUP (or only `signals`) back while forking: one that
    arrives while the fork's own hooks run in the parent would raise inside them, where Python
    prints "Exception ignored" and drops it, and the command would go on as if never
    interrupted; one that arrives between a fork and its bookkeeping would leave an untracked
    child. Held, it is delivered when the block ends, in ordinary code. Children inherit the
    mask, also through exec: unblock in them what they must still receive."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def leave_interrupts_to_the_parent() -> None:
    """In a forked helper process (which inherits the held mask and the parent's handlers):
    ignore Ctrl-C and a hang-up, which the parent handles for the whole command, take SIGTERM
    as the plain end the parent may send, and unblock them all."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)


def raise_interrupt(signum, frame):
    """A signal handler that ends the command like Ctrl-C (KeyboardInterrupt): runs are killed,
    clusters torn down, stored results kept."""
    raise KeyboardInterrupt


def hang_up_terminal(terminals: tuple[int, ...]):
    """A SIGHUP handler: the terminal on `terminals` (file descriptors) is gone, so every
    later write there would fail (EIO) and turn the orderly end into a traceback: point them
    at /dev/null, then end like Ctrl-C."""
    def handler(signum, frame):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in terminals:
            os.dup2(devnull, fd)
        os.close(devnull)
        raise KeyboardInterrupt

    return handler


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP (the terminal closed, the ssh session to it lost) end the command
    like Ctrl-C, so its runs are killed and its clusters torn down before it exits. (What a
    signal that cannot be caught, SIGKILL, leaves behind ends with it by other means: each
    rank's parent-death signal and parent watch, the clusters' reapers.) A signal ignored
    when the command started stays ignored: `nohup` keeps a campaign going past its terminal."""
    handlers = {signal.SIGTERM: raise_interrupt,
                signal.SIGHUP: hang_up_terminal(tuple(fd for fd in (1, 2) if os.isatty(fd)))}
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, handler)


def comma_list(text: str, what: str, error: type[Exception] = ValueError) -> list[str]:
    """The items of a comma list (a flag's value), stripped, in order. An empty item ('1,,2',
    '1,', ',') is bad input, not something to skip: it is usually a typo for a value that was
    meant. Raises `error` (the caller's usage error) with one line naming `what`."""
    items = [part.strip() for part in str(text).split(",")]
    if not any(items):
        raise error(f"{what} is empty")
    if not all(items):
        raise error(f"{what} has an empty item in {text!r}")
    return items


def comma_list_type(text: str) -> list[str]:
    """`comma_list` as an argparse ``type``: a bad list is the parser's one line
    ("argument --models: the comma list has an empty item in 'a,,b'")."""
    return comma_list(text, "the comma list", argparse.ArgumentTypeError)
