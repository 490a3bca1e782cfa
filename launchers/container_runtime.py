"""The container runtime: every process of a run inside its framework's image.

`ContainerRuntime.wrap` is a `CommandWrapper` (launchers/local.py): it turns the argv and
environment a transport would start on this machine into `<engine> run ... IMAGE argv`. It
composes: the local transport starts the wrapped command as it is; the emulated-cluster
transport wraps it once more in `ip netns exec NODE`, and because the container shares the
network of whoever starts it (`--network host`), it then lives in that node's namespace with
the node's address, and the rendezvous addresses and ports are the same as without containers.

What crosses into the container:
- the variables the launcher set for this process (rendezvous, roles, thread caps), passed by
  name (`-e NAME`) with their values in the engine client's environment, never the host's whole
  environment (its PATH, PYTHONPATH and virtualenv are not the image's);
- the run folder (RUN.json in, rank results and the record out) and the data folder
  (read-only), mounted at the same paths, so every path in RUN.json holds inside too;
- the host interpreter's path in argv is replaced by the image's.

The image's user is not root. When the launcher runs as root, the run folder is handed to that
user; otherwise the container runs as the caller's uid:gid so files it writes are the caller's.

Killing `<engine> run` (the local transport's SIGKILL of the process group on a timeout or a
failure) does not stop the container, whose processes belong to the engine's monitor, so every
container is named and `remove` force-removes the run's containers once the run has ended.
When the launcher itself is killed (SIGKILL, the OOM killer) nothing of it is left to do that:
every container also carries the launcher's pid as a label, and a reaper started with the
first run (launchers.local.start_reaper) force-removes the containers of that label once the
launcher is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from adapters.base import RunConfig
from launchers.engine import Engine
from launchers.images import BuiltImage
from launchers.local import start_reaper, stop_reaper, wait_for_owner
from launchers.rendezvous import ProcessSpec

# Variables that describe the host side and must not reach the container.
HOST_ONLY = {"PYTHONPATH", "PATH", "HOME", "VIRTUAL_ENV", "DLCOMPARE_HOST_ENV", "PWD",
             "OLDPWD", "SHLVL", "_"}
CONTAINER_LABEL = "org.dlcompare.run"
OWNER_LABEL = "org.dlcompare.owner"  # the pid of the launcher that started the container
# Variables a rank's runtime reads: passed even when the launcher's own environment happens to
# hold the same value (a user's exported OMP_NUM_THREADS, say), since the image's does not.
RANK_PREFIXES = ("DLC_", "OMP_", "MKL_", "OPENBLAS_", "TF_CONFIG", "TF_NUM_", "TF_CPP_", "TF_USE_",
                 "TF_ENABLE_", "GLOO_", "NCCL_", "MASTER_",
                 "DMLC_", "PS_", "OMPI_", "HOROVOD_", "MXNET_", "CUDA_", "PYTHONUNBUFFERED")
RANK_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}


class ContainerRuntime:
    """The containers of one run: how to start each process, and how to remove them all."""

    def __init__(self, engine: Engine, image: BuiltImage, config: RunConfig, host_python: str):
        self.engine = engine
        self.image = image
        self.config = config
        self.host_python = host_python
        self.run_tag = uuid.uuid4().hex[:10]
        self.names: list[str] = []

    def wrap(self, spec: ProcessSpec, argv: list[str], env: dict[str, str]
             ) -> tuple[list[str], dict[str, str]]:
        """The CommandWrapper: `<engine> run ... IMAGE argv` and the client's environment."""
        name = f"dlc-{self.run_tag}-{spec.name}"
        self.names.append(name)
        passed = self.passed_env(env)
        inner = [self.image.spec.python if item == self.host_python else item for item in argv]
        command = [*self.engine_launcher(), "run", "--rm", *self.engine.pull_flag(), "--name", name,
                   "--label", f"{CONTAINER_LABEL}={self.config.run_id}",
                   "--label", f"{OWNER_LABEL}={os.getpid()}",
                   "--network", "host", "--ipc", "host", *self.user_args(),
                   *self.mount_args(), *self.device_args(),
                   *(arg for key in sorted(passed) for arg in ("-e", key)),
                   "--entrypoint", inner[0], self.image.tag, *inner[1:]]
        client_env = {**env, **passed, **self.engine.env,
                      "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        return command, client_env

    def engine_launcher(self) -> list[str]:
        """podman, started through launchers.cgroupfs: inside `ip netns exec` the cgroup
        mounts are hidden and runc fails without them (docker's CLI only talks to its daemon)."""
        if self.engine.name != "podman":
            return [self.engine.path]
        return [sys.executable, "-m", "launchers.cgroupfs", self.engine.path]

    def passed_env(self, env: dict[str, str]) -> dict[str, str]:
        """What the launcher set for this process (differs from its own environment) and what
        ranks read, without the host-only variables."""
        return {key: value for key, value in env.items() if key not in HOST_ONLY and (
                os.environ.get(key) != value or key in RANK_NAMES
                or key.startswith(RANK_PREFIXES))}

    def user_args(self) -> list[str]:
        if os.geteuid() != 0:
            return ["--user", f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp"]
        return []  # the image's own (non-root) user; the run folder is handed to it

    def mount_args(self) -> list[str]:
        run_dir = Path(self.config.rank_dir)
        mounts = ["-v", f"{run_dir}:{run_dir}"]
        record_dir = Path(self.config.record_path).parent
        if record_dir != run_dir:
            mounts += ["-v", f"{record_dir}:{record_dir}"]
        if self.config.data_dir:
            mounts += ["-v", f"{self.config.data_dir}:{self.config.data_dir}:ro"]
        return mounts

    def device_args(self) -> list[str]:
        if self.config.device != "gpu":
            return []
        return ["--gpus", "all"] if self.engine.name == "docker" else \
            ["--device", "nvidia.com/gpu=all"]

    def prepare(self) -> None:
        """Let the image's user write the run folder (only when we are root)."""
        if os.geteuid() != 0:
            return
        uid, _, gid = (self.image_user() or "1000:1000").partition(":")
        for folder in {Path(self.config.rank_dir), Path(self.config.record_path).parent}:
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, int(uid), int(gid or uid))

    def image_user(self) -> str | None:
        user = self.engine.image_facts(self.image.tag)["user"]
        return user if user and user.replace(":", "").isdigit() else None

    def remove(self, timeout: float = 60.0) -> None:
        """Force-remove this run's containers and wait until none is listed any more: a
        container whose `run` client was just killed may still be starting or being removed
        by the engine's own clean-up, and then outlives a first `rm`."""
        deadline = time.monotonic() + timeout
        remaining = list(self.names)
        while remaining and time.monotonic() < deadline:
            subprocess.run(self.engine.command("rm", "--force", *remaining),
                           env=self.engine.process_env(), capture_output=True, timeout=120)
            remaining = self.listed()
            if remaining:
                time.sleep(0.5)

    def listed(self) -> list[str]:
        """This run's containers the engine still lists (any state)."""
        result = subprocess.run(
            self.engine.command("ps", "--all", "--filter", f"name=dlc-{self.run_tag}-",
                                "--format", "{{.Names}}"),
            env=self.engine.process_env(), capture_output=True, text=True, timeout=120)
        return [name for name in result.stdout.split() if name in self.names]


@dataclass
class ContainerImages:
    """A container campaign's engine and the image of each environment it runs."""

    engine: Engine
    images: dict[str, BuiltImage] = field(default_factory=dict)
    reaper: subprocess.Popen | None = None

    def runtime_for(self, config: RunConfig, env: str, host_python: str) -> ContainerRuntime:
        """The runtime of one run, its folder already writable by the image's user."""
        if self.reaper is None:
            self.reaper = start_reaper("launchers.container_runtime", str(os.getpid()),
                                       self.engine.name, self.engine.path, env=self.engine.env)
        runtime = ContainerRuntime(self.engine, self.images[env], config, host_python)
        runtime.prepare()
        return runtime

    def close(self) -> None:
        """Every run removed its containers: the reaper has nothing left to do."""
        stop_reaper(self.reaper)
        self.reaper = None


def owned_containers(engine: Engine, owner: int) -> list[str]:
    """The containers (any state) started by the launcher with pid `owner`."""
    result = subprocess.run(
        engine.command("ps", "--all", "--filter", f"label={OWNER_LABEL}={owner}", "--format",
                       "{{.Names}}"), env=engine.process_env(), capture_output=True, text=True,
        timeout=120)
    return result.stdout.split()


def reap(owner: int, engine: Engine) -> int:
    """The reaper: once the launcher `owner` is gone (or has removed its containers itself),
    force-remove the containers it left."""
    wait_for_owner(owner, done=lambda: not owned_containers(engine, owner))
    left = owned_containers(engine, owner)
    if left:
        subprocess.run(engine.command("rm", "--force", *left), env=engine.process_env(),
                       capture_output=True, timeout=300)
    return 0


def main(argv: list[str]) -> int:
    """`python -m launchers.container_runtime reap OWNER ENGINE_NAME ENGINE_PATH`."""
    if len(argv) == 4 and argv[0] == "reap" and argv[1].isdigit():
        return reap(int(argv[1]), Engine(argv[2], argv[3]))
    print("usage: python -m launchers.container_runtime reap OWNER ENGINE_NAME ENGINE_PATH",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
