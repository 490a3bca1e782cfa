"""torch.distributed's env:// rendezvous: rank 0's host runs the TCP store on a free port."""

from __future__ import annotations

from launchers.rendezvous import ProcessSpec, free_port, worker_env, worker_hosts


def processes(config, hosts) -> list[ProcessSpec]:
    master_address, master_port = hosts[0].address, free_port()
    specs = []
    for rank, local_rank, host in worker_hosts(config, hosts):
        env = worker_env(rank, local_rank, config.world_size)
        env.update(MASTER_ADDR=master_address, MASTER_PORT=str(master_port), RANK=str(rank),
                   WORLD_SIZE=str(config.world_size), LOCAL_RANK=str(local_rank))
        specs.append(ProcessSpec("worker", rank, host, env))
    return specs
