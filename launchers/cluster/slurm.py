"""Slurm: `--cluster slurm`: one sbatch job per run; the campaign collects the record when it ends.

For each run the campaign writes `runs/<id>/job.sbatch` (printed by --dry-run) and submits it
with `sbatch --parsable`. The job asks for the run's nodes and one task per worker per node,
and runs this module inside the allocation (`python -m launchers.cluster.slurm inside ...`
with the launcher's own interpreter), which places the run's processes with the same
rendezvous as every other transport (launchers/rendezvous/): the allocation's nodes (from
SLURM_JOB_NODELIST via `scontrol show hostnames`) are the hosts; every process of a per-rank
rendezvous (torch, TF_CONFIG, ps-lite) is started on its node by `srun --nodes=1 --ntasks=1
--nodelist=NODE --export=ALL`, and a framework launcher (mpirun, horovodrun) runs on the job's
first node and reaches the others its own way (OpenMPI's Slurm support starts its daemons with
srun). The inside part writes `outcome.json` (status and error, as the local transport
decides them); rank 0 writes the record as always. The campaign polls `squeue` until the job
is gone, cancels it (`scancel`) on timeout or Ctrl-C, and reads both files.

Like the ssh transport this needs the repository, ~/.cache/dlcompare and the campaign folder
at the same path on every node (a shared file system), as Slurm clusters have.

A job outlives the campaign that submitted it unless told otherwise: the campaign rewrites
`runs/<id>/heartbeat` at every poll, and the inside part ends the run (and so the job) when
it has not changed for `HEARTBEAT_LOST_S` (the campaign was killed, or its machine lost).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.cli import OneLineParser
from core.envs import REPO_ROOT
from core.files import write_text_atomic
from launchers.cluster import Transport, TransportError
from launchers.rendezvous import Host

POLL_SECONDS = 2.0
START_GRACE_S = 600  # waiting in the queue does not count against the run's timeout
HEARTBEAT_LOST_S = 120.0  # a shared file system may show a change this late (NFS caching)
HEARTBEAT_CHECK_S = 5.0


class LauncherGone(RuntimeError):
    """The campaign's heartbeat stopped: nobody will collect or cancel this run."""


class Heartbeat:
    """The campaign's sign of life for a job, through the shared file system: a counter the
    campaign rewrites (`beat`) and the job reads (`check`). Only whether it changes counts,
    never a timestamp, so the clocks of the nodes need not agree."""

    def __init__(self, path: Path, lost_after: float = HEARTBEAT_LOST_S,
                 check_every: float = HEARTBEAT_CHECK_S):
        self.path = path
        self.lost_after = lost_after
        self.check_every = check_every
        self.count = 0
        self.seen: str | None = None
        self.changed_at = self.checked_at = time.monotonic()

    def beat(self) -> None:
        self.count += 1
        write_text_atomic(self.path, str(self.count))

    def check(self, _progress=None) -> None:
        """Raise LauncherGone when the counter has not changed for `lost_after` seconds (an
        `on_progress` callback of run_local: called at each of its polls)."""
        now = time.monotonic()
        if now - self.checked_at < self.check_every:
            return
        self.checked_at = now
        try:
            value = self.path.read_text()
        except OSError:
            value = None
        if value != self.seen:
            self.seen, self.changed_at = value, now
        elif now - self.changed_at > self.lost_after:
            raise LauncherGone(f"the campaign's heartbeat ({self.path}) stopped "
                               f"{now - self.changed_at:.0f} s ago: run abandoned")


class SlurmCluster(Transport):
    """Runs through sbatch; `hosts`/`wrappers` apply inside the job (see `inside`). Nothing
    is placed from the campaign's side: no wrappers, no link counters, nothing to tear down."""

    kind = "slurm"
    summary = "an sbatch job per run on a Slurm cluster's nodes"

    def __init__(self, partition: str | None = None):
        self.partition = partition or os.environ.get("DLCOMPARE_SLURM_PARTITION")

    def check_machine(self) -> None:
        missing = [tool for tool in ("sbatch", "squeue", "scancel") if shutil.which(tool) is None]
        if missing:
            raise TransportError(f"--cluster slurm needs Slurm's {', '.join(missing)} on PATH "
                                 "(run the campaign on a login node of the cluster)")

    def check_calibration(self) -> None:
        raise TransportError("launchers.calibrate does not submit jobs: on Slurm run it inside an "
                             "allocation with --cluster hostfile:FILE")

    # -- the job script ---------------------------------------------------------------------

    def script(self, run, python: str, kind: str, timeout: float | None = None,
               extra_env: dict[str, str] | None = None) -> str:
        """The sbatch script of one run."""
        run_dir = Path(run.rank_dir)
        minutes = max(1, math.ceil((timeout or 900) / 60) + 1)
        lines = ["#!/bin/bash",
                 f"#SBATCH --job-name=dlc-{run.run_id[:100]}",
                 f"#SBATCH --nodes={run.nodes}",
                 f"#SBATCH --ntasks-per-node={run.workers_per_node}",
                 f"#SBATCH --cpus-per-task={max(1, run.threads_per_worker)}",
                 f"#SBATCH --time={minutes}",
                 f"#SBATCH --output={run_dir / 'slurm-%j.out'}",
                 f"#SBATCH --chdir={REPO_ROOT}"]
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        if run.device == "gpu":
            lines.append(f"#SBATCH --gpus-per-node={run.workers_per_node}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted((extra_env or {}).items()))
        lines += ["set -eu",
                  f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}",
                  " ".join(filter(None, [
                      f"exec env {env}" if env else "exec",
                      shlex.quote(sys.executable), "-m", "launchers.cluster.slurm", "inside",
                      shlex.quote(str(run_dir / "RUN.json")), "--kind", kind,
                      "--python", shlex.quote(python), "--timeout", str(int(timeout or 900))])),
                  ""]
        return "\n".join(lines)

    # -- the campaign's side ----------------------------------------------------------------

    def hosts(self, run) -> list[Host]:
        return []  # known only inside the allocation

    def prepare(self, run) -> dict:
        return {"cluster": self.kind}

    def describe(self) -> list[str]:
        return ["slurm: one sbatch job per run; inside it the processes are placed with srun "
                "(or mpirun / horovodrun on the job's first node)"]

    def commands(self, run, python: str, rendezvous: str, timeout: float) -> list[str]:
        """The batch script: what the nodes receive."""
        return self.script(run, python, rendezvous, timeout).splitlines()

    def start(self, run, python: str, rendezvous: str, timeout: float, on_progress=None,
              extra_env: dict[str, str] | None = None, wrappers=()):
        """Submit the run's job, wait for it to end (or cancel it), return its outcome."""
        # RunOutcome comes with the local launcher, which needs psutil (launcher's environment)
        from launchers.local import RunOutcome

        run_dir = Path(run.rank_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        run.to_json(run_dir / "RUN.json")
        (run_dir / "outcome.json").unlink(missing_ok=True)
        script = run_dir / "job.sbatch"
        script.write_text(self.script(run, python, rendezvous, timeout, extra_env))
        submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                                   text=True, timeout=60)
        if submitted.returncode != 0:
            return RunOutcome("failed", f"sbatch: {submitted.stderr.strip()}", 0.0)
        job = submitted.stdout.strip().split(";")[0]
        started = time.monotonic()
        running_since = None
        heartbeat = Heartbeat(run_dir / "heartbeat")
        try:
            while True:
                heartbeat.beat()
                state = job_state(job)
                if state is None:
                    break
                if state == "RUNNING" and running_since is None:
                    running_since = time.monotonic()
                if running_since is None and time.monotonic() - started > START_GRACE_S + timeout:
                    cancel(job)
                    return RunOutcome("timeout", f"slurm job {job} never started ({state})",
                                      time.monotonic() - started)
                if running_since is not None and time.monotonic() - running_since > timeout + 60:
                    cancel(job)  # the inside part keeps its own timeout; this is the backstop
                    return RunOutcome("timeout", f"slurm job {job} outlived the timeout",
                                      time.monotonic() - started)
                if on_progress:
                    on_progress(_progress(run_dir))
                time.sleep(POLL_SECONDS)
        except BaseException:
            cancel(job)
            raise
        return read_outcome(run_dir, job, time.monotonic() - started)


def job_state(job: str) -> str | None:
    """The job's state per squeue, None once it has left the queue."""
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                          timeout=60)
    state = done.stdout.strip()
    return state or None


def cancel(job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True, timeout=60)


def _progress(run_dir: Path):
    try:
        done, total, _ = (run_dir / "progress").read_text().split()
        return int(done), int(total)
    except (OSError, ValueError):
        return None


def read_outcome(run_dir: Path, job: str, duration: float):
    # the local launcher's outcome type and its stderr reader need psutil (launcher's environment)
    from launchers.local import RunOutcome, stderr_tail

    try:
        data = json.loads((run_dir / "outcome.json").read_text())
        return RunOutcome(data["status"], data.get("error"), duration)
    except (OSError, ValueError, KeyError):
        tail = "\n".join(stderr_tail(path, 10) for path in sorted(run_dir.glob(f"slurm-{job}.out")))
        return RunOutcome("failed", f"slurm job {job} ended without an outcome\n{tail}", duration)


# --------------------------------------------------------------------------- inside the job

def allocation_hosts() -> list[Host]:
    """The job's nodes, in Slurm's order, with the address each resolves to."""
    listed = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    hosts = []
    for name in listed:
        try:
            address = socket.gethostbyname(name)
        except OSError:
            address = name
        hosts.append(Host(address=address, name=name, interface=os.environ.get("DLCOMPARE_INTERFACE")))
    return hosts


def srun_wrapper(spec, argv: list[str], env: dict[str, str]):
    """One process on its node as a job step; a framework launcher runs here, on the first."""
    if spec.launcher:
        return argv, env
    env = {k: v for k, v in env.items() if k != "GLOO_SOCKET_IFNAME" or spec.host.interface}
    if spec.host.interface:
        env["GLOO_SOCKET_IFNAME"] = spec.host.interface
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={spec.host.name}", "--export=ALL",
            "--kill-on-bad-exit=1", "--overlap", *argv], env


def inside(run_json: str, kind: str, python: str, timeout: float) -> int:
    """Inside the allocation: place and run the processes, write outcome.json."""
    # the run's configuration needs NumPy and the local launcher psutil (launcher's environment)
    from adapters.base import RunConfig
    from launchers.local import run_local

    config = RunConfig.from_json(run_json)
    run_dir = Path(run_json).parent
    hosts = allocation_hosts()
    try:
        outcome = run_local(config, python, run_dir, kind, Path.cwd(), timeout, hosts=hosts,
                            wrappers=[srun_wrapper], on_progress=Heartbeat(run_dir / "heartbeat").check,
                            extra_env={k: v for k, v in os.environ.items() if k.startswith("DLC_BACKEND")})
    except LauncherGone as gone:
        print(gone, file=sys.stderr)
        return 1
    (run_dir / "outcome.json").write_text(json.dumps({"status": outcome.status, "error": outcome.error,
                                                      "hosts": [h.name for h in hosts]}))
    return 0


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m launchers.cluster.slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    job = sub.add_parser("inside", help="run inside an allocation (what job.sbatch calls)")
    job.add_argument("run_json")
    job.add_argument("--kind", required=True)
    job.add_argument("--python", required=True)
    job.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    return inside(args.run_json, args.kind, args.python, args.timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
