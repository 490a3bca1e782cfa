"""The bottom layer's shared pieces: the one file lock, the one atomic writer and the one
comma-list parser every layer uses (core.files, core.cli)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from core.cli import OneLineParser, comma_list, comma_list_type, listed
from core.files import FileLock, file_lock, write_json_atomic, write_text_atomic
from tests.conftest import REPO_ROOT

HOLD = """
import sys, time
from core.files import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def holder(path) -> subprocess.Popen:
    """Another process holding the lock on `path` (it says so, then sleeps)."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO_ROOT,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


# --------------------------------------------------------------------------- the lock

def test_a_held_lock_is_refused_without_waiting_and_taken_over_when_its_holder_is_killed(tmp_path):
    path = tmp_path / "x.lock"
    process = holder(path)
    lock = FileLock(path)
    try:
        assert lock.acquire(wait=False) is False
        assert lock.fd is not None  # still open: the caller may read the holder's note
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert lock.acquire(wait=False) is True
    finally:
        lock.release()
        process.kill()
        process.wait()
    assert lock.fd is None


def test_with_waits_for_the_holder_and_file_lock_makes_the_folder(tmp_path):
    path = tmp_path / "new" / "folder" / "x.lock"
    with file_lock(path) as lock:
        assert path.exists() and lock.fd is not None
        again = FileLock(path)
        assert again.acquire(wait=False) is False  # another open file of this process: refused too
        again.release()
    with FileLock(path):  # released at the end of the block: free again
        pass


def test_the_lock_file_keeps_what_its_holder_wrote(tmp_path):
    path = tmp_path / "x.lock"
    path.write_text("pid 1 (a note)\n")
    with FileLock(path) as lock:
        assert os.pread(lock.fd, 100, 0) == b"pid 1 (a note)\n"


def test_the_lock_is_not_inherited_by_started_processes(tmp_path):
    path = tmp_path / "x.lock"
    with FileLock(path):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with FileLock(path):  # the child still runs, and holds nothing
            assert child.poll() is None
    finally:
        child.kill()
        child.wait()


# --------------------------------------------------------------------------- the writer

def test_write_text_atomic_replaces_the_file_whole(tmp_path):
    path = tmp_path / "report.html"
    write_text_atomic(path, "old")
    write_text_atomic(path, "new · µs")
    assert path.read_text(encoding="utf-8") == "new · µs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "record.json"
    write_json_atomic(path, {"run_id": "kept"})
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "half \ud800 written")  # fails mid-write
    assert json.loads(path.read_text()) == {"run_id": "kept"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_write_json_atomic_writes_numpy_numbers_as_floats(tmp_path):
    import numpy as np

    path = tmp_path / "rank0.json"
    write_json_atomic(path, {"t": np.float32(0.5), "n": 3})
    assert json.loads(path.read_text()) == {"t": 0.5, "n": 3}


def test_readers_never_see_half_a_file(tmp_path):
    """A reader polling while another process rewrites the file sees only whole versions."""
    path = tmp_path / "progress"
    write_text_atomic(path, "0 " + "x" * 100_000)
    code = ("import sys\nfrom core.files import write_text_atomic\n"
            "for i in range(1, 300):\n    write_text_atomic(sys.argv[1], f'{i} ' + 'x' * 100_000)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO_ROOT,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    seen = set()
    deadline = time.monotonic() + 60
    while writer.poll() is None and time.monotonic() < deadline:
        text = path.read_text()
        assert len(text.partition(" ")[2]) == 100_000, "half a file"
        seen.add(text.partition(" ")[0])
    assert writer.wait(timeout=60) == 0
    assert len(seen) > 1


# --------------------------------------------------------------------------- the comma list

def test_a_long_list_of_ids_is_summarised_in_one_line():
    """1,200 ids read as the first three and a count, never as thousands of ids on one line."""
    from analysis.store import imported_line

    ids = [f"torch-ddp-alexnet-w2-b{batch}" for batch in range(1200)]
    line = imported_line(ids)
    assert line == ("imported 1,200 run(s) measured but not yet stored: torch-ddp-alexnet-w2-b0, "
                    "torch-ddp-alexnet-w2-b1, torch-ddp-alexnet-w2-b2 … and 1,197 more")
    assert listed(["a", "b"]) == "a, b" and listed(["a", "b", "c"]) == "a, b, c"


def test_comma_list_strips_and_keeps_the_order():
    assert comma_list(" 4, 1,2 ", "--workers") == ["4", "1", "2"]
    assert comma_list("torch", "--frameworks") == ["torch"]


@pytest.mark.parametrize("text,message", [
    ("1,,2", "--workers has an empty item in '1,,2'"),
    ("1,", "--workers has an empty item in '1,'"),
    ("1, ,2", "--workers has an empty item in '1, ,2'"),
    (",", "--workers is empty"),
    ("", "--workers is empty"),
])
def test_an_empty_item_is_an_error_of_the_callers_kind(text, message):
    class UsageError(ValueError):
        pass

    with pytest.raises(UsageError) as error:
        comma_list(text, "--workers", UsageError)
    assert str(error.value) == message


def test_as_an_argparse_type_a_bad_list_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="bench")
    parser.add_argument("--models", type=comma_list_type, default="alexnet,googlenet")
    assert parser.parse_args([]).models == ["alexnet", "googlenet"]
    with pytest.raises(SystemExit) as end:
        parser.parse_args(["--models", "alexnet,,resnet50"])
    assert end.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dlcompare: error: argument --models: the comma list has an empty item in "
                   "'alexnet,,resnet50'"]
