"""JAX adapter (CLI name `jax`): the shared description as pure `jax.lax` functions over
canonically named arrays, one jit-compiled step, data parallel over processes.

Mode `allreduce`: one process per worker joined by `jax.distributed` (its coordinator listens on
MASTER_ADDR:MASTER_PORT of the launcher's env:// rendezvous), a 1-D mesh of every process's one
device, and the step as `shard_map` over it: each device computes the loss and gradients of its
share of the global batch, `lax.pmean` of the gradients packed into one buffer averages them
(one all-reduce once backward has finished, XLA's collectives: gloo on CPUs, NCCL on GPUs),
every device applies the same momentum update.

Weights need no conversion (conv OIHW, linear (out, in)); activations are NCHW, or NHWC with the
`channels_last` option.  Caffe's conventions are matched as in the other adapters: ceil-mode
pooling windows (explicit padding; average pooling divided by the window clipped to the padded
input), LRN's alpha divided by size, batch-norm running variance Bessel-corrected with momentum
as the running-average factor, SGD momentum as PyTorch's (v = m v + g; w -= lr v).  Batch-norm
statistics are per rank (PyTorch DDP without SyncBN).  On CPUs a grouped convolution runs as one
convolution per group (see `build_network`).

Threads: a CPU rank with one thread per worker (the launcher's OMP_NUM_THREADS) runs XLA's
Eigen kernels single-threaded (`--xla_cpu_multi_thread_eigen=false` in XLA_FLAGS, which XLA
reads when its client starts, at the first use of a device).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# A GPU may be shared (ranks of one run on one device, another framework after it): take memory
# as needed instead of JAX's default 75% of the device at start-up.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jaxlib  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from adapters.base import (DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig, Trainer,  # noqa: E402
                           fused_step_laps, scale_to_fused)
from adapters.data import Cycle, SyntheticBatches, decode_jpeg, list_jpeg_dataset  # noqa: E402
from models import layers as L  # noqa: E402
from models.spec import pool_output_size  # noqa: E402

AXIS = "data"
# jax.shard_map, and lax.pcast to differentiate replicated weights per device, are JAX >= 0.7's;
# older releases have shard_map in jax.experimental and no pcast (one process still runs).
shard_map = getattr(jax, "shard_map", None)
if shard_map is None:
    from jax.experimental.shard_map import shard_map  # noqa: E402 - JAX before 0.7
PCAST = getattr(lax, "pcast", None)


# ----------------------------------------------------------------------------- model builder

@dataclass
class Context:
    """What a leaf reads and writes while the network runs."""

    params: dict
    state: dict  # batch-norm running statistics, by canonical name
    training: bool
    key: jax.Array | None  # dropout's key (None: no dropout)
    new_state: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Where the channels are: NCHW (canonical) or NHWC (XLA's CPU convolutions run faster on
    it); weights stay canonical (OIHW, linear (out, in)) either way."""

    name: str

    @property
    def channel(self) -> int:
        return 1 if self.name == "NCHW" else 3

    @property
    def spatial(self) -> tuple[int, int]:
        return (2, 3) if self.name == "NCHW" else (1, 2)

    def per_channel(self, vector):
        """A (C,) vector shaped to broadcast over activations."""
        return vector[None, :, None, None] if self.name == "NCHW" else vector

    def window(self, channel: int, height: int, width: int) -> tuple[int, int, int, int]:
        """A (batch, channel, height, width) tuple in this layout's axis order."""
        return (1, channel, height, width) if self.name == "NCHW" else (1, height, width, channel)

    def images(self, array):
        """Canonical NCHW images to this layout."""
        return array if self.name == "NCHW" else array.transpose(0, 2, 3, 1)


def build_network(spec, dropout: bool, layout: Layout = Layout("NCHW"), native_groups: bool = True):
    """`apply(params, state, images, key) -> (logits, new_state)`: the description's tree walked
    at trace time (the shared walker), each leaf a function of the context.  Without `native_groups` a grouped
    convolution runs as one convolution per group (XLA's CPU backend computes grouped
    convolutions and their gradients 10-40x slower than the same work split)."""
    leaves = {layer.name: make_leaf(layer, shape, dropout, index, layout, native_groups)
              for index, (layer, shape) in enumerate(spec.leaf_inputs())}

    class Forward(L.TreeBuilder):
        def __init__(self, ctx):
            self.ctx = ctx

        def leaf(self, layer, x):
            return leaves[layer.name](x, self.ctx)

        def concat(self, node, outputs):
            return jnp.concatenate(outputs, axis=layout.channel)

        def add(self, node, body, shortcut):
            return body + shortcut

    def apply(params, state, images, key):
        ctx = Context(params, state, training=True, key=key)
        logits = L.walk(spec.root, images, Forward(ctx))
        return logits, {**state, **ctx.new_state}

    return apply


def make_leaf(layer, in_shape, dropout: bool, index: int, layout: Layout, native_groups: bool):
    if isinstance(layer, L.Conv2d):
        return conv_leaf(layer, layout, native_groups)
    if isinstance(layer, L.Pool2d):
        return pool_leaf(layer, in_shape, layout)
    if isinstance(layer, L.LRN):
        return lrn_leaf(layer, layout)
    if isinstance(layer, L.ReLU):
        return lambda x, ctx: jnp.maximum(x, 0.0)
    if isinstance(layer, L.Dropout):
        return dropout_leaf(layer, index) if dropout and layer.p > 0 else (lambda x, ctx: x)
    if isinstance(layer, L.BatchNorm):
        return batch_norm_leaf(layer, layout)
    if isinstance(layer, L.Linear):
        return linear_leaf(layer)
    if isinstance(layer, L.Flatten):  # the canonical flatten order is C, H, W
        return lambda x, ctx: (x if layout.name == "NCHW" else x.transpose(0, 3, 1, 2)).reshape(
            x.shape[0], -1)
    raise TypeError(f"no JAX builder for {type(layer).__name__}")


def conv_leaf(layer, layout: Layout, native_groups: bool):
    weight, bias = f"{layer.name}.weight", f"{layer.name}.bias"
    pad = [(layer.pad, layer.pad)] * 2
    numbers = (layout.name, "OIHW", layout.name)

    def convolve(x, w, groups):
        return lax.conv_general_dilated(x, w, (layer.stride,) * 2, pad, dimension_numbers=numbers,
                                        feature_group_count=groups)

    def conv(x, ctx):
        w = ctx.params[weight]
        if layer.groups == 1 or native_groups:
            y = convolve(x, w, layer.groups)
        else:
            y = jnp.concatenate([convolve(part, w_part, 1) for part, w_part in zip(
                jnp.split(x, layer.groups, axis=layout.channel), jnp.split(w, layer.groups, axis=0))],
                axis=layout.channel)
        return y + layout.per_channel(ctx.params[bias]) if layer.bias else y

    return conv


def window_counts(size: int, kernel: int, stride: int, pad: int, out: int) -> np.ndarray:
    """Caffe's average-pooling divisor along one axis: each window clipped to the padded input
    [-pad, size + pad), as PyTorch's count_include_pad=True."""
    starts = np.arange(out) * stride - pad
    return (np.minimum(starts + kernel, size + pad) - starts).astype(np.float32)


def pool_leaf(layer, in_shape, layout: Layout):
    _, height, width = in_shape
    if layer.global_pool:
        reduce = jnp.max if layer.mode == "max" else jnp.mean
        return lambda x, ctx: reduce(x, axis=layout.spatial, keepdims=True)
    k, s, p = layer.kernel, layer.stride, layer.pad
    out_h, out_w = pool_output_size(height, k, s, p), pool_output_size(width, k, s, p)
    # explicit padding that gives exactly Caffe's ceil-mode windows (the output is sliced to
    # size where the rule drops a last window that would start in the padding)
    pad_h = (p, max(0, (out_h - 1) * s + k - height - p))
    pad_w = (p, max(0, (out_w - 1) * s + k - width - p))
    padding = ((0, 0), (0, 0), pad_h, pad_w) if layout.name == "NCHW" else ((0, 0), pad_h, pad_w, (0, 0))
    window, strides = layout.window(1, k, k), layout.window(1, s, s)
    divisor = np.outer(window_counts(height, k, s, p, out_h), window_counts(width, k, s, p, out_w))
    divisor = divisor if layout.name == "NCHW" else divisor[:, :, None]

    def crop(y):
        return y[:, :, :out_h, :out_w] if layout.name == "NCHW" else y[:, :out_h, :out_w, :]

    def pool(x, ctx):
        if layer.mode == "max":
            return crop(lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding))
        return crop(lax.reduce_window(x, 0.0, lax.add, window, strides, padding)) / divisor

    return pool


def lrn_leaf(layer, layout: Layout):
    """Caffe's ACROSS_CHANNELS LRN: x / (k + alpha/size * sum of x^2 over `size` channels)^beta."""
    around = (layer.size // 2, (layer.size - 1) // 2)
    padding = tuple(around if axis == layout.channel else (0, 0) for axis in range(4))
    window = layout.window(layer.size, 1, 1)

    def lrn(x, ctx):
        summed = lax.reduce_window(x * x, 0.0, lax.add, window, (1, 1, 1, 1), padding)
        return x / (layer.k + layer.alpha / layer.size * summed) ** layer.beta

    return lrn


def dropout_leaf(layer, index: int):
    def drop(x, ctx):
        keep = jax.random.bernoulli(jax.random.fold_in(ctx.key, index), 1.0 - layer.p, x.shape)
        return jnp.where(keep, x / (1.0 - layer.p), 0.0)

    return drop


def batch_norm_leaf(layer, layout: Layout):
    name, factor = layer.name, layer.momentum  # running = momentum * running + (1 - m) * batch
    axes = tuple(axis for axis in range(4) if axis != layout.channel)

    def batch_norm(x, ctx):
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        scale = ctx.params[f"{name}.weight"] * lax.rsqrt(var + layer.eps)
        y = (x - layout.per_channel(mean)) * layout.per_channel(scale) \
            + layout.per_channel(ctx.params[f"{name}.bias"])
        count = x.size // x.shape[layout.channel]
        unbiased = var * count / max(count - 1, 1)
        for stat, batch in (("running_mean", mean), ("running_var", unbiased)):
            key = f"{name}.{stat}"
            ctx.new_state[key] = factor * ctx.state[key] + (1.0 - factor) * lax.stop_gradient(batch)
        return y

    return batch_norm


def linear_leaf(layer):
    weight, bias = f"{layer.name}.weight", f"{layer.name}.bias"

    def linear(x, ctx):
        y = x @ ctx.params[weight].T
        return y + ctx.params[bias] if layer.bias else y

    return linear


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy over the batch (PyTorch's F.cross_entropy)."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def sgd_momentum(params, momenta, grads, lr: float, momentum: float):
    """PyTorch's SGD with momentum: v = m v + g; w -= lr v."""
    momenta = jax.tree.map(lambda v, g: momentum * v + g, momenta, grads)
    params = jax.tree.map(lambda w, v: w - lr * v, params, momenta)
    return params, momenta


# ----------------------------------------------------------------------------- input pipeline

def jpeg_batches(config: RunConfig, rank: int, world_size: int, height: int, width: int):
    """The generated JPEG files, this rank's shard, shuffled per epoch with the run's seed,
    decoded with Pillow by `loader_workers` threads one batch ahead (Pillow's decoder releases
    the GIL)."""
    items = list_jpeg_dataset(config.data_dir)
    if len(items) < config.global_batch:
        raise ValueError(f"data set of {len(items)} images is smaller than the global batch "
                         f"{config.global_batch}")
    pool = ThreadPoolExecutor(max(1, config.loader_workers))

    def load(batch):
        images = list(pool.map(lambda item: decode_jpeg(item[0], height, width), batch))
        return np.stack(images), np.array([label for _, label in batch], np.int32)

    def batches():
        epoch = 0
        while True:
            order = np.random.default_rng(config.seed + epoch).permutation(len(items))
            mine = [items[i] for i in order[rank::world_size]]
            b = config.batch_per_worker
            for start in range(0, len(mine) - b + 1, b):
                yield mine[start:start + b]
            epoch += 1

    source = batches()
    pending = pool.submit(load, next(source))
    while True:
        ready, pending = pending.result(), pool.submit(load, next(source))
        yield ready


# ----------------------------------------------------------------------------- trainer

class JaxTrainer(Trainer):
    """Data parallel over processes (see the module docstring); one process is a mesh of one."""

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        if config.dtype != "float32":
            raise FrameworkUnavailable(f"the JAX adapter trains float32 only, not {config.dtype}")
        self.device, devices = self._start(config, dist)
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.replicated, self.sharded = NamedSharding(self.mesh, P()), NamedSharding(self.mesh, P(AXIS))
        self.param_names = list(spec.parameter_shapes())
        self.buffer_names = list(spec.buffer_shapes())
        self.layout = Layout("NHWC" if config.options.get("channels_last") else "NCHW")
        self.native_groups = self.device.platform != "cpu"
        self.apply = build_network(spec, config.dropout, self.layout, self.native_groups)
        self.params = {n: self._replicate(np.zeros(s, np.float32))
                       for n, s in spec.parameter_shapes().items()}
        self.momenta = {n: self._replicate(np.zeros(s, np.float32))
                        for n, s in spec.parameter_shapes().items()}
        self.state = {n: self._per_rank(np.zeros(s, np.float32))
                      for n, s in spec.buffer_shapes().items()}
        self.key = self._replicate(np.asarray(jax.random.key_data(jax.random.PRNGKey(config.seed))))
        self._build_functions()
        self.batches = self._input_pipeline()
        self._loss = None
        self._update_seconds = None

    # -- set-up ------------------------------------------------------------------------------
    @staticmethod
    def _start(config: RunConfig, dist: DistInfo):
        """Choose the platform, join the other processes; (this rank's device, the mesh's
        devices in rank order)."""
        gpu = config.device == "gpu"
        if not gpu and config.threads_per_worker <= 1:
            os.environ["XLA_FLAGS"] = " ".join(filter(None, (
                os.environ.get("XLA_FLAGS"), "--xla_cpu_multi_thread_eigen=false")))
        jax.config.update("jax_platforms", "cuda" if gpu else "cpu")
        if dist.distributed and PCAST is None:
            raise FrameworkUnavailable(f"JAX {jax.__version__} has no lax.pcast: several "
                                       "processes need JAX >= 0.7 (one process runs)")
        if dist.distributed:
            if not gpu:
                jax.config.update("jax_cpu_collectives_implementation", "gloo")
            try:
                address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            except KeyError:
                raise FrameworkUnavailable("jax needs MASTER_ADDR and MASTER_PORT (the "
                                           "launcher's env:// rendezvous)") from None
            jax.distributed.initialize(address, dist.world_size, dist.rank,
                                       local_device_ids=[dist.local_rank] if gpu else None)
        try:
            local = jax.local_devices()
        except RuntimeError as error:
            raise FrameworkUnavailable(f"--device gpu asked, but JAX sees no GPU ({error})"
                                       if gpu else str(error)) from None
        return local[0], (jax.devices() if dist.distributed else local[:1])

    def _replicate(self, array: np.ndarray) -> jax.Array:
        """The same value on every rank's device, as one global array."""
        return jax.make_array_from_single_device_arrays(
            array.shape, self.replicated, [jax.device_put(array, self.device)])

    def _per_rank(self, array: np.ndarray) -> jax.Array:
        """This rank's value as row `rank` of a global (world, ...) array."""
        return self._shard(array[None])

    def _shard(self, local: np.ndarray) -> jax.Array:
        """This rank's rows of a global array split over the mesh (the global batch)."""
        shape = (local.shape[0] * self.mesh.size, *local.shape[1:])
        return jax.make_array_from_single_device_arrays(
            shape, self.sharded, [jax.device_put(local, self.device)])

    def _local(self, array: jax.Array) -> np.ndarray:
        return np.asarray(array.addressable_data(0))

    def _build_functions(self):
        apply, lr, momentum = self.apply, self.config.lr, self.config.momentum
        dropout = self.config.dropout

        def loss_and_state(params, state, images, labels, key):
            logits, new_state = apply(params, state, images, key if dropout else None)
            return cross_entropy(logits, labels), new_state

        grad_fn = jax.value_and_grad(loss_and_state, has_aux=True)

        def rows(state):  # this device's row of per-rank arrays, and back
            return {n: v[0] for n, v in state.items()}

        def stacked(state):
            return {n: v[None] for n, v in state.items()}

        def per_rank_grads(params, state, images, labels, key):
            # Differentiated as device-varying, so the gradients stay this rank's own:
            # gradients of replicated weights would come back already summed over the mesh.
            varying = PCAST(params, AXIS, to="varying") if PCAST else params
            return grad_fn(varying, rows(state), images, labels, key)

        # The gradients travel packed into one buffer (as TensorFlow packs them): XLA's CPU
        # collectives run each leaf of a `lax.pmean` of a tree as its own gloo all-reduce, at
        # 0.5-4 ms apiece on a 2-core host (googlenet-tiny's 116 tensors: 54 ms), where the
        # packed buffer is one message.  Packing is a copy of the gradient, unpacking slices.
        _, unpack = ravel_pytree(self.params)

        def pack(grads):
            return ravel_pytree(grads)[0]

        def step(params, momenta, state, images, labels, key):
            key, sub = jax.random.split(key)
            sub = jax.random.fold_in(sub, lax.axis_index(AXIS))
            (loss, new_state), grads = per_rank_grads(params, state, images, labels, sub)
            grads = unpack(lax.pmean(pack(grads), AXIS))
            params, momenta = sgd_momentum(params, momenta, grads, lr, momentum)
            return params, momenta, stacked(new_state), lax.pmean(loss, AXIS), key

        def local_grads(params, state, images, labels, key):
            (loss, _), grads = per_rank_grads(params, state, images, labels, key)
            return loss[None], pack(grads)[None]

        def fused_local(params, momenta, state, images, labels, key):
            # the step's compute in one function without its all-reduce (outputs discarded)
            (loss, _), grads = per_rank_grads(params, state, images, labels, key)
            params, momenta = sgd_momentum(params, momenta, unpack(pack(grads)), lr, momentum)
            return loss[None], stacked(params), stacked(momenta)

        def forward(params, state, images, labels, key):
            return loss_and_state(params, rows(state), images, labels, key)[0][None]

        rep, shd = P(), P(AXIS)
        mapped = lambda fn, ins, outs: shard_map(fn, mesh=self.mesh, in_specs=ins, out_specs=outs)
        self._step = jax.jit(mapped(step, (rep, rep, shd, shd, shd, rep), (rep, rep, shd, rep, rep)),
                             donate_argnums=(0, 1, 2))
        self._local_grads = jax.jit(mapped(local_grads, (rep, shd, shd, shd, rep), (shd, shd)))
        self._fused_local = jax.jit(mapped(fused_local, (rep, rep, shd, shd, shd, rep), (shd, shd, shd)))
        self._forward = jax.jit(mapped(forward, (rep, shd, shd, shd, rep), shd))
        self._allreduce = jax.jit(mapped(lambda packed: lax.pmean(packed[0], AXIS), (shd,), rep))
        self._update = jax.jit(lambda p, m, packed: sgd_momentum(p, m, unpack(packed), lr, momentum),
                               donate_argnums=(0, 1))
        self._gradients = jax.jit(grad_fn)

    def _input_pipeline(self):
        rank, world = self.dist.rank, self.dist.world_size
        if self.config.data == "synthetic":
            pool = SyntheticBatches(self.spec, self.config.batch_per_worker, rank, world,
                                    self.config.seed)
            return Cycle([(images, labels.astype(np.int32)) for images, labels in pool.batches])
        _, height, width = self.spec.input_shape
        return jpeg_batches(self.config, rank, world, height, width)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights):
        expected = set(self.param_names) | set(self.buffer_names)
        missing, unexpected = expected - set(weights), set(weights) - expected
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        self.params = {n: self._replicate(np.asarray(weights[n], np.float32)) for n in self.param_names}
        self.momenta = {n: self._replicate(np.zeros_like(weights[n], np.float32)) for n in self.param_names}
        self.state = {n: self._per_rank(np.asarray(weights[n], np.float32)) for n in self.buffer_names}

    def export_weights(self):
        return {**{n: self._local(v) for n, v in self.params.items()},
                **{n: self._local(v)[0] for n, v in self.state.items()}}

    def gradients(self, images, labels):
        """Local gradients on this rank's batch (no communication); batch-norm statistics move
        as in a training step, as PyTorch's do."""
        params = {n: jax.device_put(self._local(v), self.device) for n, v in self.params.items()}
        state = {n: jax.device_put(self._local(v)[0], self.device) for n, v in self.state.items()}
        images = self.layout.images(np.asarray(images, np.float32))
        (loss, new_state), grads = self._gradients(
            params, state, jax.device_put(np.ascontiguousarray(images), self.device),
            jax.device_put(np.asarray(labels, np.int32), self.device), self._local(self.key))
        self.state = {n: self._per_rank(np.asarray(new_state[n])) for n in self.buffer_names}
        return float(loss), {n: np.asarray(g) for n, g in grads.items()}

    # -- iterations ---------------------------------------------------------------------------
    def _to_device(self, images, labels):
        images = np.ascontiguousarray(self.layout.images(np.asarray(images, np.float32)))
        return self._shard(images), self._shard(np.asarray(labels, np.int32))

    def step(self):
        images, labels = self._to_device(*next(self.batches))
        self.params, self.momenta, self.state, self._loss, self.key = self._step(
            self.params, self.momenta, self.state, images, labels, self.key)

    def profile_step(self, overlapped: bool):
        """Phases, the device synchronised between them (each piece its own compiled function).

        Separated kind: forward from a forward-only run of the batch, then forward and backward
        as one compiled function (backward = that - forward), the packed gradient's pmean as its
        own function (comm; 0 with one rank), the momentum update.  Last the step's compute as
        one function without the all-reduce (`fused_local`): backward and update are scaled so
        that forward + backward + update is its time, since separate functions cost more than
        the same work fused (as in the TensorFlow adapter).  Overlapped kind: the fused step
        (one function: forward, backward, pmean, update) minus the forward-only run and the
        separated kind's latest update."""
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        jax.block_until_ready(self._forward(self.params, self.state, images, labels, self.key))
        timer.lap("forward")
        if overlapped:
            self.params, self.momenta, self.state, self._loss, self.key = jax.block_until_ready(
                self._step(self.params, self.momenta, self.state, images, labels, self.key))
            timer.lap("backward_comm")
            return fused_step_laps(timer.laps, self._update_seconds or 0.0)
        loss, grads = jax.block_until_ready(
            self._local_grads(self.params, self.state, images, labels, self.key))
        timer.lap("backward")
        timer.laps["backward"] = max(0.0, timer.laps["backward"] - timer.laps["forward"])
        averaged = jax.block_until_ready(self._allreduce(grads))
        timer.lap("comm")
        if not self.dist.distributed:
            timer.laps["comm"] = 0.0  # one rank: nothing to communicate
        self.params, self.momenta = jax.block_until_ready(
            self._update(self.params, self.momenta, averaged))
        timer.lap("update")
        jax.block_until_ready(self._fused_local(self.params, self.momenta, self.state, images, labels,
                                                self.key))
        timer.lap("fused")
        laps = scale_to_fused(timer.laps, timer.laps.pop("fused"))
        self._update_seconds = laps["update"]
        self._loss = loss
        return laps

    def last_loss(self):
        if self._loss is None:
            return float("nan")
        return float(np.mean(self._local(self._loss)))

    def sync(self):
        jax.effects_barrier()
        for tree in (self.params, self.state):
            jax.block_until_ready(tree)

    def barrier(self):
        if self.dist.distributed:
            jax.block_until_ready(self._allreduce(self._shard(np.ones((1, 1), np.float32))))

    def versions(self):
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "jax_backend": jax.default_backend(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "jax_cpu_collectives": str(getattr(jax.config, "jax_cpu_collectives_implementation", ""))}

    def device_name(self):
        if self.device.platform != "cpu":
            return self.device.device_kind
        return super().device_name()

    def device_memory(self):
        """XLA's allocator statistics of this rank's device (None on a CPU, which has none)."""
        stats = self.device.memory_stats() if self.device.platform != "cpu" else None
        if not stats or "peak_bytes_in_use" not in stats:
            return None
        return int(stats["peak_bytes_in_use"]), int(stats.get("bytes_limit") or 0) or None

    def describe(self):
        return {"mesh_devices": self.mesh.size, "platform": self.device.platform,
                "layout": self.layout.name, "threads": self.config.threads_per_worker,
                "grouped_conv": "native" if self.native_groups else "split per group",
                "profile_note": "separated: forward-only function, forward+backward function "
                                "minus it, pmean function, update function, backward and update "
                                "scaled to one fused function of the step's compute; overlapped: "
                                "the fused step minus the forward-only run and the separated update"}

    def close(self):
        if self.dist.distributed:
            jax.distributed.shutdown()

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def sends_gradients(self):
        """The whole gradient is packed into one buffer and all-reduced once backward has
        finished, through XLA's collectives, where there are several processes."""
        return self.dist.distributed

    def comm_transport(self):
        return "nccl" if self.device.platform == "gpu" else "gloo"

    def collective_call(self, nbytes):
        """The adapter's own packed pmean of one float32 message (compiled per size in the
        calibration's warm-up)."""
        if not self.dist.distributed:
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or more workers")
        message = self._shard(np.zeros((1, max(1, int(nbytes) // 4)), np.float32))
        return lambda: jax.block_until_ready(self._allreduce(message))


TRAINERS = {"allreduce": JaxTrainer}
