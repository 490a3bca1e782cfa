"""ps-lite's rendezvous (MXNet's dist kvstores): a scheduler, parameter servers and workers.

Every process of a dist run gets DMLC_ROLE, the scheduler's address DMLC_PS_ROOT_URI (the first
host) and a free DMLC_PS_ROOT_PORT, and DMLC_NUM_SERVER / DMLC_NUM_WORKER. DMLC_NODE_HOST is the
address the process announces to the others (its host's), and on loopback DMLC_INTERFACE=lo:
otherwise ps-lite announces the machine's first non-loopback address. MXNet's bundled
tools/launch.py is never used (it crashes on Python >= 3.9 and binds the scheduler to a
non-loopback address). All roles run the one worker entry point; DLC_ROLE makes the
scheduler and servers call the adapter's `serve()`.

MXNet's in-process kvstores (local, device, nccl) are one process driving every device of the
node, so their run is a single worker process and no ps-lite at all.
"""

from __future__ import annotations

from launchers.rendezvous import ProcessSpec, free_port, worker_env, worker_hosts

SERVER_MODES = ("dist_sync", "dist_device_sync")
IN_PROCESS_MODES = ("local", "device", "nccl")


def processes(config, hosts) -> list[ProcessSpec]:
    if config.mode in IN_PROCESS_MODES:
        if config.nodes != 1:
            raise ValueError(f"mxnet:{config.mode} drives the devices of one node from one "
                             "process; use dist_sync or dist_device_sync across nodes")
        return [ProcessSpec("worker", 0, hosts[0], worker_env(0, 0, 1))]
    if config.mode not in SERVER_MODES:
        raise ValueError(f"no ps-lite rendezvous for mxnet mode {config.mode!r}")
    if config.servers < 1:
        raise ValueError(f"mxnet:{config.mode} needs at least one parameter server "
                         f"(--servers), got {config.servers}")
    root = hosts[0].address
    common = {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(free_port(root)),
              "DMLC_NUM_SERVER": str(config.servers),
              "DMLC_NUM_WORKER": str(config.world_size)}

    def env(role: str, host, extra: dict | None = None) -> dict[str, str]:
        values = {**(extra or {}), **common, "DMLC_ROLE": role, "DMLC_NODE_HOST": host.address}
        if host.is_loopback:
            values["DMLC_INTERFACE"] = "lo"
        elif host.interface:
            values["DMLC_INTERFACE"] = host.interface
        return values

    specs = [ProcessSpec("scheduler", 0, hosts[0], env("scheduler", hosts[0]))]
    for index in range(config.servers):  # spread over the nodes, one after another
        host = hosts[index % len(hosts)]
        specs.append(ProcessSpec("server", index, host, env("server", host)))
    for rank, local_rank, host in worker_hosts(config, hosts):
        specs.append(ProcessSpec("worker", rank, host,
                                 env("worker", host, worker_env(rank, local_rank,
                                                                config.world_size))))
    return specs
