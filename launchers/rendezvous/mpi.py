"""MPI: one `mpirun` starts every rank; ranks learn their place from OpenMPI's variables.

Flags: --oversubscribe (more ranks than cores is how this tool runs several workers on a small
machine), --bind-to none (bound ranks on emulated hosts share one core and every small
collective then costs milliseconds), and root permission through OpenMPI's variables.

On several nodes mpirun gets `-H node:slots,...` and the interface the nodes share (its
daemons and the TCP transport stay on it), and only the TCP and self transports: emulated
nodes share this machine's hostname space and memory, and shared memory between them would
bypass the shaped links. How mpirun reaches the other nodes (ssh by default; an agent that
enters a network namespace on an emulated cluster) is the cluster transport's business:
it sets OMPI_MCA_plm_rsh_agent, which mpirun reads like --mca plm_rsh_agent.
"""

from __future__ import annotations

import shutil

from launchers.rendezvous import ProcessSpec


# A rank waiting in a blocking MPI call spins on OpenMPI's progress engine. OpenMPI yields the
# processor between polls only when it sees more ranks than slots, but a rank here also runs
# compute threads MPI does not know of: a communication thread that overlaps backward (Caffe-
# MPI-style, Horovod's background thread) spun them off their cores. Measured, GoogleNet batch
# 16, 2 emulated nodes on a 1 Gbit/s link: overlap of communication with backward 0.26
# without yielding, 0.78-0.82 with.
YIELD_WHILE_WAITING = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# What every mpirun here gets: root is allowed (containers, CI), more ranks than cores too.
MPIRUN_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1", **YIELD_WHILE_WAITING}


class MpiMissing(RuntimeError):
    pass


def mpirun_command(world_size: int, hosts, workers_per_node: int | None = None) -> list[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise MpiMissing("mpirun not found: install OpenMPI (Debian: openmpi-bin libopenmpi-dev)")
    command = [mpirun, "-np", str(world_size), "--oversubscribe", "--bind-to", "none"]
    nodes = list(dict.fromkeys(hosts))
    if all(host.is_loopback for host in nodes):
        return command + ["--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    per_node = workers_per_node or max(1, world_size // len(nodes))
    interface = nodes[0].interface  # None: OpenMPI picks among the nodes' interfaces
    return command + ["-H", ",".join(f"{host.target}:{per_node}" for host in nodes),
                      "--map-by", "node" if per_node == 1 else "slot",
                      "--mca", "btl", "tcp,self"] + (
        ["--mca", "btl_tcp_if_include", interface, "--mca", "oob_tcp_if_include", interface]
        if interface else [])


def processes(config, hosts) -> list[ProcessSpec]:
    env = {"DLC_WORLD_SIZE": str(config.world_size), **MPIRUN_ENV}
    launcher = mpirun_command(config.world_size, hosts[:config.nodes], config.workers_per_node)
    spec = ProcessSpec("worker", 0, hosts[0], env, launcher=launcher)
    spec.env.pop("DLC_ROLE_INDEX", None)
    return [spec]
