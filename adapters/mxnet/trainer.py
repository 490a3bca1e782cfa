"""`MXNetTrainer`: gluon.Trainer over an in-process kvstore, and the iteration every mode
steps through (the ps-lite modes are `adapters.mxnet.ps.PSLiteTrainer`, a subclass).

SGD with momentum. MXNet's `sgd_mom_update` keeps state s = m*s - lr*rescale*g and does w += s;
torch keeps v = m*v + g and does w -= lr*v. With a constant learning rate s = -lr*v at every
step, so both follow the same trajectory; the first step is bit-identical (both states start
at zero) and later steps differ by rounding order only. The loss is per sample (summed by
backward) and `trainer.step(global batch)` sets rescale_grad = 1/global batch (the optimizer
the servers run is sent with it at the first step); the kvstore sums the workers' (contexts')
gradients, so the update uses the mean gradient over the global batch, which is what torch
DDP's mean of equal-batch means gives.

Threads: the launcher sets OMP_NUM_THREADS to the run's threads per worker; MXNet's engine
keeps one worker thread per CPU context (MXNET_CPU_WORKER_NTHREADS). MKL-DNN (oneDNN) stays
on (MXNET_MKLDNN_ENABLED, MXNet's default and its CPU fast path); the record says so.
"""

from __future__ import annotations

import gc
import os
import subprocess

import numpy as np

from adapters.base import DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig, Trainer
from adapters.mxnet.base import autograd, check_mode, gluon, mkldnn_active, mx, mxnet_features
from adapters.mxnet.inputs import RecordBatches, SyntheticNDArrays
from adapters.mxnet.model import Network, UnbiasedRunningVar


class MXNetTrainer(Trainer):
    """gluon.Trainer over an in-process kvstore (`local`, `device`, `nccl`): one process drives
    `workers_per_node` contexts and the kvstore reduces their gradients in this process.  The
    ps-lite modes are `adapters.mxnet.ps.PSLiteTrainer`."""

    distributed = False  # one process per worker, ps-lite servers between them

    def __init__(self, spec, config: RunConfig, dist_info: DistInfo):
        super().__init__(spec, config, dist_info)
        check_mode(config.mode)
        if config.dtype != "float32":
            raise FrameworkUnavailable(f"the MXNet adapter trains float32 only, not {config.dtype}")
        mx.random.seed(config.seed, ctx="all")
        self.contexts = self._select_contexts()
        self.kv = self._create_kvstore()
        self.network = Network(spec, config.dropout,
                               mkldnn=config.device == "cpu" and mkldnn_active())
        self.network.initialize(mx.init.Zero(), ctx=self.contexts)
        self.network.hybridize(static_alloc=True, static_shape=True)
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.trainer = gluon.Trainer(
            self.network.collect_params(), "sgd",
            {"learning_rate": config.lr, "momentum": config.momentum},
            kvstore=self.kv if self.kv is not None else config.mode)
        self.running_var = config.options.get("mxnet_bn_running_var", "unbiased")
        if self.running_var not in ("unbiased", "biased"):
            raise ValueError(f"options mxnet_bn_running_var must be unbiased or biased, "
                             f"got {self.running_var!r}")
        self.bessel = (UnbiasedRunningVar(spec, self.network, self.contexts)
                       if self.running_var == "unbiased" else None)
        if self.bessel is not None and not self.bessel.items:
            self.bessel = None
        self.batches = self._input_pipeline()
        self._losses = None

    # -- set-up ------------------------------------------------------------------------------
    def _select_contexts(self):
        """One context per worker process (dist modes), or workers_per_node contexts in this
        one process (in-process modes)."""
        count = 1 if self.distributed else self.config.workers_per_node
        if not self.distributed and self.config.nodes != 1:
            raise ValueError(f"mxnet:{self.config.mode} runs in one process on one node; "
                             "use dist_sync or dist_device_sync across nodes")
        if self.config.device == "gpu":
            gpus = mx.context.num_gpus()
            if gpus == 0:
                raise FrameworkUnavailable("--device gpu asked, but this MXNet build sees no "
                                           "GPU (CPU wheel, or no CUDA driver)")
            first = self.dist.local_rank if self.distributed else 0
            if first + count > gpus:
                raise FrameworkUnavailable(f"needs {first + count} GPUs, MXNet sees {gpus}")
            return [mx.gpu(first + i) for i in range(count)]
        if self.config.mode == "nccl":
            raise FrameworkUnavailable("the nccl kvstore reduces across GPUs; this run is on the "
                                       "CPU (use local or device)")
        return [mx.cpu(i) for i in range(count)]

    def _create_kvstore(self):
        """In-process modes pass the name to gluon.Trainer, which uses no kvstore for one
        context."""
        if self.config.mode == "nccl" and "NCCL" not in mxnet_features():
            raise FrameworkUnavailable("this MXNet build has no NCCL (runtime feature NCCL is "
                                       "off); install a CUDA build with NCCL, or use device")
        return None

    def _input_pipeline(self):
        if self.config.data == "synthetic":
            return SyntheticNDArrays(self.spec, self.config.batch_per_worker, self.contexts,
                                     self.dist.rank, self.dist.world_size, self.config.seed)
        return RecordBatches(self.spec, self.config, self.dist, self.contexts)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights):
        params = self.network.params_by_name
        missing = sorted(set(params) - set(weights))
        unexpected = sorted(set(weights) - set(params))
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        if self.kv is not None and self.trainer._kv_initialized:
            # The servers hold the weights once the store is initialised (first step).
            raise RuntimeError("load_weights must come before the first step in dist modes")
        for name, param in params.items():
            value = weights[name]
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{name}: shape {value.shape}, model has {param.shape}")
            param.set_data(mx.nd.array(value, dtype="float32"))

    def export_weights(self):
        ctx = self.contexts[0]
        return {name: param.data(ctx).asnumpy().copy()
                for name, param in self.network.params_by_name.items()}

    def gradients(self, images, labels):
        ctx = self.contexts[0]
        x = mx.nd.array(images, ctx=ctx)
        y = mx.nd.array(labels, ctx=ctx, dtype="float32")
        if self.bessel:
            self.bessel.save([ctx])
        with autograd.record():
            loss = self.loss_fn(self.network(x), y).mean()
        loss.backward()
        if self.bessel:
            self.bessel.correct([ctx], x.shape[0])
        grads = {name: param.grad(ctx).asnumpy().copy()
                 for name, param in self.network.params_by_name.items()
                 if param.grad_req != "null"}
        return float(loss.asscalar()), grads

    # -- iterations ---------------------------------------------------------------------------
    def _to_devices(self, batch):
        data, labels = batch
        if isinstance(data, list):  # synthetic: one host slice per context
            return ([x.as_in_context(c) for x, c in zip(data, self.contexts)],
                    [y.as_in_context(c) for y, c in zip(labels, self.contexts)])
        if len(self.contexts) == 1:
            return [data.as_in_context(self.contexts[0])], [labels.as_in_context(self.contexts[0])]
        return (gluon.utils.split_and_load(data, self.contexts),
                gluon.utils.split_and_load(labels, self.contexts))

    def _forward(self, data, labels):
        if self.bessel:
            self.bessel.save(self.contexts)
        with autograd.record():
            return [self.loss_fn(self.network(x), y) for x, y in zip(data, labels)]

    def _backward(self, losses):
        autograd.backward(losses)
        if self.bessel:  # MXNet's BatchNorm updates its running statistics in backward
            self.bessel.correct(self.contexts, losses[0].shape[0])

    def step(self):
        data, labels = self._to_devices(next(self.batches))
        losses = self._forward(data, labels)
        self._backward(losses)
        self.trainer.step(self.config.global_batch)
        self._losses = losses

    # gluon.Trainer.step(batch) is exactly _reduce() then _apply_update(); profile_step calls
    # the two halves separately (private methods of the pinned MXNet 1.9.1) to time them.
    def _reduce(self):
        trainer = self.trainer
        trainer._check_and_rescale_grad(trainer._scale / self.config.global_batch)
        if not trainer._kv_initialized:
            trainer._init_kvstore()
        if trainer._params_to_init:
            trainer._init_params()
        trainer._allreduce_grads()

    def _apply_update(self):
        self.trainer._update()

    def profile_step(self, overlapped: bool):
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        data, labels = self._to_devices(batch)
        timer.lap("h2d")
        losses = self._forward(data, labels)
        timer.lap("forward")
        self._backward(losses)
        if overlapped:
            self._reduce()  # the engine pushes each gradient as soon as backward made it
            timer.lap("backward_comm")
        else:
            timer.lap("backward")
            self._reduce()
            timer.lap("comm")
            if self.trainer._kvstore is None:
                timer.laps["comm"] = 0.0
        self._apply_update()
        timer.lap("update")
        self._losses = losses
        return timer.laps

    def last_loss(self):
        if self._losses is None:
            return float("nan")
        return float(np.mean([loss.mean().asscalar() for loss in self._losses]))

    def sync(self):
        mx.nd.waitall()

    def barrier(self):
        if self.kv is not None:
            self.kv._barrier()

    # -- facts --------------------------------------------------------------------------------
    def _update_on_kvstore(self) -> bool:
        if not self.trainer._kv_initialized:
            self.trainer._init_kvstore()
        return bool(self.trainer._kvstore is not None and self.trainer._update_on_kvstore)

    def versions(self):
        return {"mxnet": mx.__version__, "mxnet_features": ",".join(mxnet_features()),
                "mxnet_mkldnn_enabled": os.environ.get("MXNET_MKLDNN_ENABLED", "1"),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
                "mxnet_cpu_worker_nthreads": os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")}

    def device_name(self):
        if self.config.device == "gpu":
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader",
                                      "-i", str(self.contexts[0].device_id)],
                                     capture_output=True, text=True, timeout=20)
                if out.returncode == 0 and out.stdout.strip():
                    return out.stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                pass
            return f"GPU {self.contexts[0].device_id}"
        return super().device_name()

    def describe(self):
        kvstore = self.trainer._kvstore
        on_servers = self._update_on_kvstore()
        return {"kvstore": kvstore.type if kvstore is not None else "none",
                "update_on_kvstore": on_servers,
                "update_where": ("servers" if self.distributed else "kvstore") if on_servers
                else "workers",
                "processes": self.dist.world_size if self.distributed else 1,
                "contexts_per_process": len(self.contexts),
                "servers": self.config.servers if self.distributed else 0,
                "input": "synthetic NDArrays" if self.config.data == "synthetic"
                else "RecordIO + ImageRecordIter",
                "hybridize": "static_alloc,static_shape", "layout": "NCHW",
                "bn_running_var": self.running_var,
                "lrn": "composite (MKL-DNN LRN bug)" if self.network.mkldnn else "mxnet LRN"}

    def close(self):
        """Wait for queued work, then free the kvstore: a dist store's destructor meets the other
        workers and the servers at ps-lite's final barrier and stops the servers."""
        mx.nd.waitall()
        self.trainer = None
        self.kv = None
        self.batches = None
        gc.collect()
