"""Benchmark: what the PyTorch adapter costs against a plain hand-written loop, and what
profile mode costs against throughput mode.

    python -m bench.torch_overhead [--models alexnet,googlenet,resnet50] [--batch 8]

Runs in the torch environment (it re-executes itself there). Both loops train the same network
(built from the same description, same canonical weights, same batch, same thread count) and
are timed in interleaved rounds so machine noise hits both alike; the ratio is of medians.
Target: adapter / plain <= 1.03.
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
    args = parser.parse_args()
    reexec_in_framework_env("torch", "bench.torch_overhead")
    import platform

    import torch

    threads = os.cpu_count() or 1
    print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                      "cpu_count": threads}))
    for model in args.models:
        print(json.dumps(measure(model, args.batch, args.iterations, args.rounds, threads)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
