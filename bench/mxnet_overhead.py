"""Benchmark: what the MXNet adapter costs against a plain hand-written Gluon loop, and what
profile mode costs against throughput mode.

    python -m bench.mxnet_overhead [--models alexnet,googlenet,resnet50] [--batch N]

Runs in the MXNet environment (it re-executes itself there). Both loops train the same
hybridized Gluon network (built from the same description by adapters.mxnet.model.Network,
same canonical weights, same batch already in MXNet memory, same threads), one process, one
CPU context, no kvstore (Gluon's own single-device path). The plain loop is the textbook one:

    with autograd.record(): loss = loss_fn(net(x), y)
    loss.backward(); trainer.step(batch)

The adapter's `step()` adds its input iterator and the Bessel correction of BatchNorm's
running variance (adapters/mxnet/model.py UnbiasedRunningVar). Rounds are interleaved so machine
noise hits both alike; the ratio is of medians. Target: adapter / plain <= 1.05. Without
--batch each model runs at the campaign's default CPU batch (launchers/plan.py).
"""

from __future__ import annotations

import json
import os
import sys

from bench import interleaved_rounds, medians, reexec_in_framework_env
from core.cli import OneLineParser, comma_list_type


def plain_step(network, trainer, loss_fn, images, labels, batch: int):
    """The textbook Gluon step, waited for (MXNet's engine is asynchronous)."""
    from mxnet import autograd
    import mxnet as mx

    def step():
        with autograd.record():
            loss = loss_fn(network(images), labels)
        loss.backward()
        trainer.step(batch)
        mx.nd.waitall()
    return step


def measure(model: str, batch: int, iterations: int, rounds: int, threads: int) -> dict:
    import mxnet as mx
    from mxnet import gluon

    from adapters.base import DistInfo, RunConfig
    from adapters.data import synthetic_batch
    from adapters.mxnet.base import mkldnn_active
    from adapters.mxnet.model import Network
    from adapters.mxnet.trainer import MXNetTrainer
    from models import canonical_weights, get_model

    spec = get_model(model)
    weights = canonical_weights(spec)
    config = RunConfig(run_id="bench", framework="mxnet", mode="local", model=model,
                       batch_per_worker=batch, threads_per_worker=threads)
    adapter = MXNetTrainer(spec, config, DistInfo())
    adapter.load_weights(weights)

    network = Network(spec, dropout=True, mkldnn=mkldnn_active())
    network.initialize(mx.init.Zero(), ctx=mx.cpu())
    for name, param in network.params_by_name.items():
        param.set_data(mx.nd.array(weights[name]))
    network.hybridize(static_alloc=True, static_shape=True)
    plain = gluon.Trainer(network.collect_params(), "sgd",
                          {"learning_rate": 0.01, "momentum": 0.9}, kvstore="local")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    images, labels = synthetic_batch(0, 0, batch, spec.input_shape, spec.num_classes)
    images, labels = mx.nd.array(images), mx.nd.array(labels, dtype="float32")

    def adapter_step():
        adapter.step()
        adapter.sync()

    timings = interleaved_rounds({
        "plain": plain_step(network, plain, loss_fn, images, labels, batch),
        "adapter": adapter_step,
        "profile": lambda: adapter.profile_step(overlapped=False),
    }, iterations, rounds)
    result = {"model": model, "batch": batch, "threads": threads, **medians(timings),
              "plain_rounds": timings["plain"], "adapter_rounds": timings["adapter"]}
    result["adapter_over_plain"] = result["adapter_s"] / result["plain_s"]
    # On a shared machine the least-disturbed round of each is a second, steadier estimate.
    result["adapter_over_plain_min"] = min(timings["adapter"]) / min(timings["plain"])
    result["profile_over_throughput"] = result["profile_s"] / result["adapter_s"]
    adapter.close()
    return result


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=comma_list_type, default="alexnet,googlenet,resnet50")
    parser.add_argument("--batch", type=int, default=None,
                        help="per-step batch (default: the campaign's CPU default per model)")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    reexec_in_framework_env("mxnet", "bench.mxnet_overhead")
    threads = os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # before MXNet starts its engine
    import platform

    import mxnet as mx

    from launchers.plan import default_batch

    print(json.dumps({"python": platform.python_version(), "mxnet": mx.__version__,
                      "cpu_count": threads, "omp_num_threads": os.environ["OMP_NUM_THREADS"],
                      "mkldnn": os.environ.get("MXNET_MKLDNN_ENABLED", "1")}))
    for model in args.models:
        batch = args.batch or default_batch(model, "cpu")
        print(json.dumps(measure(model, batch, args.iterations, args.rounds, threads)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
