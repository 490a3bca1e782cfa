"""Faults a hostile but realistic user meets, with the real processes and files: a full disk,
a damaged store, two campaigns on one folder, a campaign killed or its terminal closed, flags
that are not numbers, host names that are options. Each test asserts the exit status, the one
error line, the store's rows before and after, and that no process is left behind.

The full-disk and read-only cases mount a small tmpfs (root; skipped with the reason without).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT, cli_command, default_sigint, run_cli, worker_processes
from tests.test_analysis_data import make_record
from tests.test_cluster import sshd_nodes  # noqa: F401 - the fixture: two nodes behind real sshd

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="mounting a tmpfs (a small or read-only disk) needs root")
FAST = ["--iterations", "2", "--warmup", "1", "--repeats", "1", "--profile-iterations", "1"]
TINY = ["--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "1", *FAST]
# A run that lasts until it is killed: rank 0 hangs at its second step, ignoring SIGTERM.
HANGING = [*TINY, "--inject-fault", "hang:0:2", "--timeout", "600"]
RUN_ID = re.compile(r"torch-ddp-alexnet-tiny-1x1-b\d+-synthetic-[0-9a-f]{6}")


# --------------------------------------------------------------------------- helpers

def stored(out: Path) -> list[tuple[str, str]]:
    """(run_id, status) of every stored run; the connection closed again (a tmpfs with an
    open file cannot be unmounted)."""
    with contextlib.closing(sqlite3.connect(f"file:{out / 'results.sqlite'}?mode=ro", uri=True)) as db:
        return sorted(db.execute("SELECT run_id, status FROM runs").fetchall())


def error_lines(result_stderr: str) -> list[str]:
    return [line for line in result_stderr.splitlines() if line.startswith("dlcompare: error:")]


def assert_one_error(code: int, stderr: str, expected_code: int, *needles: str) -> str:
    """Exit status, exactly one `dlcompare: error:` line holding every needle, no traceback."""
    assert code == expected_code, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def seed(out: Path, *run_ids: str) -> list[tuple[str, str]]:
    """A campaign folder whose store already holds runs (what must survive every fault)."""
    from analysis.store import ResultStore

    with ResultStore.for_campaign(out) as store:
        for run_id in run_ids:
            store.add(make_record("PyTorch DDP", "torch", "ddp", 1, 0.1, run_id=run_id))
    return stored(out)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def start_campaign(out: Path, *args: str, **popen) -> subprocess.Popen:
    """`python -m launchers.compare ... --out OUT` in the background, as a user starts it."""
    command, env = cli_command("launchers.compare", *args, "--out", str(out))
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("preexec_fn", default_sigint)
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, text=True, **popen)


def running(campaign: subprocess.Popen, value):
    """`value`, once the campaign is known to be still running (else its output, to fail with)."""
    if campaign.poll() is not None:
        raise AssertionError(f"the campaign ended ({campaign.returncode}): "
                             f"{(campaign.communicate()[1] or '')[-3000:]}")
    return value


def ranks_of(out: Path) -> list[psutil.Process]:
    """The campaign's rank processes (their command line names the run folder under OUT)."""
    ranks = []
    for process in worker_processes(str(out)):
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.cmdline()[1:3] == ["-m", "adapters.worker"]:
                ranks.append(process)
    return ranks


def assert_all_gone(processes: list[psutil.Process], timeout: float = 15) -> None:
    gone, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"still running: {[(p.pid, p.cmdline()) for p in alive]}"


def kill_tree(process: subprocess.Popen) -> None:
    """Test clean-up only: the campaign and anything it left."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for proc in [*children]:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    if process.poll() is None:
        process.kill()
    process.wait()


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real small file system at `path`, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def fill(folder: Path, leave_bytes: int) -> Path:
    """Fill the file system of `folder` until `leave_bytes` are free."""
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    filler = folder / "filler"
    with open(filler, "wb") as handle:
        handle.write(b"\0" * max(0, free - leave_bytes))
    return filler


@pytest.fixture(scope="module")
def stored_campaign(tmp_path_factory, torch_python) -> Path:
    """One real run, stored, with its report: the folder the slow tests copy."""
    out = tmp_path_factory.mktemp("faults") / "stored"
    result = run_cli("launchers.compare", *TINY, "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


# --------------------------------------------------------------------------- flags and host names

@pytest.mark.parametrize("module,args,needle,dry_run", [
    ("launchers.compare", ["--timeout", "nan"], "--timeout", False),
    ("launchers.compare", ["--workers", "1,,2"], "empty item", True),
    ("launchers.calibrate", ["--timeout", "inf"], "--timeout", False),
])
def test_number_flags_reject_nan_infinity_and_empty_items(tmp_path, module, args, needle, dry_run):
    """As a user meets it: one line, exit 2, the dry run checks what the run checks, nothing
    stored is touched (every other case below, on the same functions)."""
    out = tmp_path / "campaign"
    before = seed(out, "kept")
    result = run_cli(module, *args, "--out", str(out), *(["--dry-run"] if dry_run else []),
                     timeout=120)
    assert_one_error(result.returncode, result.stderr, 2, needle)
    assert stored(out) == before


@pytest.mark.parametrize("check,value,needle", [
    ("seconds", float("nan"), "finite"), ("seconds", float("inf"), "finite"),
    ("seconds", float("-inf"), "finite"), ("seconds", 0.0, "positive"),
    ("ints", "1,,2", "empty item"), ("ints", "1,2,", "empty item"), ("ints", ",", "is empty"),
    ("ints", "", "is empty"), ("ints", "1, ,2", "empty item"), ("ints", "nan", "whole numbers"),
    ("frameworks", "torch,,tf", "empty item"), ("models", "alexnet-tiny,", "empty item"),
    ("bandwidths", "1Gbit,,10Gbit", "empty item"), ("bandwidths", "1e400Gbit", "not a finite"),
    ("latencies", "0.2ms,", "empty item"),
])
def test_every_number_and_list_flag_is_checked(check, value, needle):
    from analysis.units import parse_bandwidth, parse_latency
    from launchers import plan

    checks = {"seconds": lambda v: plan.positive_seconds(v, "--timeout"),
              "ints": lambda v: plan.positive_ints(v, "--workers"),
              "frameworks": plan.parse_frameworks, "models": plan.parse_models,
              "bandwidths": lambda v: plan.parse_links(v, "--bandwidth", parse_bandwidth),
              "latencies": lambda v: plan.parse_links(v, "--latency", parse_latency)}
    with pytest.raises(plan.UsageError, match=re.escape(needle)):
        checks[check](value)


@pytest.mark.parametrize("line,needle", [
    ("-oProxyCommand=touch${IFS}/tmp/dlc-pwned slots=1", "node name '-oProxyCommand"),
    ("node1 user=-oProxyCommand=x", "user '-oProxyCommand=x'"),
    ("node1 interface=eth0;reboot", "interface 'eth0;reboot'"),
    ("node1 address=-1", "address '-1'"),
    ("node1 port=70000", "port must be"),
    ("bad..name", "node name 'bad..name'"),
])
def test_hostfile_names_that_ssh_could_read_as_options_are_bad_input(tmp_path, line, needle):
    from launchers.cluster import TransportError
    from launchers.cluster.ssh import read_hostfile

    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{line}\nnode2 slots=1\n")
    with pytest.raises(TransportError, match=re.escape(needle)) as raised:
        read_hostfile(str(hostfile))
    assert "line 1" in str(raised.value)


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_hostfile_option_as_node_name_is_refused_before_anything_runs(tmp_path, dry_run):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("-oProxyCommand=touch${IFS}/tmp/dlc-pwned slots=1\nnode2 slots=1\n")
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "2", "--workers", "1", "--cluster", f"hostfile:{hostfile}",
                     "--out", str(tmp_path / "c"), *(["--dry-run"] if dry_run else []), timeout=120)
    assert_one_error(result.returncode, result.stderr, 2, "node name", "line 1")
    assert not (tmp_path / "c").exists() and not Path("/tmp/dlc-pwned").exists()


def test_ssh_destination_follows_double_dash(tmp_path):
    """A valid node still reaches ssh after `--`, with its options before it, and its remote
    command watches the session's stdin (the lifeline)."""
    from launchers.cluster.ssh import REMOTE_WATCH, read_hostfile

    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu-node_1.example.org slots=2 user=alice port=2222 interface=ib0\n"
                        "10.0.0.2 slots=2\n")
    nodes = read_hostfile(str(hostfile))
    assert nodes[0].ssh()[-2:] == ["--", "alice@gpu-node_1.example.org"]
    assert "-p" in nodes[0].ssh_options() and "--" not in nodes[0].ssh_options()
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "2", "--workers", "1", "--cluster", f"hostfile:{hostfile}",
                     "--out", str(tmp_path / "c"), "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert " -- alice@gpu-node_1.example.org " in result.stderr
    assert REMOTE_WATCH.split(";")[0] in result.stderr


@needs_root
def test_dry_run_reads_a_stored_campaign_without_write_access(tmp_path):
    """--dry-run on a read-only file system: the plan shows what is stored, nothing written."""
    folder = tmp_path / "ro"
    with tmpfs(folder, "4m"):
        out = folder / "campaign"
        planned = run_cli("launchers.compare", *TINY, "--out", str(out), "--dry-run", timeout=120)
        assert planned.returncode == 0, planned.stderr[-3000:]
        run_id = RUN_ID.search(planned.stderr).group(0)
        seed(out, run_id, "older")
        files = {p.name: p.read_bytes() for p in out.iterdir()}
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        result = run_cli("launchers.compare", *TINY, "--out", str(out), "--dry-run", timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "1 already stored" in result.stderr and not error_lines(result.stderr)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == files


# --------------------------------------------------------------------------- the store

def test_a_full_store_says_why_and_keeps_every_row(tmp_path):
    """SQLITE_FULL (the page limit stands in for the disk): SQLite rolls the transaction back
    itself; the error is its cause, not "cannot rollback", and the rows before are all there."""
    from analysis.store import ResultStore, StoreError

    out = tmp_path / "campaign"
    before = seed(out, "a", "b")
    with ResultStore.for_campaign(out) as store:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        big = make_record("PyTorch DDP", "torch", "ddp", 1, 0.1, run_id="big",
                          extra={"blob": "x" * 200_000})
        with pytest.raises(StoreError) as raised:
            store.add(big)
        assert "database or disk is full" in str(raised.value)
        assert "rollback" not in str(raised.value) and "\n" not in str(raised.value)
        assert not store._conn.in_transaction
    assert stored(out) == before


def test_schema_version_migrates_old_stores_and_refuses_newer(tmp_path):
    from analysis.store import SCHEMA_VERSION, ResultStore, StoreError

    old = tmp_path / "old.sqlite"  # a store from before the version was kept (version 0)
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, framework TEXT, model TEXT, "
                   "status TEXT, extra_json TEXT)")
        db.execute("""INSERT INTO runs VALUES ('r', 'torch', 'm', 'ok', '{"hosts": 2, "gbit": 2.5, "tag": "x"}')""")
        db.commit()
    with ResultStore(old, create=False) as store:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        frame = store.runs_frame()
        assert str(frame["extra_hosts"].dtype) == "Int64" and frame["extra_hosts"][0] == 2
        assert frame["extra_gbit"].dtype == "float64" and frame["extra_tag"][0] == "x"
        assert store.meta() == {} and store.calibrations() == []  # the tables it lacked
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than"):
        ResultStore(old)


def test_reading_a_campaign_that_does_not_exist_creates_nothing(tmp_path):
    from analysis.store import NoStore, ResultStore

    for read_only in (False, True):
        with pytest.raises(NoStore, match="no result store"):
            ResultStore.for_campaign(tmp_path / "absent", create=False, read_only=read_only)
    assert not (tmp_path / "absent").exists()
    result = run_cli("analysis.report", str(tmp_path / "absent"), timeout=120)
    assert_one_error(result.returncode, result.stderr, 2, "no result store")
    assert not (tmp_path / "absent").exists()


def damage(path: Path) -> None:
    """Overwrite two pages past the header with garbage, as a failing disk or a stray write
    would; the header (page 1, the schema) stays readable."""
    page = 4096
    with open(path, "r+b") as handle:
        handle.seek(2 * page)
        handle.write(os.urandom(2 * page))


def damaged_campaign(out: Path, runs: int = 60) -> tuple[list[tuple[str, str]], str]:
    """A store with `runs` runs over many pages, each run also kept in its run folder as the
    campaign keeps it, then damaged; returns (the rows before, the file's digest)."""
    from analysis.store import ResultStore

    with ResultStore.for_campaign(out) as store:
        for i in range(runs):
            record = make_record("PyTorch DDP", "torch", "ddp", 1, 0.1, run_id=f"run-{i:03d}")
            store.add(record)
            if i % 2 == 0:  # half of them still have their run folder
                (out / "runs" / record["run_id"]).mkdir(parents=True)
                (out / "runs" / record["run_id"] / "record.json").write_text(json.dumps(record))
        store.set_meta("command", "python -m launchers.compare ...")
    before = stored(out)
    damage(out / "results.sqlite")
    return before, hashlib.sha256((out / "results.sqlite").read_bytes()).hexdigest()


def test_a_damaged_store_is_never_written_and_repair_salvages_it(tmp_path):
    """Every entry point refuses it in one line (exit 3) and leaves the file as it was;
    `python -m analysis.store repair` salvages its readable rows and the run folders' records
    into a new store and keeps the damaged file."""
    from analysis.store import ResultStore

    out = tmp_path / "campaign"
    before, digest = damaged_campaign(out)
    for module, args in (("launchers.compare", [*TINY, "--out", str(out)]),
                         ("launchers.compare", [*TINY, "--out", str(out), "--dry-run"]),
                         ("launchers.calibrate", ["--workers", "2", "--out", str(out)]),
                         ("analysis.report", [str(out)])):
        result = run_cli(module, *args, timeout=120)
        assert_one_error(result.returncode, result.stderr, 3, "is damaged", "--repair")
        assert hashlib.sha256((out / "results.sqlite").read_bytes()).hexdigest() == digest
    assert not (out / "report.html").exists()

    result = run_cli("analysis.store", "repair", str(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "repaired" in result.stdout and "kept as results.sqlite.damaged-" in result.stdout
    (kept,) = out.glob("results.sqlite.damaged-*Z")  # with its -wal and -shm beside it
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == digest
    after = stored(out)
    assert set(after) <= set(before)
    assert {(f"run-{i:03d}", "ok") for i in range(0, 60, 2)} <= set(after)  # every run folder
    assert len(after) > 30  # and readable rows of the others
    with ResultStore.for_campaign(out, create=False) as store:
        assert store._conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    again = run_cli("analysis.store", "repair", str(out), timeout=120)
    assert again.returncode == 0 and "nothing to repair" in again.stdout


# --------------------------------------------------------------------------- processes

def test_a_timeout_whose_ranks_printed_nothing_says_so(tmp_path):
    """The real local transport with a rank that hangs silently: the error's last line says
    it printed nothing, and no process is left."""
    from adapters.base import RunConfig
    from launchers.local import run_local

    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    run_dir = tmp_path / "run"
    config = RunConfig(run_id="silent", framework="torch", mode="ddp", model="alexnet-tiny",
                       batch_per_worker=4, workers_per_node=2, rank_dir=str(run_dir),
                       record_path=str(run_dir / "record.json"))
    outcome = run_local(config, str(silent), run_dir, "torch", REPO_ROOT, timeout=1)
    assert outcome.status == "timeout"
    assert outcome.error.startswith("timed out after 1 s; still running: worker0, worker1")
    assert outcome.error.splitlines()[-1] == "--- worker1 printed nothing on stderr"
    assert worker_processes(str(run_dir)) == []


def test_slurm_heartbeat_abandons_a_run_whose_campaign_is_gone(tmp_path):
    """The job's side notices a heartbeat that stopped changing; a beating one keeps it."""
    from launchers.cluster.slurm import Heartbeat, LauncherGone

    path = tmp_path / "heartbeat"
    campaign = Heartbeat(path)
    job = Heartbeat(path, lost_after=0.5, check_every=0.05)
    for _ in range(15):  # beating: never lost
        campaign.beat()
        time.sleep(0.06)
        job.check()
    with pytest.raises(LauncherGone, match="stopped"):
        for _ in range(40):
            time.sleep(0.06)
            job.check()


@pytest.mark.slow
def test_one_campaign_per_folder_and_a_dead_holder_is_taken_over(tmp_path, torch_python):
    """A second campaign (or calibration) on a busy folder is refused in one line naming the
    holder; with --wait it waits, and takes the folder over when the holder is SIGKILLed,
    whose ranks die with it (parent-death signal)."""
    out = tmp_path / "campaign"
    before = seed(out, "kept")
    holder = start_campaign(out, *HANGING)
    waiter = None
    try:
        ranks = wait_for(lambda: ranks_of(out), 240, "the holder's rank")
        for module, args in (("launchers.compare", TINY),
                             ("launchers.calibrate", ["--workers", "2"])):
            refused = run_cli(module, *args, "--out", str(out), timeout=120)
            assert_one_error(refused.returncode, refused.stderr, 2, "in use by", f"pid {holder.pid}")
        log = tmp_path / "waiter.log"
        with open(log, "w") as stderr:
            waiter = start_campaign(out, *TINY, "--wait", stderr=stderr)
        wait_for(lambda: "waiting (--wait)" in log.read_text(), 120, "the second campaign to wait")
        time.sleep(1)
        assert waiter.poll() is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        assert_all_gone(ranks, timeout=10)  # no rank outlives its campaign
        waiter.communicate(timeout=600)
        err = log.read_text()
        assert waiter.returncode == 0, err[-3000:]
        assert f"pid {holder.pid}" in err and "ended without releasing it; taken over" in err
        after = stored(out)
        assert set(before) < set(after) and len(after) == 2  # the hung run was never stored
        assert worker_processes(str(out)) == []
    finally:
        for process in (holder, waiter):
            if process is not None:
                kill_tree(process)


def closed_terminal_campaign(out: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """A campaign whose stdin, stdout and stderr are a terminal (a pty) that controls its
    session, as in an interactive shell; returns it and the terminal's master side, which a
    thread drains so the campaign never blocks on output."""
    master, slave = os.openpty()

    def controlling_terminal():  # and the signals as an interactive shell leaves them, even
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # when the suite itself runs under nohup or in `&`
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    campaign = start_campaign(out, *args, stdin=slave, stdout=slave, stderr=slave,
                              start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    output = bytearray()

    def drain():
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                output.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    campaign.output = output
    return campaign, master


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["local", "emulated"])
def test_closing_the_terminal_ends_the_campaign_and_its_ranks(tmp_path, torch_python, cluster):
    """The terminal closes (SIGHUP to its session, EIO on every write after): the campaign
    ends like Ctrl-C (exit 130), kills its ranks, removes its cluster, keeps what is stored."""
    if cluster == "emulated" and not ROOT:
        pytest.skip("the emulated cluster needs root")
    out = tmp_path / cluster
    before = seed(out, "kept")
    nodes = ["--cluster", "emulated", "--nodes", "2"] if cluster == "emulated" else []
    campaign, master = closed_terminal_campaign(out, *HANGING, *nodes)
    try:
        ranks = wait_for(lambda: len(ranks_of(out)) == (2 if nodes else 1) and ranks_of(out),
                         300, "the ranks")
        os.close(master)  # the terminal window closes
        assert campaign.wait(timeout=120) == 130, bytes(campaign.output)[-3000:]
        assert_all_gone(ranks)
        assert stored(out) == before
        if nodes:
            from launchers.cluster.emulated import leftovers

            assert leftovers(campaign.pid) == {"netns": [], "links": [], "dirs": []}
    finally:
        kill_tree(campaign)


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("when", ["starting", "training"])
def test_ranks_on_ssh_nodes_die_with_a_killed_campaign(tmp_path, torch_python, sshd_nodes, when):  # noqa: F811
    """SIGKILL of a campaign whose ranks run on two nodes reached through real sshd, while
    the ranks start (the remote watch of the session's stdin ends them) or train (so do the
    ranks' own parent watches)."""
    from launchers.cluster.emulated import namespace_pids

    hostfile, cluster, daemons, _ = sshd_nodes
    sshd = {d.pid for d in daemons}
    out = tmp_path / "ssh"

    def remote(ranks_only: bool) -> list[int]:
        """The nodes' processes of the run: its ranks, or (False) also the session shells and
        watches that started them."""
        found = []
        for pid in (pid for node in range(2) for pid in namespace_pids(cluster.namespace(node))):
            with contextlib.suppress(psutil.NoSuchProcess):
                argv = psutil.Process(pid).cmdline()
                if pid not in sshd and (argv[1:3] == ["-m", "adapters.worker"] if ranks_only
                                        else str(out) in " ".join(argv)):
                    found.append(pid)
        return found

    log = tmp_path / "campaign.log"
    with open(log, "w") as stderr:
        campaign = start_campaign(out, *HANGING, "--nodes", "2", "--cluster",
                                  f"hostfile:{hostfile}", stderr=stderr)
    try:
        try:
            wait_for(lambda: campaign.poll() is None and len(remote(ranks_only=True)) == 2, 300,
                     "a rank on each node")
        except AssertionError:
            raise AssertionError(f"{log.read_text()[-3000:]}\n" + "\n".join(
                f"node {node}: {[psutil.Process(p).cmdline() for p in namespace_pids(cluster.namespace(node))]}"
                for node in range(2))) from None
        if when == "training":
            wait_for(lambda: list(out.glob("runs/*/progress")), 300, "the first steps")
        campaign.send_signal(signal.SIGKILL)
        campaign.wait(timeout=30)
        # without the watches they train on, re-parented to the node's init
        wait_for(lambda: not remote(ranks_only=False), 10, "the remote ranks to go")
    finally:
        kill_tree(campaign)


# A launcher that starts its reaper and one container labelled with its pid, then waits.
LABELLING_LAUNCHER = """
import os, subprocess, sys, time
from launchers.container_runtime import OWNER_LABEL
from launchers.engine import find_engine
from launchers.local import start_reaper
engine = find_engine(install=False)
start_reaper("launchers.container_runtime", str(os.getpid()), engine.name, engine.path, env=engine.env)
subprocess.run(engine.command("run", "-d", *engine.pull_flag(), "--label", f"{OWNER_LABEL}={os.getpid()}",
                              sys.argv[1], "/bin/sleep", "600"), env=engine.process_env(), check=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_container_reaper_removes_the_containers_of_a_killed_launcher(tmp_path):
    """The reaper with the real engine and a one-binary image (a static busybox): the
    launcher is SIGKILLed while its container runs; the container goes all the same."""
    from launchers.container_runtime import owned_containers
    from launchers.engine import EngineError, find_engine

    busybox = shutil.which("busybox")
    linked = subprocess.run(["ldd", busybox], capture_output=True, text=True) if busybox else None
    if linked is None or "not a dynamic" not in linked.stdout + linked.stderr:
        pytest.skip("needs a static busybox (Debian: busybox-static) for a one-binary image")
    try:
        engine = find_engine(install=False)
    except EngineError as error:
        pytest.skip(f"no container engine: {error}")
    root = tmp_path / "rootfs" / "bin"
    root.mkdir(parents=True)
    shutil.copy(busybox, root / "busybox")
    (root / "sleep").symlink_to("busybox")
    image = "localhost/dlcompare-test/busybox:reaper"
    imported = subprocess.run(f"tar -C {tmp_path / 'rootfs'} -c . | {engine.path} import - {image}",
                              shell=True, env=engine.process_env(), capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr[-2000:]
    launcher = subprocess.Popen([sys.executable, "-c", LABELLING_LAUNCHER, image], cwd=REPO_ROOT,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        wait_for(lambda: running(launcher, owned_containers(engine, launcher.pid)), 120,
                 "the launcher's container")
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_for(lambda: not owned_containers(engine, launcher.pid), 120,
                 "the reaper to remove the container")
    finally:
        kill_tree(launcher)
        subprocess.run(engine.command("rmi", "--force", image), env=engine.process_env(),
                       capture_output=True)


@pytest.mark.slow
def test_containers_of_a_killed_campaign_are_removed(tmp_path):
    """SIGKILL of a campaign whose rank runs in a container (whose processes belong to the
    engine, not to the campaign): its reaper removes the containers it labelled."""
    from launchers.container_runtime import owned_containers
    from tests.test_containers import build, engine

    built = build("pytorch")  # reused when tests/test_containers.py built it already
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "containers"
    campaign = start_campaign(out, "--runtime", "container", *HANGING)
    try:
        containers = engine()
        wait_for(lambda: running(campaign, owned_containers(containers, campaign.pid)), 600,
                 "the run's container")
        wait_for(lambda: list(out.glob("runs/*/progress")), 300, "the rank's first steps")
        campaign.send_signal(signal.SIGKILL)
        campaign.wait(timeout=30)
        wait_for(lambda: not owned_containers(containers, campaign.pid), 120,
                 "the reaper to remove the containers")
        wait_for(lambda: not worker_processes(str(out)), 30, "the container's processes to go")
    finally:
        kill_tree(campaign)


# --------------------------------------------------------------------------- a full disk, an interrupted report

@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("stage,leave_kib,needle", [
    ("store", 20, "was measured but not stored"),
    ("report", 40, "report not written"),
])
def test_a_full_disk_loses_nothing_measured(tmp_path, stored_campaign, stage, leave_kib, needle):
    """The disk fills while a run is measured: the run's record is kept in its folder when
    the store cannot take it, or stored when only the report cannot be written; exit 3 with
    one line either way; the rows stored before stay. With space again, the same command
    stores the kept record without measuring it again, and writes the report."""
    with tmpfs(tmp_path / "disk", "4m") as disk:
        out = disk / "campaign"
        shutil.copytree(stored_campaign, out)
        before = stored(out)
        # the run's trace (written after its record, a warning when it cannot be) takes as
        # much as a stored run's, on top of what the stage under test is left
        trace_bytes = max((p.stat().st_size for p in out.glob("runs/*/trace.json")), default=0)
        args = [*TINY, "--batch-size", "8"]  # one more run
        campaign = start_campaign(out, *args)
        try:
            run_json = wait_for(lambda: list(out.glob("runs/*-b8-*/RUN.json")), 240, "the run to start")
            filler = fill(disk, leave_kib * 1024 + trace_bytes)
            _, err = campaign.communicate(timeout=600)
        finally:
            kill_tree(campaign)
        assert_one_error(campaign.returncode, err, 3, needle)
        assert set(before) <= set(stored(out))
        assert worker_processes(str(out)) == []
        started = run_json[0].stat().st_mtime_ns
        filler.unlink()
        again = run_cli("launchers.compare", *args, "--out", str(out), timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(stored(out)) == len(before) + 1 and all(s == "ok" for _, s in stored(out))
        assert run_json[0].stat().st_mtime_ns == started  # not measured again
        if stage == "store":
            assert "imported 1 run(s)" in again.stderr
        assert (out / "report.html").stat().st_size > 10_000


@pytest.mark.slow
def test_ctrl_c_while_the_report_is_written_keeps_the_store_and_the_old_report(tmp_path, stored_campaign):
    out = tmp_path / "campaign"
    shutil.copytree(stored_campaign, out)
    report = (out / "report.html").read_bytes()
    before = stored(out)
    shutil.rmtree(out / "tables")
    campaign = start_campaign(out, *TINY)
    try:
        wait_for(lambda: (out / "tables").exists(), 240, "the report to be under way")
        campaign.send_signal(signal.SIGINT)
        _, err = campaign.communicate(timeout=120)
    finally:
        kill_tree(campaign)
    assert campaign.returncode == 130, err[-3000:]
    assert "interrupted while writing the report" in err and "Traceback" not in err
    assert stored(out) == before
    assert (out / "report.html").read_bytes() == report
