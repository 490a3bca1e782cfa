"""Horovod adapter: Horovod 0.28.1's ring all-reduce with tensor fusion, on PyTorch compute.

The network, input pipeline, canonical weights and synthetic data are the PyTorch adapter's
(TorchTrainer); the aggregation is Horovod's own `hvd.DistributedOptimizer`: a hook on every
parameter's gradient accumulator hands the gradient to Horovod (`allreduce_async_`) the moment
backward has produced it; Horovod's background thread wakes every cycle (HOROVOD_CYCLE_TIME,
1 ms by default), packs the gradients that every rank has ready into one fusion buffer of at most
HOROVOD_FUSION_THRESHOLD bytes (128 MB by default) and ring all-reduces it (Average), while
backward goes on; `optimizer.step()` waits for the last handle, then updates. Rank 0's initial
parameters and optimizer state are broadcast (`broadcast_parameters`,
`broadcast_optimizer_state`) after the canonical weights are loaded.

Modes (the transport under the same scheme, as the scheme catalogue names it):
- `gloo` (default): started by `horovodrun --gloo` (launchers/rendezvous/horovod.py); Gloo's
  rendezvous, controller and CPU all-reduce.
- `mpi`: started by `mpirun`; MPI controller and MPI all-reduce (OpenMPI).
- `gloo-fp16`: `gloo` with Horovod's fp16 compression (`hvd.Compression.fp16`): each gradient
  cast to float16 before it joins a fusion buffer and cast back after the all-reduce.

Options (RunConfig.options), set as Horovod's variables before `hvd.init()`:
- `fusion_mb`: fusion threshold in MiB -> HOROVOD_FUSION_THRESHOLD (bytes); 0 disables fusion.
- `cycle_ms`: cycle time in milliseconds -> HOROVOD_CYCLE_TIME.

Profiling (Trainer.profile_step):
- overlapped: exactly the fast path: `loss.backward()` (the hooks start the all-reduces as
  gradients appear), then `optimizer.synchronize()` waits for the last one; the lap
  `backward_comm` ends there, and the update runs under `optimizer.skip_synchronize()` (Horovod's
  documented pattern for work between synchronize and step), so nothing is reduced twice.
- separated: backward without any communication, then the whole gradient all-reduced by
  Horovod. The hooks Horovod registered sit on the parameters' AccumulateGrad nodes and cannot
  be removed, so backward runs as `torch.autograd.grad(loss, parameters)`: the same backward
  kernels, but the engine hands the leaves' gradients back instead of running AccumulateGrad,
  so no hook fires and nothing is sent (checked in tests/test_horovod.py); the gradients are put
  into `.grad`. Then `optimizer.synchronize()` - Horovod's public call, which submits every
  gradient no hook submitted through the same `allreduce_async_` path, fused by the same
  threshold, and waits - is the `comm` lap. The bytes, the fusion and the ring are the fast
  path's; only the timing relative to backward differs. (Alternatives rejected: raising the
  optimizer's private `_allreduce_delay` to hold the hooks back; `hvd.grouped_allreduce` would
  bypass the optimizer's own path.)

`gradients()` (the equivalence check's local gradients) uses the same hook-free backward, so it
starts no collective and leaves no pending handle behind.

Buffers (BatchNorm running statistics) are broadcast once at start and then stay per rank, as in
plain Horovod (DDP instead re-broadcasts rank 0's buffers every forward).

Horovod for MXNet as a second mode is not offered: it needs its own Horovod build inside the MXNet
environment (NumPy < 1.24) and an MXNet Trainer path this adapter does not share.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from adapters.base import FrameworkUnavailable, PhaseTimer
from adapters.pytorch import TorchTrainer
from core import schemes as catalogue

try:
    import horovod
    import horovod.torch as hvd
except ImportError as error:  # this environment lacks Horovod: the run says so in one line
    hvd = None
    IMPORT_ERROR = error

# Horovod 0.28.1's defaults, shown when no option is given (the catalogue's options).
DEFAULT_FUSION_MB = float(catalogue.OPTIONS["fusion_mb"].default)
DEFAULT_CYCLE_MS = float(catalogue.OPTIONS["cycle_ms"].default)
MODES = catalogue.FRAMEWORKS["horovod"].modes
COMPRESSIONS = {"": "none", "fp16": "fp16"}  # the catalogue's wire encoding -> hvd.Compression's


def horovod_variables(options: dict) -> dict[str, str]:
    """Horovod's variables for the run's options (fusion_mb, cycle_ms); empty keeps defaults."""
    values = {}
    if options.get("fusion_mb") is not None:
        fusion_mb = float(options["fusion_mb"])
        if fusion_mb < 0:
            raise ValueError(f"fusion_mb must be >= 0, got {fusion_mb}")
        values["HOROVOD_FUSION_THRESHOLD"] = str(int(round(fusion_mb * 1024 * 1024)))
    if options.get("cycle_ms") is not None:
        cycle_ms = float(options["cycle_ms"])
        if cycle_ms < 0:
            raise ValueError(f"cycle_ms must be >= 0, got {cycle_ms}")
        values["HOROVOD_CYCLE_TIME"] = repr(cycle_ms)
    return values


class HorovodTrainer(TorchTrainer):
    def __init__(self, spec, config, dist_info):
        if hvd is None:
            raise FrameworkUnavailable(f"Horovod is not installed here ({IMPORT_ERROR})")
        if config.mode not in MODES:
            raise ValueError(f"unknown horovod mode {config.mode!r} (known: {', '.join(MODES)})")
        super().__init__(spec, config, dist_info)  # builds the network, calls _wrap_distributed
        self.params = [p for p in self.network.parameters() if p.requires_grad]
        self.optimizer = hvd.DistributedOptimizer(
            self.optimizer, named_parameters=self.network.leaves.named_parameters(),
            op=hvd.Average, compression=getattr(hvd.Compression, self.compression))
        # Horovod's zero_grad() takes no argument (it refuses while all-reduces are pending,
        # then calls torch's, whose default is set_to_none=True); TorchTrainer's code calls it
        # with torch's signature, so give the instance that signature.
        horovod_zero_grad = self.optimizer.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            if not set_to_none:
                raise ValueError("Horovod's optimizer only sets gradients to None")
            horovod_zero_grad()

        self.optimizer.zero_grad = zero_grad

    # -- set-up ------------------------------------------------------------------------------
    def _wrap_distributed(self, network):
        """Set the fusion/cycle variables, join Horovod's job, check it is the one expected."""
        if self.device.type == "cuda" and not hvd.nccl_built():
            raise FrameworkUnavailable("this Horovod was built without GPU (NCCL) support")
        built = hvd.gloo_built() if self.transport == "gloo" else hvd.mpi_built()
        if not built:
            raise FrameworkUnavailable(f"this Horovod was built without {self.transport}")
        os.environ.update(horovod_variables(self.config.options))
        hvd.init()
        enabled = hvd.gloo_enabled() if self.transport == "gloo" else hvd.mpi_enabled()
        if not enabled:
            raise RuntimeError(f"horovod:{self.config.mode} asked, but Horovod started with "
                               f"{'gloo' if hvd.gloo_enabled() else 'mpi'}: wrong launcher?")
        if (hvd.size(), hvd.rank()) != (self.dist.world_size, self.dist.rank):
            raise RuntimeError(f"Horovod says rank {hvd.rank()} of {hvd.size()}, the launcher "
                               f"rank {self.dist.rank} of {self.dist.world_size}")
        return network  # no wrapper: DistributedOptimizer's hooks do the communication

    @property
    def transport(self) -> str:
        """Horovod's controller and CPU operations: the catalogue's transport of the mode."""
        return catalogue.scheme("horovod", self.config.mode).transport

    @property
    def compression(self) -> str:
        """hvd.Compression's member for the mode's wire encoding (the catalogue's)."""
        return COMPRESSIONS[catalogue.scheme("horovod", self.config.mode).wire]

    @property
    def backend(self) -> str:
        return f"horovod-{self.transport}"

    @property
    def fusion_mb(self) -> float:
        value = os.environ.get("HOROVOD_FUSION_THRESHOLD")
        return DEFAULT_FUSION_MB if value is None else int(value) / (1024 * 1024)

    @property
    def cycle_ms(self) -> float:
        value = os.environ.get("HOROVOD_CYCLE_TIME")
        return DEFAULT_CYCLE_MS if value is None else float(value)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights):
        super().load_weights(weights)
        # Horovod's start-of-training idiom: rank 0's parameters, buffers and optimizer state.
        # (broadcast_optimizer_state initialises the empty momentum buffers to zeros with a
        # zero-gradient step: the same update as a fresh buffer on the first real step.)
        hvd.broadcast_parameters(self.network.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)

    def gradients(self, images, labels):
        x, y = self._to_device(torch.from_numpy(images), torch.from_numpy(labels))
        loss = F.cross_entropy(self.network(x), y)
        named = list(self.network.leaves.named_parameters())
        grads = torch.autograd.grad(loss, [p for _, p in named])  # no hook fires: nothing sent
        return float(loss), {name: g.detach().cpu().numpy().copy()
                             for (name, _), g in zip(named, grads)}

    # -- iterations (step() is TorchTrainer's: zero_grad, backward_and_aggregate, and
    # optimizer.step(), whose synchronize() waits for every all-reduce before SGD) ------------
    def profile_step(self, overlapped: bool):
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        loss = self.loss_of(images, labels)
        timer.lap("forward")
        self.optimizer.zero_grad()
        if overlapped:
            self.backward_and_aggregate(loss)
            if self.dist.distributed:
                self.optimizer.synchronize()  # what step() would wait for first
            timer.lap("backward_comm")
        else:
            self.backward_local(loss)
            timer.lap("backward")
            if self.dist.distributed:
                self.aggregate_after_backward()
            timer.lap("comm")
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        timer.lap("update")
        self._loss = loss.detach()
        return timer.laps

    # -- the aggregation scheme ----------------------------------------------------------------
    def backward_and_aggregate(self, loss):
        """Backward; DistributedOptimizer's hooks start each gradient's all-reduce as soon as
        it is accumulated, and Horovod fuses what is ready every cycle."""
        loss.backward()

    def backward_local(self, loss):
        """Backward with no communication: autograd.grad does not run the AccumulateGrad nodes
        that carry Horovod's hooks (see the module docstring)."""
        grads = torch.autograd.grad(loss, self.params)
        for parameter, grad in zip(self.params, grads):
            parameter.grad = grad

    def aggregate_after_backward(self):
        """The whole gradient through Horovod after backward: synchronize() submits every
        gradient no hook submitted (all of them here), fused, and waits."""
        self.optimizer.synchronize()

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def scheme_options(self):
        """The fusion threshold and cycle Horovod runs with (its variables, which a user may
        also set). In the model: per-tensor messages merged by a simulation of the background
        thread's cycles (`perfmodel.merge_by_cycle`): googlenet-tiny's 116 tensors go as ~34
        messages during a 47 ms backward at 1 ms cycles (a greedy merge would send 4). The
        separated profile submits everything at once: buffers of at most the threshold.
        Fusion off (fusion_mb 0): one all-reduce per tensor."""
        return {**self.config.options, "fusion_mb": self.fusion_mb, "cycle_ms": self.cycle_ms}

    def layer_backward_profile(self):
        """As TorchTrainer's (one iteration, no communication nor update; when each layer's
        gradient is final, from the start of backward), but the stamps come from tensor hooks,
        which torch.autograd.grad runs, instead of post-accumulate hooks, which it does not:
        backward here is the hook-free one of the separated profile."""
        images, labels = self._to_device(*next(self.batches))
        loss = self.loss_of(images, labels)
        self.optimizer.zero_grad()
        ready = self.layer_ready_times(loss, lambda param, hook: param.register_hook(hook))
        self.optimizer.zero_grad()
        return ready

    def collective_call(self, nbytes):
        """Horovod's allreduce (Sum, in place) of a float32 tensor, as the optimizer submits
        one (through the background thread, its cycle and fusion buffer), waited for: calls
        back to back are separate all-reduces (submitted together they would be fused)."""
        if hvd.size() < 2:
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or "
                                      "more workers")
        tensor = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)
        name = f"dlcompare.calibrate.{int(nbytes)}"
        return lambda: hvd.allreduce_(tensor, op=hvd.Sum, name=name)

    def submit_collective(self, tensor, name):
        """Horovod's allreduce_async_ (Sum, in place), as DistributedOptimizer's hook submits a
        gradient: the background thread fuses what is ready at each cycle."""
        return hvd.allreduce_async_(tensor, op=hvd.Sum, name=name)

    def wait_collective(self, handle):
        hvd.synchronize(handle)

    def barrier(self):
        if hvd.is_initialized():
            hvd.barrier()

    def versions(self):
        facts = {**super().versions(), "horovod": horovod.__version__,
                 "horovod_built": ",".join(name for name, built in (
                     ("gloo", hvd.gloo_built()), ("mpi", hvd.mpi_built()),
                     ("nccl", hvd.nccl_built())) if built)}
        if self.transport == "mpi":
            try:
                from mpi4py import MPI  # only where mpi4py happens to be installed
                facts["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
            except ImportError:
                pass
        return facts

    def describe(self):
        return {**super().describe(), "backend": self.backend if self.dist.distributed else "none",
                "ddp_bucket_mb": None, "fusion_mb": self.fusion_mb, "cycle_ms": self.cycle_ms,
                "compression": None if self.compression == "none" else self.compression,
                "scheme": "Horovod DistributedOptimizer: per-gradient hooks, tensor fusion, "
                          "ring all-reduce overlapped with backward"}

    def close(self):
        if hvd.is_initialized():
            hvd.shutdown()


TRAINERS = {mode: HorovodTrainer for mode in MODES}
