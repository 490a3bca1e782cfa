"""MPI: one `mpirun` starts every rank; ranks learn their place from OpenMPI's variables.

Flags: --oversubscribe (more ranks than cores is how this tool runs several workers on a small
machine), --bind-to none (bound ranks on emulated hosts share one core and every small
collective then costs milliseconds), and root permission through OpenMPI's variables.
"""

from __future__ import annotations

import shutil

from launchers.rendezvous import ProcessSpec


class MpiMissing(RuntimeError):
    pass


def mpirun_command(world_size: int, hosts) -> list[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise MpiMissing("mpirun not found: install OpenMPI (Debian: openmpi-bin libopenmpi-dev)")
    command = [mpirun, "-np", str(world_size), "--oversubscribe", "--bind-to", "none",
               "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
    addresses = sorted({host.address for host in hosts})
    if addresses != ["127.0.0.1"]:
        raise ValueError("the MPI rendezvous runs on this host only so far")
    return command


def processes(config, hosts) -> list[ProcessSpec]:
    env = {"DLC_WORLD_SIZE": str(config.world_size), "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    spec = ProcessSpec("worker", 0, hosts[0], env, launcher=mpirun_command(config.world_size, hosts))
    spec.env.pop("DLC_ROLE_INDEX", None)
    return [spec]
