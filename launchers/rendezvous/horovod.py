"""Horovod's launchers: `horovodrun --gloo` (mode gloo) or `mpirun` (mode mpi) starts every rank.

horovodrun is the Horovod environment's own (`{python} -m horovod.runner.launch`: the local
transport puts that environment's interpreter in place of `{python}`). It runs Gloo's
rendezvous server and gives each rank HOROVOD_RANK / HOROVOD_SIZE / HOROVOD_LOCAL_RANK and the
rendezvous address; on loopback it is told to use `lo`. mpirun is the MPI rendezvous's command
(launchers/rendezvous/mpi.py); ranks learn their place from OpenMPI's variables and Horovod uses
MPI for its controller and all-reduce. DistInfo.from_env reads either.
"""

from __future__ import annotations

from core import schemes as catalogue
from launchers.rendezvous import ProcessSpec
from launchers.rendezvous.mpi import MPIRUN_ENV, mpirun_command


def horovodrun_command(config, hosts) -> list[str]:
    nodes = [hosts[node] for node in range(config.nodes)]
    if config.nodes == 1 or all(host.is_loopback for host in nodes):
        # one node (this machine, or one emulated or real node): ranks started locally
        host_list = f"localhost:{config.world_size}"
        interface = ["--network-interfaces", "lo"]
    else:  # one slot list per node; horovodrun reaches the others with `ssh` (on an emulated
        # cluster the transport's stand-in on PATH, which enters the node's namespace)
        host_list = ",".join(f"{host.target}:{config.workers_per_node}" for host in nodes)
        interface = ["--network-interfaces", nodes[0].interface] if nodes[0].interface else []
    return ["{python}", "-m", "horovod.runner.launch", "-np", str(config.world_size),
            "-H", host_list, "--gloo", *interface, "--start-timeout", "120"]


def processes(config, hosts) -> list[ProcessSpec]:
    env = {"DLC_WORLD_SIZE": str(config.world_size)}
    transport = catalogue.scheme("horovod", config.mode).transport
    if transport == "gloo":
        launcher = horovodrun_command(config, hosts)
        env.update(HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo")
    elif transport == "mpi":
        launcher = mpirun_command(config.world_size, hosts[:config.nodes],
                                  config.workers_per_node)
        env.update(HOROVOD_CONTROLLER="mpi", HOROVOD_CPU_OPERATIONS="mpi", **MPIRUN_ENV)
    else:
        raise ValueError(f"no horovod launcher for mode {config.mode!r} (known: gloo, mpi)")
    spec = ProcessSpec("worker", 0, hosts[0], env, launcher=launcher)
    spec.env.pop("DLC_ROLE_INDEX", None)
    return [spec]
