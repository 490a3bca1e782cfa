"""Local transport: every process of a run as a subprocess of this machine, in one group.

All processes (workers, parameter servers, schedulers, and whatever they start: data-loader
workers and the like) share one process group, so a timeout or any process's failure ends the
whole run with one killpg; a sweep over descendants catches anything that left the group. The
run succeeds when every worker exited 0; serving roles are then ended. Each process's stderr
goes to a file in the run folder, and the failing one's tail becomes the record's error.

No process outlives the launcher, however the launcher ends (SIGKILL, the OOM killer, a closed
terminal), which the killpg above cannot promise since it needs the launcher alive:

- every process started here gets a parent-death signal (Linux `PR_SET_PDEATHSIG`, SIGKILL):
  the kernel kills it when the thread that started it ends. `run_local` waits for its
  processes before it returns, so that thread outlives them whenever the launcher lives;
- every process's stdin is a pipe the launcher holds and never writes: it reaches end-of-file
  when the launcher is gone, and remote wrappers watch it (launchers/cluster/ssh.py: ssh
  carries it to the node, where end-of-file kills the node's process group);
- each rank watches its own parent (adapters/worker.py), which covers ranks started by a
  framework launcher (mpirun, horovodrun) or by sshd;
- transports and runtimes with state of their own (network namespaces, containers, Slurm
  jobs) have a reaper or a heartbeat of their own (`start_reaper`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from core.cli import interrupts_held
from core.envs import REPO_ROOT
from launchers.rendezvous import Host, ProcessSpec, processes_for

if TYPE_CHECKING:  # NumPy comes with it; this module is read before the launcher's environment
    from adapters.base import RunConfig

EXIT_UNAVAILABLE = 3  # the worker's exit code when the framework cannot run here
POLL_SECONDS = 0.1
TAIL_LINES = 25

# How a process's command is placed: given its spec, its argv and its environment, return the
# argv and environment to start on this machine. The identity runs it here as is; a cluster
# transport wraps it to run on its node (`ip netns exec`, ssh, srun), a container runtime in its
# framework's image (`podman run`). Wrappers compose, innermost first.
CommandWrapper = Callable[[ProcessSpec, list[str], dict[str, str]],
                          tuple[list[str], dict[str, str]]]


@dataclass
class RunOutcome:
    status: str  # ok, failed, timeout, unavailable
    error: str | None
    duration_s: float


def stderr_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def thread_env(threads: int) -> dict[str, str]:
    """Cap every math library's threads so ranks sharing a machine do not oversubscribe it."""
    value = str(max(1, threads))
    return {name: value for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                     "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")}


PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent():
    """A `preexec_fn`: the child gets SIGKILL when its parent (the thread that forks it) ends,
    and exits at once if that already happened between fork and here. Prepared before the
    fork, so the child runs no more Python than one ctypes call."""
    parent = os.getpid()
    prctl = _LIBC.prctl if _LIBC is not None else None

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


class ProcessGroupRun:
    """The processes of one run, started together and ended together."""

    def __init__(self, config: RunConfig, python: str, run_dir: Path, rendezvous_kind: str,
                 cwd: Path, extra_env: dict[str, str] | None = None,
                 hosts: list[Host] | None = None, wrappers: list[CommandWrapper] = (),
                 lifelines: bool = True):
        self.config = config
        self.lifelines = lifelines  # False only to measure their cost (bench/fault_overhead.py)
        self.run_dir = run_dir
        self.specs: list[ProcessSpec] = processes_for(rendezvous_kind, config, hosts)
        self.wrappers = list(wrappers)
        self.python = python
        self.cwd = cwd
        self.extra_env = extra_env or {}
        self.processes: list[subprocess.Popen] = []
        self.pgid: int | None = None

    def commands(self, run_json: Path) -> list[tuple[ProcessSpec, list[str], dict[str, str]]]:
        """(spec, argv, environment) of every process, wrappers applied: what `start` runs and
        what a dry run prints."""
        base = {**os.environ, **thread_env(self.config.threads_per_worker),
                "PYTHONPATH": str(self.cwd), "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo",
                **self.extra_env, **({} if self.lifelines else {"DLC_PARENT_WATCH": "0"})}
        base.pop("DLCOMPARE_HOST_ENV", None)
        placed = []
        for spec in self.specs:
            # `{python}` in a launcher item is the framework environment's interpreter
            # (horovodrun is run as `{python} -m horovod.runner.launch`).
            launcher = [item.replace("{python}", self.python) for item in spec.launcher]
            argv = [*launcher, self.python, "-m", "adapters.worker", str(run_json)]
            env = {**base, **spec.env}
            for wrap in self.wrappers:
                argv, env = wrap(spec, argv, env)
            placed.append((spec, argv, env))
        return placed

    def start(self, run_json: Path) -> None:
        preexec = die_with_parent() if self.lifelines else None
        for spec, argv, env in self.commands(run_json):
            stderr = open(self.run_dir / f"{spec.name}.stderr", "wb")
            stdout = open(self.run_dir / f"{spec.name}.stdout", "wb")
            process = subprocess.Popen(
                argv, cwd=self.cwd, env=env, stdout=stdout, stderr=stderr,
                # the lifeline: end-of-file once this process is gone
                stdin=subprocess.PIPE if self.lifelines else subprocess.DEVNULL,
                process_group=0 if self.pgid is None else self.pgid, preexec_fn=preexec)
            stdout.close()
            stderr.close()
            if self.pgid is None:
                self.pgid = process.pid
            self.processes.append(process)

    def wait(self, timeout: float, on_progress=None) -> RunOutcome:
        started = time.monotonic()
        try:
            while True:
                codes = [p.poll() for p in self.processes]
                failed = [(spec, code) for spec, code in zip(self.specs, codes)
                          if code is not None and code != 0]
                if failed:
                    return self._failure(*failed[0], started)
                if all(code == 0 for spec, code in zip(self.specs, codes) if spec.is_worker):
                    return RunOutcome("ok", None, time.monotonic() - started)
                if time.monotonic() - started > timeout:
                    return self._timeout(codes, timeout, started)
                if on_progress:
                    on_progress(self.progress())
                time.sleep(POLL_SECONDS)
        finally:
            self.kill()

    def _failure(self, spec: ProcessSpec, code: int, started: float) -> RunOutcome:
        self.kill()  # before reading: the others may still be writing
        tail = stderr_tail(self.run_dir / f"{spec.name}.stderr")
        status = "unavailable" if code == EXIT_UNAVAILABLE else "failed"
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        cause = tail.splitlines()[-1].strip()[:200] if tail else ""
        return RunOutcome(status, f"{spec.role} {spec.index} {how}"
                          + (f": {cause}" if cause else "") + f"\n{tail}",
                          time.monotonic() - started)

    def _timeout(self, codes, timeout, started) -> RunOutcome:
        self.kill()
        running = [spec.name for spec, code in zip(self.specs, codes) if code is None]
        tails = "\n".join(
            f"--- {name} stderr:\n{tail}" if tail else f"--- {name} printed nothing on stderr"
            for name, tail in ((name, stderr_tail(self.run_dir / f"{name}.stderr", 8))
                               for name in running))
        return RunOutcome("timeout", f"timed out after {timeout:g} s; still running: "
                          f"{', '.join(running)}\n{tails}", time.monotonic() - started)

    def progress(self) -> tuple[int, int] | None:
        try:
            done, total, _ = (self.run_dir / "progress").read_text().split()
            return int(done), int(total)
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        """SIGKILL the process group and any stray descendant, then reap every rank."""
        # psutil is the launcher environment's; the transports read this module before the move
        import psutil

        if self.pgid is None:
            return
        strays = []
        for process in self.processes:
            try:
                strays += psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for stray in strays:
            try:
                stray.kill()
            except psutil.NoSuchProcess:
                pass
        for process in self.processes:
            process.wait()
            if process.stdin:
                process.stdin.close()  # the lifeline ends: whatever watches it on a node goes
        psutil.wait_procs(strays, timeout=5)
        wait_group_gone(self.pgid)


def wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def start_reaper(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `python -m MODULE reap ARGS...`: a process in its own session (a closed terminal
    or a killed process group does not reach it) that cleans up after this process once it
    is gone, however it ends (SIGKILL included), because it waits on a pipe only this
    process holds (`wait_for_owner`). `stop_reaper` ends it when there is nothing left."""
    return subprocess.Popen(
        [sys.executable, "-m", module, "reap", *args], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=REPO_ROOT, env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO_ROOT)})


def stop_reaper(reaper: subprocess.Popen | None) -> None:
    """This process cleaned up itself: close the reaper's pipe and let it exit."""
    if reaper is None:
        return
    reaper.stdin.close()
    try:
        reaper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reaper.kill()


def wait_for_owner(owner: int, done: Callable[[], bool] = lambda: False,
                   grace: float = 30.0) -> None:
    """In a reaper: ignore the signals that end a terminal's jobs, wait until the owner's
    pipe closes (the owner closed it or died), then until the owner is gone or `done()` says
    the owner already cleaned up, at most `grace` seconds."""
    # psutil is the launcher environment's; the transports read this module before the move
    import psutil

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    sys.stdin.buffer.read()
    deadline = time.monotonic() + grace
    while psutil.pid_exists(owner) and not done() and time.monotonic() < deadline:
        time.sleep(0.2)


def run_local(config: RunConfig, python: str, run_dir: Path, rendezvous_kind: str, cwd: Path,
              timeout: float, on_progress=None, extra_env: dict[str, str] | None = None,
              hosts: list[Host] | None = None, wrappers: list[CommandWrapper] = (),
              lifelines: bool = True) -> RunOutcome:
    """Write RUN.json, start every rank, wait for all of them or the first failure.

    `hosts` (one per node) and `wrappers` let a cluster transport or a container runtime place
    the processes; by default every process runs here, on loopback. `lifelines=False` starts
    them without parent-death signal, stdin lifeline and parent watch: only to measure what
    those cost (bench/fault_overhead.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_json = run_dir / "RUN.json"
    config.to_json(run_json)
    group = ProcessGroupRun(config, python, run_dir, rendezvous_kind, cwd, extra_env, hosts,
                            wrappers, lifelines)
    try:
        # Ctrl-C is held back while the processes start, so none can be forked without being
        # tracked; delivered right after, it lands in the except below and kills them all.
        # (Only Ctrl-C: the ranks inherit the mask and must still die of SIGTERM.)
        with interrupts_held(frozenset({signal.SIGINT})):
            group.start(run_json)
        return group.wait(timeout, on_progress)
    except BaseException:
        group.kill()
        raise


def planned_commands(config: RunConfig, python: str, rendezvous_kind: str, cwd: Path,
                     extra_env: dict[str, str] | None = None, hosts: list[Host] | None = None,
                     wrappers: list[CommandWrapper] = ()) -> list[tuple[ProcessSpec, list[str], dict[str, str]]]:
    """What `run_local` would start for `config`, without starting anything: (spec, argv,
    the environment variables the run sets beyond this process's own) per process."""
    group = ProcessGroupRun(config, python, Path(config.rank_dir or "."), rendezvous_kind, cwd,
                            extra_env, hosts, wrappers)
    own = dict(os.environ)
    return [(spec, argv, {k: v for k, v in env.items() if own.get(k) != v})
            for spec, argv, env in group.commands(Path(config.rank_dir or ".") / "RUN.json")]
