"""PyTorch adapter: one process per worker, DistributedDataParallel over gloo (CPU) or NCCL (GPU).

DDP is PyTorch's idiomatic data-parallel scheme: gradients are bucketed (25 MB by default)
and each bucket is all-reduced from an autograd hook as soon as backward has filled it, so
communication overlaps the rest of backward. With one worker the model is not wrapped.

The other modes change one thing of DDP each, through PyTorch's own API:

- ``ddp-fp16``: DDP's fp16 compression hook (each bucket all-reduced as float16);
- ``ddp-powersgd``: DDP's PowerSGD hook (each gradient matrix sent as a rank-r factorisation,
  with error feedback and warm start; ``--option powersgd_rank=R``);
- ``zero``: DDP's all-reduce with the optimizer's state sharded (``ZeroRedundancyOptimizer``:
  each rank updates its shard, then the updated parameters are broadcast from their owners);
- ``fsdp``: no DDP; FSDP2's ``fully_shard`` on every layer with parameters (full sharding:
  each layer's parameters all-gathered before its forward and again before its backward, its
  gradient reduce-scattered after).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor, distribute_tensor

from adapters.base import DistInfo, FrameworkUnavailable, MessageLog, PhaseTimer, RunConfig, Trainer
from adapters.data import SyntheticBatches, decode_jpeg, list_jpeg_dataset
from core import schemes as catalogue
from models import layers as L


# ----------------------------------------------------------------------------- model builder

class Network(nn.Module, L.TreeBuilder):
    """The shared description executed in PyTorch.

    Leaves live in one flat ModuleDict keyed by the description's layer names, so the state
    dict names are exactly the canonical names (`conv1.weight`) and no mapping table is needed;
    `forward` runs the description's tree over those leaves through the shared walker.
    """

    def __init__(self, spec, dropout: bool):
        super().__init__()
        self.spec = spec
        self.leaves = nn.ModuleDict({layer.name: make_leaf(layer, shape, dropout)
                                     for layer, shape in spec.leaf_inputs()})

    def forward(self, x):
        return L.walk(self.spec.root, x, self)

    def leaf(self, layer, x):
        return self.leaves[layer.name](x)

    def concat(self, node, outputs):
        return torch.cat(outputs, dim=1)

    def add(self, node, body, shortcut):
        return body + shortcut


def make_leaf(layer, in_shape, dropout: bool) -> nn.Module:
    channels = in_shape[0]
    if isinstance(layer, L.Conv2d):
        return nn.Conv2d(channels, layer.out_channels, layer.kernel, layer.stride, layer.pad,
                         groups=layer.groups, bias=layer.bias)
    if isinstance(layer, L.Pool2d):
        return make_pool(layer)
    if isinstance(layer, L.LRN):
        # torch's LRN divides alpha by size like Caffe's ACROSS_CHANNELS LRN.
        return nn.LocalResponseNorm(layer.size, layer.alpha, layer.beta, layer.k)
    if isinstance(layer, L.ReLU):
        return nn.ReLU(inplace=True)
    if isinstance(layer, L.Dropout):
        return nn.Dropout(layer.p) if dropout and layer.p > 0 else nn.Identity()
    if isinstance(layer, L.BatchNorm):
        # Canonical momentum is the running-average factor (Caffe); torch's is its complement.
        return nn.BatchNorm2d(channels, eps=layer.eps, momentum=1.0 - layer.momentum)
    if isinstance(layer, L.Linear):
        return nn.Linear(int(np.prod(in_shape)), layer.out_features, bias=layer.bias)
    if isinstance(layer, L.Flatten):
        return nn.Flatten()
    raise TypeError(f"no PyTorch builder for {type(layer).__name__}")


def make_pool(layer) -> nn.Module:
    if layer.global_pool:
        return nn.AdaptiveMaxPool2d(1) if layer.mode == "max" else nn.AdaptiveAvgPool2d(1)
    # ceil_mode reproduces Caffe's output size rule, including its last-window clipping.
    if layer.mode == "max":
        return nn.MaxPool2d(layer.kernel, layer.stride, layer.pad, ceil_mode=True)
    return nn.AvgPool2d(layer.kernel, layer.stride, layer.pad, ceil_mode=True)


# ----------------------------------------------------------------------------- input pipelines

class JpegDataset(torch.utils.data.Dataset):
    """The generated class-folder JPEGs, decoded with Pillow in DataLoader worker processes."""

    def __init__(self, root: str, height: int, width: int):
        self.items = list_jpeg_dataset(root)
        self.height, self.width = height, width

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        path, label = self.items[index]
        return torch.from_numpy(decode_jpeg(path, self.height, self.width)), label


def endless(loader, sampler):
    """Iterate a DataLoader forever, advancing the sampler's epoch so shuffles differ."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def synthetic_tensors(batches: SyntheticBatches, pin: bool):
    for images, labels in batches:
        images, labels = torch.from_numpy(images), torch.from_numpy(labels)
        yield (images.pin_memory(), labels.pin_memory()) if pin else (images, labels)


# ----------------------------------------------------------------------------- math mode

# torch 2.9 and later set TF32 through fp32_precision settings; mixing them with the older
# allow_tf32 flags makes torch refuse to read either, so only one of the two is ever used.
FP32_PRECISION_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def set_tf32(enabled: bool) -> None:
    """TF32 tensor-core math for convolutions and matrix products, on or off."""
    if FP32_PRECISION_API:
        precision = "tf32" if enabled else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def tf32_enabled() -> bool:
    """Whether convolutions run TF32 math (what `set_tf32` set)."""
    if FP32_PRECISION_API:
        return torch.backends.cudnn.conv.fp32_precision == "tf32"
    return bool(torch.backends.cudnn.allow_tf32)


# ----------------------------------------------------------------------------- trainer

class TorchTrainer(Trainer):
    # float32 (TF32 math off), tf32 (TF32 tensor-core math, GPU only), bfloat16 (autocast:
    # bfloat16 compute where autocast has it, float32 weights and loss)
    DTYPES = ("float32", "tf32", "bfloat16")

    def __init__(self, spec, config: RunConfig, dist_info: DistInfo):
        super().__init__(spec, config, dist_info)
        torch.manual_seed(config.seed)
        torch.set_num_threads(max(1, config.threads_per_worker))
        self.device = self._select_device()
        self._set_math_mode()
        self.channels_last = bool(config.options.get("channels_last", False))
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = bool(config.options.get("cudnn_benchmark", True))
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        self.network = Network(spec, config.dropout).to(self.device,
                                                         memory_format=self.memory_format)
        self.log = MessageLog()  # the latest iteration's messages, for the run's trace
        self.model = self._wrap_distributed(self.network)
        self.optimizer = self._optimizer()
        self.batches = self._input_pipeline()
        self._loss = None

    # -- set-up ------------------------------------------------------------------------------
    def _select_device(self) -> torch.device:
        """GPU `local_rank`; with the share_gpu option, ranks beyond the GPUs present share
        them round-robin (and talk over gloo: NCCL refuses two ranks on one device)."""
        self.ranks_per_gpu = None
        if self.config.device != "gpu":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise FrameworkUnavailable("--device gpu asked, but torch sees no CUDA GPU")
        count, index = torch.cuda.device_count(), self.dist.local_rank
        if self.config.workers_per_node > count:
            if not self.config.options.get("share_gpu"):
                raise FrameworkUnavailable(f"{self.config.workers_per_node} ranks per node, but "
                                           f"torch sees {count} GPU(s) (option share_gpu=true "
                                           f"lets ranks share them)")
            self.ranks_per_gpu = -(-self.config.workers_per_node // count)
            index %= count
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def _set_math_mode(self) -> None:
        """float32 computes in float32 (cuDNN's convolutions default to TF32 on GPUs that have
        it, so TF32 is switched off); tf32 switches it on for convolutions and matrix products."""
        tf32 = self.config.dtype == "tf32"
        if tf32 and self.device.type != "cuda":
            raise FrameworkUnavailable("tf32 is a GPU's tensor-core math; a CPU has none")
        if self.device.type == "cuda":
            set_tf32(tf32)

    def loss_of(self, images, labels):
        """Forward and loss, under bfloat16 autocast for the bfloat16 dtype (backward then
        follows the same precisions outside it, as autocast wants)."""
        precision = (torch.autocast(self.device.type, dtype=torch.bfloat16)
                     if self.config.dtype == "bfloat16" else contextlib.nullcontext())
        with precision:
            return F.cross_entropy(self.model(images), labels)

    @property
    def bucket_mb(self) -> float:
        """DDP's gradient bucket size (options.bucket_mb; PyTorch's default 25 MB)."""
        return float(self.config.options.get("bucket_mb", catalogue.OPTIONS["bucket_mb"].default))

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" and not self.ranks_per_gpu else "gloo"

    def _wrap_distributed(self, network):
        """Join the process group and wrap the network in this scheme's way (DDP here)."""
        if not self.dist.distributed:
            return network
        dist.init_process_group(self.backend, rank=self.dist.rank,
                                world_size=self.dist.world_size)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(network, device_ids=device_ids,
                                                  bucket_cap_mb=self.bucket_mb)
        self._register_comm_hook(ddp)
        return ddp

    def _register_comm_hook(self, ddp) -> None:
        """DDP's own all-reduce, timed for the trace where the future means done (gloo)."""
        if self.backend == "gloo":
            ddp.register_comm_hook(self.log, timed_allreduce_hook)

    def _optimizer(self):
        return torch.optim.SGD(self.network.parameters(), lr=self.config.lr, momentum=self.config.momentum)

    @property
    def pinned(self) -> bool:
        """Batches copied to the GPU from page-locked memory (options.pinned, default true)."""
        return self.device.type == "cuda" and bool(self.config.options.get("pinned", True))

    def _input_pipeline(self):
        pin = self.pinned
        if self.config.data == "synthetic":
            return synthetic_tensors(SyntheticBatches(
                self.spec, self.config.batch_per_worker, self.dist.rank, self.dist.world_size,
                self.config.seed), pin)
        _, height, width = self.spec.input_shape
        dataset = JpegDataset(self.config.data_dir, height, width)
        if len(dataset) < self.config.global_batch:
            raise ValueError(f"data set of {len(dataset)} images is smaller than the global "
                             f"batch {self.config.global_batch}")
        sampler = torch.utils.data.DistributedSampler(
            dataset, self.dist.world_size, self.dist.rank, shuffle=True, seed=self.config.seed,
            drop_last=True)
        workers = self.config.loader_workers
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=self.config.batch_per_worker, sampler=sampler, drop_last=True,
            num_workers=workers, pin_memory=pin, persistent_workers=workers > 0,
            prefetch_factor=2 if workers > 0 else None)
        return endless(loader, sampler)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights):
        state = {name: torch.from_numpy(np.ascontiguousarray(value))
                 for name, value in weights.items()}
        missing, unexpected = self.network.leaves.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        if dist.is_initialized():  # DDP broadcast rank 0's at wrap time; re-sync after loading
            for tensor in self.network.state_dict().values():
                dist.broadcast(tensor, src=0)

    def export_weights(self):
        """The whole weights (a sharded parameter all-gathered: every rank calls this)."""
        return {name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().numpy().copy()
                for name, value in self.network.leaves.state_dict().items()
                if not name.endswith("num_batches_tracked")}

    def gradients(self, images, labels):
        self.network.zero_grad(set_to_none=True)
        x, y = self._to_device(torch.from_numpy(images), torch.from_numpy(labels))
        with self.no_communication():  # and the unwrapped network: local gradients
            loss = F.cross_entropy(self.network(x), y)
            loss.backward()
            grads = {name: p.grad.detach().cpu().numpy().copy()
                     for name, p in self.network.leaves.named_parameters()}
        self.network.zero_grad(set_to_none=True)
        return float(loss), grads

    # -- iterations ---------------------------------------------------------------------------
    def _to_device(self, images, labels):
        if self.device.type == "cpu":
            return images.contiguous(memory_format=self.memory_format), labels
        images = images.to(self.device, non_blocking=True, memory_format=self.memory_format)
        return images, labels.to(self.device, non_blocking=True)

    def step(self):
        images, labels = self._to_device(*next(self.batches))
        loss = self.loss_of(images, labels)
        self.log.clear()
        self.optimizer.zero_grad(set_to_none=True)
        self.backward_and_aggregate(loss)
        self.optimizer.step()
        self._loss = loss.detach()

    def profile_step(self, overlapped: bool):
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        # DDP decides at forward time whether backward will all-reduce, so the separated kind
        # runs forward and backward both inside no_sync.
        with contextlib.nullcontext() if overlapped else self.no_communication():
            loss = self.loss_of(images, labels)
            timer.lap("forward")
            self.log.clear()
            self.optimizer.zero_grad(set_to_none=True)
            if overlapped:
                self.backward_and_aggregate(loss)
                timer.lap("backward_comm")
            else:
                self.backward_local(loss)
                timer.lap("backward")
        if not overlapped:
            if self.dist.distributed:
                self.aggregate_after_backward()
            timer.lap("comm")
        self.optimizer.step()
        timer.lap("update")
        self._loss = loss.detach()
        return timer.laps

    # -- the aggregation scheme: what subclasses for other schemes override ---------------------
    def backward_and_aggregate(self, loss):
        """Backward with gradient aggregation the scheme's normal way: DDP's autograd hooks
        all-reduce 25 MB buckets while backward goes on."""
        loss.backward()

    def no_communication(self):
        """Context in which forward + backward send nothing (DDP's no_sync)."""
        if isinstance(self.model, nn.parallel.DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def backward_local(self, loss):
        """Backward only, no communication (inside no_communication()), for the separated
        profile."""
        loss.backward()

    def aggregate_after_backward(self):
        """Average the gradients across ranks once backward is done: one flat all-reduce."""
        grads = [p.grad for p in self.network.parameters() if p.grad is not None]
        self.log.timed("gradient", sum(g.numel() * g.element_size() for g in grads),
                       lambda: allreduce_flat(grads, self.dist.world_size))

    def last_messages(self):
        return self.log.messages if self.dist.distributed else None

    def last_loss(self):
        return float(self._loss) if self._loss is not None else float("nan")

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def barrier(self):
        if dist.is_initialized():
            dist.barrier()

    def device_memory(self):
        if self.device.type != "cuda":
            return None
        return (int(torch.cuda.max_memory_allocated(self.device)),
                int(torch.cuda.get_device_properties(self.device).total_memory))

    def any_rank(self, flag):
        if not self.dist.distributed or not dist.is_initialized():
            return super().any_rank(flag)
        vote = torch.tensor([1.0 if flag else 0.0], device=self.device)  # NCCL reduces on the device
        dist.all_reduce(vote)
        return bool(vote.item() > 0)

    def versions(self):
        facts = {"torch": torch.__version__, "torch_threads": str(torch.get_num_threads())}
        if torch.cuda.is_available():
            facts.update(cuda=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()),
                         nccl=".".join(map(str, torch.cuda.nccl.version())))
        return facts

    def device_name(self):
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return super().device_name()

    def describe(self):
        cuda = self.device.type == "cuda"
        return {"backend": self.backend if self.dist.distributed else "none",
                "ddp_bucket_mb": self.bucket_mb if self.dist.distributed else None,
                "layout": "NHWC" if self.channels_last else "NCHW",
                "cudnn_benchmark": torch.backends.cudnn.benchmark if cuda else None,
                "tf32": tf32_enabled() if cuda else None,
                "autocast": "bfloat16" if self.config.dtype == "bfloat16" else None,
                "pinned": self.pinned if cuda else None, "ranks_per_gpu": self.ranks_per_gpu}

    def close(self):
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def comm_transport(self):
        return self.backend

    def comm_scheme(self):
        """The catalogue's description, with DDP's first bucket as this torch sizes it."""
        scheme = super().comm_scheme()
        if scheme is not None and "first_bucket_bytes" in scheme:
            scheme["first_bucket_bytes"] = int(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES",
                                                       scheme["first_bucket_bytes"]))
        return scheme

    def layer_backward_profile(self):
        """One iteration without communication or update; a post-accumulate-grad hook on each
        parameter stamps when its gradient is final (a CUDA event on GPU). The hooks exist only
        during this call, so step() pays nothing."""
        images, labels = self._to_device(*next(self.batches))
        with self.no_communication():  # the forward too: DDP arms its all-reduce hooks in forward
            loss = self.loss_of(images, labels)
            self.optimizer.zero_grad(set_to_none=True)
            ready = self.layer_ready_times(
                loss, lambda param, hook: param.register_post_accumulate_grad_hook(hook))
        self.optimizer.zero_grad(set_to_none=True)
        return ready

    def layer_ready_times(self, loss, register) -> list[tuple[str, float]]:
        """Seconds from the start of a communication-free backward of `loss` until each layer's
        last parameter gradient is ready, earliest first. `register(param, hook)` attaches the
        stamping hook (which kind fires depends on how backward is run); the hooks are removed
        before returning."""
        cuda = self.device.type == "cuda"
        stamps: dict[str, list] = {}

        def stamp(layer):
            def hook(_):
                if cuda:
                    event = torch.cuda.Event(enable_timing=True)
                    event.record()
                    stamps.setdefault(layer, []).append(event)
                else:
                    stamps.setdefault(layer, []).append(time.perf_counter())
            return hook

        handles = [register(param, stamp(name.rsplit(".", 1)[0]))
                   for name, param in self.network.leaves.named_parameters()
                   if param.requires_grad]
        try:
            self.sync()
            if cuda:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                start = time.perf_counter()
            self.backward_local(loss)
            self.sync()
        finally:
            for handle in handles:
                handle.remove()
        if cuda:
            ready = {layer: max(start.elapsed_time(e) for e in events) / 1e3
                     for layer, events in stamps.items()}
        else:
            ready = {layer: max(events) - start for layer, events in stamps.items()}
        return sorted(ready.items(), key=lambda item: item[1])

    def collective_call(self, nbytes):
        """`allreduce_flat` of a float32 gradient-like tensor (copy into a flat buffer,
        dist.all_reduce SUM, average, copy back: what the whole-gradient all-reduce and, in
        C++, DDP's buckets do per message)."""
        if not dist.is_initialized():
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or more workers")
        tensor = torch.zeros(max(1, int(nbytes) // 4), dtype=torch.float32, device=self.device)
        return lambda: allreduce_flat([tensor], self.dist.world_size)

    def submit_collective(self, tensor, name: str):
        """Start the scheme's all-reduce (SUM) of `tensor` without waiting, as DDP's reducer
        does for a bucket; `wait_collective` waits for what it returns."""
        return dist.all_reduce(tensor, async_op=True)

    def wait_collective(self, handle) -> None:
        handle.wait()

    def contention_probe(self, rounds: int) -> dict:
        """The contention calibration (adapters/calibration.py): the communication-free
        backward of the separated profile, timed alone and with each parameter's gradient
        all-reduced (a copy, through `submit_collective`, not waited for) from a tensor hook
        the moment backward computes it, the way WFBP hooks submit gradients; alternating,
        `rounds` of each after one of each untimed. Backward ends when backward_local returns,
        the exchange once every collective has been waited for after it. Returns the times, the
        gradients' bytes and the alone run's hook times (from backward's start) in submit
        order, for `analysis.calibration.fit_contention`.  Each round also replays the
        exchange alone (`_probe_replay`)."""
        params = [p for _, p in self.network.leaves.named_parameters() if p.requires_grad]
        rounds_ = self.probe_rounds(lambda send: self._probe_backward(params, send), rounds,
                                    replay=lambda stamps: self._probe_replay(params, stamps))
        order, ready = zip(*rounds_.pop("ready"))
        return {"bytes": [params[i].numel() * params[i].element_size() for i in order],
                **rounds_, "ready_s": list(ready)}

    def _probe_backward(self, params, submit: bool) -> tuple[float, list[tuple[int, float]], float]:
        """One forward and communication-free backward; with `submit`, a tensor hook per
        parameter all-reduces a copy of its gradient. (seconds, [(parameter index, hook time
        from the start)] in hook order, seconds until every collective was back)."""
        images, labels = self._to_device(*next(self.batches))
        stamps, handles = [], []

        def hook_for(index):
            def hook(grad):
                stamps.append((index, time.perf_counter()))
                if submit:
                    handles.append(self.submit_collective(grad.detach().clone(), f"dlcompare.probe.{index}"))
            return hook

        hooks = [param.register_hook(hook_for(i)) for i, param in enumerate(params)]
        try:
            with self.no_communication():
                loss = self.loss_of(images, labels)
                self.optimizer.zero_grad(set_to_none=True)
                self.sync()
                start = time.perf_counter()
                self.backward_local(loss)
                self.sync()
                seconds = time.perf_counter() - start
        finally:
            for hook in hooks:
                hook.remove()
        self._probe_wait(handles)
        done = time.perf_counter() - start
        self.optimizer.zero_grad(set_to_none=True)
        return seconds, [(index, t - start) for index, t in stamps], done

    def _probe_wait(self, handles) -> None:
        """After the probe's backward: wait for what its hooks submitted."""
        for handle in handles:
            self.wait_collective(handle)

    def _probe_replay(self, params, stamps) -> float:
        """The probe's exchange without backward: each parameter's message submitted at its
        hook time in `stamps` (from the alone half of the round) by sleeping until then, all
        waited for; seconds from the start until the last was back.  Where this ends later
        than the fitted per-message cost says (Horovod's last cycle, a handle's wait), the
        sending half's exchange ends later by as much with no contention at all."""
        tensors = [torch.zeros_like(params[index]) for index, _ in stamps]
        handles = []

        def send(i):
            handles.append(self.submit_collective(tensors[i], f"dlcompare.probe.{stamps[i][0]}"))

        return self.replay_at([offset for _, offset in stamps], send, lambda: self._probe_wait(handles))


def timed_allreduce_hook(log: MessageLog, bucket):  # no annotations: DDP checks them as objects
    """DDP's comm hook over gloo: the bucket averaged as DDP's built-in all-reduce averages it
    (divided by the world size, then summed), noted in `log` from the moment DDP hands it over
    to the moment gloo has finished it, so the trace shows DDP's own messages.  Over NCCL the
    future completes when the collective is queued, not done, so DDP keeps its built-in hook
    and the trace shows no messages there."""
    tensor, world = bucket.buffer(), dist.get_world_size()
    start = time.time()
    tensor.div_(world)

    def done(future):
        log.messages.append([f"bucket {bucket.index()}", start, time.time(),
                             tensor.numel() * tensor.element_size()])
        return future.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(done)


def allreduce_flat(grads: list, world_size: int, dtype=None) -> None:
    """Average `grads` over all ranks in one all-reduce of their concatenation (sent as
    `dtype` where given: float16 halves the bytes)."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dtype is None:
        dist.all_reduce(flat)
        flat /= world_size
    else:  # divided first, as DDP's fp16 hook does, so the float16 sum cannot overflow
        wire = flat.to(dtype).div_(world_size)
        dist.all_reduce(wire)
        flat = wire.to(flat.dtype)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()


# ----------------------------------------------------------------------------- DDP's variants

def timed_hook(timed, bucket):  # no annotations: DDP checks them as objects
    """A DDP comm hook (`TimedHook.hook`) noted in the trace's log from the moment DDP hands
    the bucket over until its future is done, with the bytes it puts on the wire."""
    start = time.time()

    def done(future):
        timed.log.messages.append([f"bucket {bucket.index()}", start, time.time(), timed.wire_bytes(bucket)])
        return future.value()

    return timed.hook(timed.state, bucket).then(done)


class TimedHook:
    """What `timed_hook` wraps: PyTorch's hook, its state, the log and the bucket's wire bytes."""

    def __init__(self, log: MessageLog, hook, state, wire_bytes):
        self.log, self.hook, self.state, self.wire_bytes = log, hook, state, wire_bytes


class CompressedDdpTrainer(TorchTrainer):
    """DDP with one of PyTorch's compression hooks (`hook_and_state`).  Over gloo the hook is
    timed for the trace (its future completes when the data is back); over NCCL it runs as is.
    The separated profile sends the same bytes after backward (`aggregate_after_backward`).
    The bytes on the wire are the catalogue's (`core.schemes.wire_bytes`)."""

    def hook_and_state(self):
        raise NotImplementedError

    def _register_comm_hook(self, ddp) -> None:
        hook, state = self.hook_and_state()
        if self.backend == "gloo":
            ddp.register_comm_hook(TimedHook(self.log, hook, state, self.bucket_wire_bytes), timed_hook)
        else:
            ddp.register_comm_hook(state, hook)

    @property
    def wire(self) -> str:
        return catalogue.scheme(self.config.framework, self.config.mode).wire

    def wire_bytes(self, shape) -> int:
        return catalogue.wire_bytes(self.wire, tuple(shape), self.config.options)

    def bucket_wire_bytes(self, bucket) -> int:
        return sum(self.wire_bytes(p.shape) for p in bucket.parameters())


class Fp16DdpTrainer(CompressedDdpTrainer):
    """torch:ddp-fp16: each bucket cast to float16, all-reduced, cast back
    (`default_hooks.fp16_compress_hook`): half the bytes, the gradient rounded to float16."""

    def hook_and_state(self):
        return default_hooks.fp16_compress_hook, None

    def aggregate_after_backward(self):
        """The whole gradient as one float16 all-reduce, as the hook sends each bucket."""
        grads = [p.grad for p in self.network.parameters() if p.grad is not None]
        self.log.timed("gradient (fp16)", sum(self.wire_bytes(g.shape) for g in grads),
                       lambda: allreduce_flat(grads, self.dist.world_size, torch.float16))

    def describe(self):
        return {**super().describe(), "compression": "fp16"}


class PowerSgdDdpTrainer(CompressedDdpTrainer):
    """torch:ddp-powersgd: PyTorch's PowerSGD hook (Vogels et al. 2019): each gradient matrix
    M (n x m, a convolution's kernel viewed as out x rest) is sent as P = M Q and Q = M^T P of
    rank r, with error feedback and warm start; matrices that would not shrink enough
    (`core.schemes.powersgd_factors`), and vectors, go uncompressed in one all-reduce.  The
    first `START_ITER` steps are plain all-reduces (PyTorch needs two before it compresses);
    the warm-up covers them."""

    START_ITER = 2

    @property
    def rank_r(self) -> int:
        return int(self.config.options.get("powersgd_rank", catalogue.OPTIONS["powersgd_rank"].default))

    def hook_and_state(self):
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=self.rank_r, start_powerSGD_iter=self.START_ITER,
            min_compression_rate=catalogue.POWERSGD_MIN_COMPRESSION_RATE, random_seed=self.config.seed)
        return powerSGD_hook.powerSGD_hook, state

    def aggregate_after_backward(self):
        """PowerSGD's two rounds after backward, without error feedback: every compressed
        matrix's P all-reduced, orthogonalised, Q all-reduced, M averaged as P Q^T; the rest
        in one flat all-reduce.  The same bytes as the hook, the ranks kept equal."""
        params = [p for p in self.network.parameters() if p.grad is not None]
        factors = [catalogue.powersgd_factors(tuple(p.shape), self.rank_r) for p in params]
        low = [(p.grad.view(f[0], f[1]), f[2]) for p, f in zip(params, factors) if f]
        world = self.dist.world_size

        def send():
            allreduce_flat([p.grad for p, f in zip(params, factors) if not f], world)
            if not low:
                return
            generator = torch.Generator().manual_seed(self.config.seed)
            qs = [torch.randn(m.shape[1], rank, generator=generator).to(m) for m, rank in low]
            ps = [m @ q for (m, _), q in zip(low, qs)]
            allreduce_flat(ps, 1)
            for p in ps:
                powerSGD_hook._orthogonalize(p.unsqueeze(0))  # in place, as the hook does to its batch
            qs = [m.t() @ p for (m, _), p in zip(low, ps)]
            allreduce_flat(qs, world)
            for (m, _), p, q in zip(low, ps, qs):
                m.copy_(p @ q.t())

        self.log.timed("gradient (PowerSGD)", sum(self.wire_bytes(p.shape) for p in params), send)

    def describe(self):
        return {**super().describe(), "compression": f"powersgd rank {self.rank_r}"}


class ZeroTrainer(TorchTrainer):
    """torch:zero: DDP's bucketed all-reduce, the optimizer's state sharded over the ranks
    (`torch.distributed.optim.ZeroRedundancyOptimizer`, ZeRO stage 1): each rank updates the
    parameters it owns and broadcasts them, so the update phase carries a parameter exchange."""

    def _optimizer(self):
        if not self.dist.distributed:
            return super()._optimizer()
        return ZeroRedundancyOptimizer(self.network.parameters(), optimizer_class=torch.optim.SGD,
                                       lr=self.config.lr, momentum=self.config.momentum)

    def describe(self):
        return {**super().describe(), "optimizer_sharding": "zero-1" if self.dist.distributed else None}


# ----------------------------------------------------------------------------- sharded data parallel

class FsdpTrainer(TorchTrainer):
    """torch:fsdp: FSDP2 (`fully_shard`) on every leaf layer that has parameters, then on the
    network (full sharding, FSDP2's defaults).  Each rank keeps 1/p of every parameter as a
    DTensor; a layer's parameters are all-gathered before its forward and again before its
    backward, and its gradient is reduce-scattered once backward has made it (FSDP2 overlaps
    these with the neighbouring layers' compute its own way).

    The separated profile runs FSDP2's explicit API instead: every layer all-gathered
    (`unshard`), forward and backward with resharding and gradient sync off, then each layer's
    gradient reduce-scattered as FSDP2 lays it out (`reduce_scatter_layer`): one all-gather and
    one reduce-scatter per layer, the bytes of a per-layer all-reduce, the same step."""

    @property
    def bucket_mb(self) -> float | None:
        return None  # FSDP2 sends one message per layer, not buckets

    def _wrap_distributed(self, network):
        if not self.dist.distributed:
            return network
        dist.init_process_group(self.backend, rank=self.dist.rank, world_size=self.dist.world_size)
        self.units, root = shard_fully(network)
        return root

    def _all_units(self):
        return [*self.units, self.model]

    @contextlib.contextmanager
    def _local_mode(self):
        """Forward and backward on the unsharded parameters, sending nothing: no resharding
        after forward or backward, no gradient sync.  On leaving, what no reduce-scatter took
        is dropped and every layer resharded."""
        units = self._all_units()
        for unit in units:
            self._set_local(unit, True)
        try:
            yield
        finally:
            for unit in units:
                reshard_dropping_local_grads(unit)
                self._set_local(unit, False)

    @staticmethod
    def _set_local(unit, local: bool) -> None:
        unit.set_reshard_after_forward(not local, recurse=False)
        unit.set_reshard_after_backward(not local, recurse=False)
        unit.set_requires_gradient_sync(not local, recurse=False)

    def _unshard_all(self) -> None:
        for unit in self._all_units():
            unit.unshard()

    @contextlib.contextmanager
    def no_communication(self):
        if not self.dist.distributed:
            yield
            return
        self._unshard_all()
        with self._local_mode():
            yield

    def profile_step(self, overlapped: bool):
        if overlapped or not self.dist.distributed:
            return super().profile_step(overlapped)
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        self.log.clear()
        nbytes = sum(p.numel() * p.element_size() for p in self.network.parameters())
        self.log.timed("all-gather", nbytes, self._unshard_all)
        timer.lap("comm")
        gathered = timer.laps.pop("comm")
        with self._local_mode():
            loss = self.loss_of(images, labels)
            timer.lap("forward")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            timer.lap("backward")
            self.log.timed("reduce-scatter", nbytes, self._reduce_scatter_all)
        timer.lap("comm")
        timer.laps["comm"] += gathered
        self.optimizer.step()
        timer.lap("update")
        self._loss = loss.detach()
        return timer.laps

    def _reduce_scatter_all(self) -> None:
        for unit in self.units:
            reduce_scatter_layer(unit, self.dist.rank, self.dist.world_size)

    def load_weights(self, weights):
        """Each rank takes its shard of every parameter (no message: every rank holds the
        canonical weights); buffers, which FSDP2 does not shard, are copied whole."""
        if not self.dist.distributed:
            return super().load_weights(weights)
        state = self.network.leaves.state_dict()
        if set(weights) != {name for name in state if not name.endswith("num_batches_tracked")}:
            raise ValueError(f"weights do not fit the model: {sorted(set(weights) ^ set(state))[:5]}")
        with torch.no_grad():
            for name, value in weights.items():
                full = torch.from_numpy(np.ascontiguousarray(value)).to(self.device)
                target = state[name]
                if isinstance(target, DTensor):
                    full = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
                target.copy_(full)

    def describe(self):
        return {**super().describe(), "parameter_sharding": "fsdp2-full" if self.dist.distributed else None}


def reduce_scatter_layer(unit, rank: int, world_size: int) -> None:
    """Average the unsharded gradients of FSDP2 layer `unit` and keep this rank's shard of
    each as its sharded parameter's gradient, in one reduce-scatter laid out as FSDP2 lays
    out its own: each rank's dim-0 chunk of every gradient (padded to the largest chunk),
    rank after rank.  Leaves `unit` resharded."""
    grads = [p.grad for p in unit.parameters()]
    chunks = [dim0_chunks(g, world_size) for g in grads]
    sizes = [chunk[0].numel() for chunk in chunks]  # the first chunk is the largest
    sent = grads[0].new_zeros(world_size, sum(sizes))
    for j, chunk in enumerate(chunks):
        offset = sum(sizes[:j])
        for r, part in enumerate(chunk):
            sent[r, offset:offset + part.numel()] = part.reshape(-1)
    mine = grads[0].new_empty(sum(sizes))
    dist.reduce_scatter_single(mine, sent.reshape(-1))
    mine /= world_size
    reshard_dropping_local_grads(unit)
    for j, (param, chunk) in enumerate(zip(unit.parameters(), chunks)):
        offset, shard = sum(sizes[:j]), chunk[rank]
        local = mine[offset:offset + shard.numel()].view_as(shard).clone()
        param.grad = DTensor.from_local(local, param.device_mesh, param.placements,
                                        shape=param.shape, stride=param.stride())


def shard_fully(network) -> tuple[list, nn.Module]:
    """FSDP2's `fully_shard` on every leaf layer of `network` that has parameters, then on the
    network: (the sharded layers, the sharded network)."""
    units = [leaf for leaf in network.leaves.values() if any(True for _ in leaf.parameters())]
    for unit in units:
        fully_shard(unit)
    return units, fully_shard(network)


def reshard_dropping_local_grads(unit) -> None:
    """Reshard FSDP2 module `unit`, first dropping the gradients its unsharded parameters hold
    (what a communication-free backward left and no reduce-scatter took)."""
    for param in unit.parameters():
        if not isinstance(param, DTensor):
            param.grad = None
    unit.reshard()


def dim0_chunks(tensor, world_size: int) -> list:
    """`world_size` chunks along dim 0 as FSDP2 shards a parameter (`torch.chunk`, empty
    chunks for the ranks beyond the rows)."""
    chunks = list(torch.chunk(tensor, world_size, dim=0))
    empty = tensor.new_empty((0, *tensor.shape[1:]))
    return chunks + [empty] * (world_size - len(chunks))


TRAINERS = {"ddp": TorchTrainer, "ddp-fp16": Fp16DdpTrainer, "ddp-powersgd": PowerSgdDdpTrainer,
            "zero": ZeroTrainer, "fsdp": FsdpTrainer}
