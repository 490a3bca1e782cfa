"""Benchmark: what the PyTorch adapter costs against a plain hand-written loop, and what
profile mode costs against throughput mode.

    python -m bench.torch_overhead [--models alexnet,googlenet,resnet50] [--batch 8]
        [--modes ddp,ddp-fp16,ddp-powersgd,zero,fsdp --workers 2]

Runs in the torch environment (it re-executes itself there). Both loops train the same network
(built from the same description, same canonical weights, same batch, same thread count) and
are timed in interleaved rounds so machine noise hits both alike; the ratio is of medians.
With `--modes`, each mode runs on `--workers` gloo ranks on loopback (one thread each), against
the same scheme written by hand with PyTorch's own API (`plain_distributed`); rank 0 prints.
Target: adapter / plain <= 1.03, every mode.
"""

from __future__ import annotations

import json
import os
import sys

from bench import interleaved_rounds, medians, reexec_in_framework_env
from core.cli import OneLineParser, comma_list_type


def plain_step(network, images, labels):
    """What a user would write by hand: forward, loss, zero_grad, backward, SGD step."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)

    def step():
        loss = F.cross_entropy(network(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def plain_distributed(mode: str, network, lr: float = 0.01, momentum: float = 0.9):
    """The scheme of torch mode `mode` as a user writes it by hand, on the default process
    group: (model to call, optimizer)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from adapters.pytorch import shard_fully
    from core import schemes as catalogue

    if mode == "fsdp":
        model = shard_fully(network)[1]
        return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model = torch.nn.parallel.DistributedDataParallel(network)
    if mode == "ddp-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode == "ddp-powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                            min_compression_rate=catalogue.POWERSGD_MIN_COMPRESSION_RATE)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    if mode == "zero":
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=lr,
                                              momentum=momentum)
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def measure_distributed(rank: int, world_size: int, port: int, mode: str, model: str, batch: int,
                        iterations: int, rounds: int) -> None:
    """One rank of `mode`'s adapter step against `plain_distributed`'s, in interleaved rounds
    (every rank takes the same turns, so their collectives pair up); rank 0 prints."""
    import torch
    import torch.nn.functional as F

    from adapters.base import DistInfo, RunConfig
    from adapters.data import synthetic_batch
    from adapters.pytorch import TRAINERS, Network
    from models import canonical_weights, get_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    spec = get_model(model)
    weights = canonical_weights(spec)
    config = RunConfig(run_id="bench", framework="torch", mode=mode, model=model, batch_per_worker=batch,
                       threads_per_worker=1)
    trainer = TRAINERS[mode](spec, config, DistInfo(rank, world_size, rank))  # joins the process group
    trainer.load_weights(weights)
    network = Network(spec, dropout=True)
    network.leaves.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=False)
    plain, optimizer = plain_distributed(mode, network)
    images, labels = synthetic_batch(0, rank * batch, batch, spec.input_shape, spec.num_classes)
    images, labels = torch.from_numpy(images), torch.from_numpy(labels)

    def plain_step():
        loss = F.cross_entropy(plain(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    timings = interleaved_rounds({"plain": plain_step, "adapter": trainer.step}, iterations, rounds)
    if rank == 0:
        result = {"model": model, "mode": mode, "workers": world_size, "batch": batch, **medians(timings)}
        result["adapter_over_plain"] = result["adapter_s"] / result["plain_s"]
        print(json.dumps(result), flush=True)
    trainer.barrier()  # no rank leaves the group while another still sends
    del plain, optimizer
    trainer.close()


def measure(model: str, batch: int, iterations: int, rounds: int, threads: int) -> dict:
    import torch

    from adapters.base import DistInfo, RunConfig
    from adapters.data import synthetic_batch
    from adapters.pytorch import Network, TorchTrainer
    from models import canonical_weights, get_model

    spec = get_model(model)
    weights = canonical_weights(spec)
    config = RunConfig(run_id="bench", framework="torch", mode="ddp", model=model,
                       batch_per_worker=batch, threads_per_worker=threads)
    trainer = TorchTrainer(spec, config, DistInfo())
    trainer.load_weights(weights)
    network = Network(spec, dropout=True)
    network.leaves.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()},
                                   strict=False)
    images, labels = synthetic_batch(0, 0, batch, spec.input_shape, spec.num_classes)
    images, labels = torch.from_numpy(images), torch.from_numpy(labels)
    timings = interleaved_rounds({
        "plain": plain_step(network, images, labels),
        "adapter": trainer.step,  # synchronous on the CPU
        "profile": lambda: trainer.profile_step(overlapped=False),
    }, iterations, rounds)
    result = {"model": model, "batch": batch, "threads": threads, **medians(timings)}
    result["adapter_over_plain"] = result["adapter_s"] / result["plain_s"]
    result["profile_over_throughput"] = result["profile_s"] / result["adapter_s"]
    return result


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=comma_list_type, default="alexnet,googlenet,resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", type=comma_list_type, default=None,
                        help="torch modes to time on --workers ranks (default: one process, no scheme)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    reexec_in_framework_env("torch", "bench.torch_overhead")
    import platform

    import torch

    threads = os.cpu_count() or 1
    print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                      "cpu_count": threads}))
    if args.modes:
        import torch.multiprocessing as mp

        from launchers.rendezvous import free_port
        for model in args.models:
            for mode in args.modes:
                mp.spawn(measure_distributed, nprocs=args.workers, args=(
                    args.workers, free_port(), mode, model, args.batch, args.iterations, args.rounds))
        return 0
    for model in args.models:
        print(json.dumps(measure(model, args.batch, args.iterations, args.rounds, threads)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
