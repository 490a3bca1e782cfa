"""TensorFlow's rendezvous: a TF_CONFIG per process naming every task's gRPC address.

Per mode (the adapter, adapters/tensorflow/, reads the same TF_CONFIG):
  - any mode with one worker: one process, no TF_CONFIG (the single-device path, so every mode
    has the same 1-worker baseline; no parameter server is started);
  - collective: cluster {worker: [...]}, one process per worker;
  - ps: cluster {worker: [...], ps: [...]}: the workers plus `config.servers` processes of role
    "server" (TF job "ps") that only serve variables;
  - ps-async: cluster {chief: [...], worker: [...], ps: [...]}: ParameterServerStrategy's
    coordinator is the one process of role "worker" (DLC rank 0 of 1: it drives training and
    writes the record), the TF workers that compute are processes of role "tfworker", and
    the servers role "server"; serving roles are ended when the coordinator has finished;
  - mirrored: one process driving `workers_per_node` GPUs.
Every address is 127.0.0.1 or the host's address with a free port.
"""

from __future__ import annotations

import json

from launchers.rendezvous import ProcessSpec, free_port, worker_env, worker_hosts


def _address(host) -> str:
    return f"{host.address}:{free_port()}"


def _tf_config(cluster: dict, task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def processes(config, hosts) -> list[ProcessSpec]:
    workers = worker_hosts(config, hosts)
    if config.world_size == 1 or config.mode == "mirrored":
        rank, local_rank, host = workers[0]
        return [ProcessSpec("worker", 0, host, worker_env(0, 0, 1))]
    servers = max(1, int(config.servers or 1))
    server_hosts = [hosts[i % len(hosts)] for i in range(servers)]
    if config.mode == "ps-async":
        return _async_processes(config, workers, server_hosts)
    cluster = {"worker": [_address(host) for _, _, host in workers]}
    if config.mode == "ps":
        cluster["ps"] = [_address(host) for host in server_hosts]
    specs = []
    for rank, local_rank, host in workers:
        env = worker_env(rank, local_rank, config.world_size)
        env["TF_CONFIG"] = _tf_config(cluster, "worker", rank)
        specs.append(ProcessSpec("worker", rank, host, env))
    for index, host in enumerate(server_hosts if config.mode == "ps" else []):
        specs.append(ProcessSpec("server", index, host,
                                 {"TF_CONFIG": _tf_config(cluster, "ps", index)}))
    return specs


def _async_processes(config, workers, server_hosts) -> list[ProcessSpec]:
    _, _, chief_host = workers[0]
    cluster = {"chief": [_address(chief_host)],
               "worker": [_address(host) for _, _, host in workers],
               "ps": [_address(host) for host in server_hosts]}
    env = worker_env(0, 0, 1)  # the coordinator is the one process that reports
    env["TF_CONFIG"] = _tf_config(cluster, "chief", 0)
    specs = [ProcessSpec("worker", 0, chief_host, env)]
    for rank, local_rank, host in workers:
        specs.append(ProcessSpec("tfworker", rank, host,
                                 {"TF_CONFIG": _tf_config(cluster, "worker", rank),
                                  "DLC_LOCAL_RANK": str(local_rank)}))
    for index, host in enumerate(server_hosts):
        specs.append(ProcessSpec("server", index, host,
                                 {"TF_CONFIG": _tf_config(cluster, "ps", index)}))
    return specs
