"""TensorFlow adapter (CLI name `tf`): the shared model description as TensorFlow ops, trained
by a compiled (`tf.function`) custom loop, single device or distributed four ways.

Modes (the first is the default; every mode with one worker runs the single-device path, so
each mode's scaling table has the same 1-worker baseline):
  - `collective`: MultiWorkerMirroredStrategy, one process per worker, gradients averaged by
    collective all-reduce over gRPC (TF_CONFIG from launchers/rendezvous/tf.py). TF's default
    communication options pack every gradient into one all-reduce launched once backward has
    finished (no overlap); `options["bytes_per_pack"]` splits the packs so they can overlap.
  - `ps`: synchronous parameter servers as the study's TensorFlow ran them: TF1 graph mode
    (`tf.compat.v1`), variables placed on `--servers N` server processes by
    `replica_device_setter`, `SyncReplicasOptimizer` aggregating one gradient per worker per
    step. In adapters/tensorflow_ps.py.
  - `ps-async`: TF2 ParameterServerStrategy driven by a ClusterCoordinator: asynchronous by
    design (registered as not synchronous). In adapters/tensorflow_ps.py.
  - `mirrored`: MirroredStrategy over the GPUs of one process (`--workers N` = GPUs); the
    launcher starts one process. Needs GPUs.

The model is built from models/ by walking the description's tree (Sequential, Concat,
Residual) like adapters/pytorch.py does, with raw `tf.nn` ops over variables named by the
canonical names, so weights and gradients convert to and from the canonical layout by name:
conv OIHW <-> HWIO, linear (out, in) <-> (in, out) with the rows of the first Linear after a
Flatten permuted when activations are NHWC (the canonical flatten order is C, H, W).

Points where TensorFlow differs from Caffe/PyTorch and how they are matched:
  - Pooling: Caffe's ceil-mode output size; TF pools with 'SAME' where that gives the same
    windows, else with explicit padding (max pooling treats it as -inf), so every output shape
    equals models' shape inference (asserted while tracing).
  - LRN: TF's depth_radius is the half-width (size // 2) and its alpha is not divided by
    size: alpha_tf = alpha / size.
  - BatchNorm: fused batch norm with exponential_avg_factor = 1 - momentum (canonical
    momentum is the running-average factor); TF's running variance is Bessel-corrected like
    PyTorch's.
  - Grouped convolutions: TF has no CPU gradient kernel for them, so on CPU a grouped conv
    is split into one convolution per group; on GPU the native grouped kernel runs.
  - Layout: NHWC by default (TF's CPU kernels exist only for NHWC); NCHW on GPU on request
    (`options["layout"]`), refused on CPU with a FrameworkUnavailable message.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's start-up chatter out of stderr tails

import numpy as np
import tensorflow as tf

from adapters.base import DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig, Trainer
from adapters.data import SyntheticBatches, list_jpeg_dataset
from models import layers as L
from models.spec import conv_output_size

# ----------------------------------------------------------------------------- model builder


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """TensorFlow's 'SAME' rule: (output size, padding before, padding after)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2, total - total // 2


def window_padding(size: int, kernel: int, stride: int, pad: int, out: int):
    """How TF must pad one spatial axis to give `out` windows starting at -pad.

    Returns 'VALID', 'SAME' or (before, after); the after-padding only has to reach the last
    window's end ((out - 1) * stride + kernel), which is how Caffe's ceil mode lets the last
    pooling window hang over the edge.
    """
    after = (out - 1) * stride + kernel - size - pad
    if pad == 0 and after <= 0 and (size - kernel) // stride + 1 == out:
        return "VALID"
    same_out, same_before, _ = same_padding(size, kernel, stride)
    if same_out == out and same_before == pad:
        return "SAME"
    if after < 0:
        raise ValueError(f"window size {kernel} stride {stride} pad {pad} on {size}: the last "
                         "window ends inside the input; not a Caffe geometry")
    return (pad, after)


class Ctx:
    """Per-call state of a forward pass: the tensors to read and the updates it makes."""

    __slots__ = ("params", "buffers", "training", "update_stats", "updates")

    def __init__(self, params, buffers, training, update_stats):
        self.params, self.buffers = params, buffers
        self.training, self.update_stats = training, update_stats
        self.updates = []


class TFModel:
    """The shared description compiled into a tree of closures over `tf.nn` ops.

    Variables are not owned here: `__call__` reads them from the dicts it is given (keyed by
    canonical names), so the same model runs over strategy-mirrored variables, plain local
    variables or TF1 graph variables on parameter servers. Conversions between the canonical
    NumPy layout and TF's are per tensor name (`to_tf`, `to_canonical`).
    """

    def __init__(self, spec, layout: str = "NHWC", dropout: bool = True,
                 native_groups: bool = False):
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be NHWC or NCHW, got {layout!r}")
        self.spec = spec
        self.layout = layout
        self.channel_axis = 3 if layout == "NHWC" else 1
        self.dropout = dropout
        self.native_groups = native_groups
        self.to_tf_fns: dict = {}
        self.to_canonical_fns: dict = {}
        self.param_shapes = {name: self._tf_shape(name, shape)
                             for name, shape in spec.parameter_shapes().items()}
        self.buffer_shapes = dict(spec.buffer_shapes())
        self._pending_flatten = None
        self.root = self._compile(spec.root, spec.input_shape)

    # -- layout conversions ------------------------------------------------------------------
    def _tf_shape(self, name: str, shape: tuple) -> tuple:
        if len(shape) == 4:  # conv OIHW -> HWIO
            return (shape[2], shape[3], shape[1], shape[0])
        if len(shape) == 2:  # linear (out, in) -> (in, out)
            return (shape[1], shape[0])
        return tuple(shape)

    def to_tf(self, name: str, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array, dtype=np.float32)
        if name in self.to_tf_fns:
            return np.ascontiguousarray(self.to_tf_fns[name](array))
        if array.ndim == 4:
            return np.ascontiguousarray(array.transpose(2, 3, 1, 0))
        if array.ndim == 2:
            return np.ascontiguousarray(array.T)
        return array

    def to_canonical(self, name: str, array: np.ndarray) -> np.ndarray:
        array = np.asarray(array, dtype=np.float32)
        if name in self.to_canonical_fns:
            return np.ascontiguousarray(self.to_canonical_fns[name](array))
        if array.ndim == 4:
            return np.ascontiguousarray(array.transpose(3, 2, 0, 1))
        if array.ndim == 2:
            return np.ascontiguousarray(array.T)
        return array.copy()

    def images_to_layout(self, images: np.ndarray) -> np.ndarray:
        """Canonical NCHW batch -> this model's layout."""
        return np.ascontiguousarray(images.transpose(0, 2, 3, 1)) if self.layout == "NHWC" \
            else np.ascontiguousarray(images)

    def input_shape(self, batch) -> list:
        c, h, w = self.spec.input_shape
        return [batch, h, w, c] if self.layout == "NHWC" else [batch, c, h, w]

    # -- forward -----------------------------------------------------------------------------
    def __call__(self, images, params, buffers, training: bool = True,
                 update_stats: bool = True):
        """Logits for `images`, and the BN running-statistics assignments made (run them in
        TF1 graph mode; in eager and tf.function they have already run)."""
        ctx = Ctx(params, buffers, training, update_stats)
        return self.root(images, ctx), ctx.updates

    def loss(self, logits, labels):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    # -- compiling the description -----------------------------------------------------------
    def _expect(self, fn, node, out_shape):
        """Wrap `fn` so tracing asserts the output shape equals models' shape inference."""
        c, *hw = out_shape
        expected = ([*hw, c] if self.layout == "NHWC" else [c, *hw]) if hw else [c]

        def checked(x, ctx):
            y = fn(x, ctx)
            got = y.shape.as_list()[1:]
            if got != expected:
                raise AssertionError(f"{node.name}: TF output shape {got} but the model "
                                     f"description gives {expected}")
            return y

        return checked

    def _compile(self, node, shape):
        out = self.spec.output_shape(node, shape)
        if isinstance(node, L.Sequential):
            fns, current = [], shape
            for child in node.layers:
                fns.append(self._compile(child, current))
                current = self.spec.output_shape(child, current)

            def sequential(x, ctx):
                for fn in fns:
                    x = fn(x, ctx)
                return x

            return sequential
        if isinstance(node, L.Concat):
            branches = [self._compile(b, shape) for b in node.branches]
            axis = self.channel_axis
            return self._expect(lambda x, ctx: tf.concat([b(x, ctx) for b in branches], axis),
                                node, out)
        if isinstance(node, L.Residual):
            body = self._compile(node.body, shape)
            short = self._compile(node.shortcut, shape) if node.shortcut is not None else None
            return self._expect(
                lambda x, ctx: body(x, ctx) + (x if short is None else short(x, ctx)), node, out)
        return self._expect(self._leaf(node, shape, out), node, out)

    def _leaf(self, layer, shape, out):
        if not isinstance(layer, (L.ReLU, L.Dropout, L.Linear, L.Flatten)):
            self._pending_flatten = None
        if isinstance(layer, L.Conv2d):
            return self._conv(layer, shape)
        if isinstance(layer, L.Pool2d):
            return self._pool(layer, shape, out)
        if isinstance(layer, L.LRN):
            return self._lrn(layer)
        if isinstance(layer, L.ReLU):
            return lambda x, ctx: tf.nn.relu(x)
        if isinstance(layer, L.Dropout):
            if not (self.dropout and layer.p > 0):
                return lambda x, ctx: x
            return lambda x, ctx: tf.nn.dropout(x, rate=layer.p) if ctx.training else x
        if isinstance(layer, L.BatchNorm):
            return self._batch_norm(layer)
        if isinstance(layer, L.Flatten):
            if len(shape) == 3 and self.layout == "NHWC" and shape[1] * shape[2] > 1:
                self._pending_flatten = shape
            size = math.prod(shape)
            return lambda x, ctx: tf.reshape(x, [-1, size])
        if isinstance(layer, L.Linear):
            if self._pending_flatten is not None:
                self._permute_linear(layer.name, self._pending_flatten)
                self._pending_flatten = None
            return self._linear(layer)
        raise TypeError(f"no TensorFlow builder for {type(layer).__name__}")

    def _permute_linear(self, name: str, chw: tuple):
        """NHWC flattens (H, W, C); canonical weights index the (C, H, W) flatten."""
        c, h, w = chw
        perm = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).ravel()
        inverse = np.argsort(perm)
        self.to_tf_fns[f"{name}.weight"] = lambda a: a.T[perm]
        self.to_canonical_fns[f"{name}.weight"] = lambda a: a[inverse].T

    def _spatial(self, pair):
        before, after = pair
        if self.layout == "NHWC":
            return [[0, 0], [before, after], [before, after], [0, 0]]
        return [[0, 0], [0, 0], [before, after], [before, after]]

    def _conv(self, layer, shape):
        c, h, w = shape
        out = conv_output_size(h, layer.kernel, layer.stride, layer.pad)
        padding = window_padding(h, layer.kernel, layer.stride, layer.pad, out)
        if h != w:
            raise ValueError(f"{layer.name}: non-square inputs are not supported")
        padding = self._spatial(padding) if isinstance(padding, tuple) else padding
        fmt, axis, stride = self.layout, self.channel_axis, layer.stride
        wname, bname, groups = f"{layer.name}.weight", f"{layer.name}.bias", layer.groups
        split = groups > 1 and not self.native_groups

        def conv(x, ctx):
            kernel = ctx.params[wname]
            if split:
                y = tf.concat([tf.nn.conv2d(xg, kg, stride, padding, data_format=fmt)
                               for xg, kg in zip(tf.split(x, groups, axis),
                                                 tf.split(kernel, groups, 3))], axis)
            else:
                y = tf.nn.conv2d(x, kernel, stride, padding, data_format=fmt)
            return tf.nn.bias_add(y, ctx.params[bname], data_format=fmt) if layer.bias else y

        return conv

    def _pool(self, layer, shape, out):
        spatial = [1, 2] if self.layout == "NHWC" else [2, 3]
        if layer.global_pool:
            reduce = tf.reduce_max if layer.mode == "max" else tf.reduce_mean
            return lambda x, ctx: reduce(x, spatial, keepdims=True)
        c, h, w = shape
        if h != w:
            raise ValueError(f"{layer.name}: non-square inputs are not supported")
        k, s, p = layer.kernel, layer.stride, layer.pad
        padding = window_padding(h, k, s, p, out[1])
        fmt = self.layout
        if layer.mode == "max":
            padding = self._spatial(padding) if isinstance(padding, tuple) else padding
            return lambda x, ctx: tf.nn.max_pool2d(x, k, s, padding, data_format=fmt)
        if padding == "VALID":
            return lambda x, ctx: tf.nn.avg_pool2d(x, k, s, "VALID", data_format=fmt)
        # Caffe divides by the window clipped to the padded input (padding counts, the
        # overhang beyond it does not): sum over zero padding, divide by a constant map.
        before, after = (p, (out[1] - 1) * s + k - h - p)
        counts = np.empty((out[1], out[2]), np.float32)
        for i in range(out[1]):
            for j in range(out[2]):
                rows = min(i * s - p + k, h + p) - (i * s - p)
                cols = min(j * s - p + k, w + p) - (j * s - p)
                counts[i, j] = rows * cols
        scale = (k * k / counts)[:, :, None] if fmt == "NHWC" else (k * k / counts)[None]
        pads = self._spatial((before, after))
        return lambda x, ctx: tf.nn.avg_pool2d(tf.pad(x, pads), k, s, "VALID",
                                               data_format=fmt) * scale

    def _lrn(self, layer):
        radius, alpha = layer.size // 2, layer.alpha / layer.size

        def lrn(x, ctx):
            if self.layout == "NCHW":
                x = tf.transpose(x, [0, 2, 3, 1])
            y = tf.nn.local_response_normalization(x, radius, layer.k, alpha, layer.beta)
            return tf.transpose(y, [0, 3, 1, 2]) if self.layout == "NCHW" else y

        return lrn

    def _batch_norm(self, layer):
        n = layer.name
        factor = 1.0 - layer.momentum  # canonical momentum = running-average factor

        def batch_norm(x, ctx):
            mean, var = ctx.buffers[f"{n}.running_mean"], ctx.buffers[f"{n}.running_var"]
            if not ctx.training:
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                    x, ctx.params[f"{n}.weight"], ctx.params[f"{n}.bias"], mean, var,
                    epsilon=layer.eps, data_format=self.layout, is_training=False)
                return y
            y, new_mean, new_var = tf.compat.v1.nn.fused_batch_norm(
                x, ctx.params[f"{n}.weight"], ctx.params[f"{n}.bias"], mean, var,
                epsilon=layer.eps, data_format=self.layout, is_training=True,
                exponential_avg_factor=factor)
            if ctx.update_stats:
                ctx.updates.append(mean.assign(new_mean))
                ctx.updates.append(var.assign(new_var))
            return y

        return batch_norm

    def _linear(self, layer):
        wname, bname = f"{layer.name}.weight", f"{layer.name}.bias"

        def linear(x, ctx):
            y = tf.matmul(x, ctx.params[wname])
            return tf.nn.bias_add(y, ctx.params[bname]) if layer.bias else y

        return linear


# ----------------------------------------------------------------------------- input pipelines

def decode_jpeg_tf(path, height: int, width: int, layout: str):
    """adapters.data.decode_jpeg in TF ops: decode (accurate IDCT like Pillow), centre-crop,
    (x - 128) / 64, in the model's layout."""
    pixels = tf.io.decode_jpeg(tf.io.read_file(path), channels=3,
                               dct_method="INTEGER_ACCURATE")
    shape = tf.shape(pixels)
    top, left = (shape[0] - height) // 2, (shape[1] - width) // 2
    crop = tf.image.crop_to_bounding_box(pixels, top, left, height, width)
    image = (tf.cast(crop, tf.float32) - 128.0) / 64.0
    return tf.transpose(image, [2, 0, 1]) if layout == "NCHW" else image


def jpeg_dataset(config: RunConfig, model: TFModel, rank: int, world_size: int,
                 seed_offset: int = 0):
    """The generated JPEG files through tf.data: shuffled per epoch with the run's seed,
    sharded by rank (disjoint files per worker), decoded by parallel map, batched, prefetched."""
    items = list_jpeg_dataset(config.data_dir)
    if len(items) < config.global_batch:
        raise ValueError(f"data set of {len(items)} images is smaller than the global batch "
                         f"{config.global_batch}")
    _, height, width = model.spec.input_shape
    paths = tf.constant([p for p, _ in items])
    labels = tf.constant([label for _, label in items], tf.int64)
    parallel = max(1, config.loader_workers) if config.loader_workers else tf.data.AUTOTUNE
    return (tf.data.Dataset.from_tensor_slices((paths, labels))
            .shuffle(len(items), seed=config.seed + seed_offset, reshuffle_each_iteration=True)
            .shard(world_size, rank)
            .repeat()
            .map(lambda p, y: (decode_jpeg_tf(p, height, width, model.layout), y),
                 num_parallel_calls=parallel, deterministic=True)
            .batch(config.batch_per_worker, drop_remainder=True)
            .prefetch(2))


def synthetic_pool(spec, config: RunConfig, model: TFModel, rank: int, world_size: int):
    """adapters.data's synthetic batches (the same numbers every framework sees), in the
    model's layout, as NumPy."""
    pool = SyntheticBatches(spec, config.batch_per_worker, rank, world_size, config.seed)
    return [(model.images_to_layout(images), labels) for images, labels in pool.batches]


class Cycle:
    """Endless iteration over pre-made device tensors (synthetic data: no input cost)."""

    def __init__(self, batches):
        self.batches, self.position = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch


# ----------------------------------------------------------------------------- helpers

def configure_threads(config: RunConfig) -> None:
    threads = max(1, config.threads_per_worker)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(
        int(config.options.get("inter_op_threads", max(2, threads))))


def choose_layout(config: RunConfig, gpu: bool) -> str:
    """NHWC unless asked otherwise; NCHW only where TF has the kernels (GPU)."""
    asked = config.options.get("layout")
    if asked is None and config.options.get("channels_last"):
        asked = "NHWC"
    layout = (asked or ("NCHW" if gpu else "NHWC")).upper()
    if layout not in ("NHWC", "NCHW"):
        raise FrameworkUnavailable(f"unknown layout {layout!r} for TensorFlow (NHWC or NCHW)")
    if layout == "NCHW" and not gpu:
        raise FrameworkUnavailable(
            "TensorFlow has no NCHW kernels for convolution and pooling on the CPU; "
            "use NHWC (the default on CPU) or run on a GPU")
    return layout


def local_gpus(config: RunConfig, dist: DistInfo) -> list:
    """The GPUs this process uses (one per worker process; all asked ones in `mirrored`)."""
    if config.device != "gpu":
        tf.config.set_visible_devices([], "GPU")
        return []
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise FrameworkUnavailable("--device gpu asked, but TensorFlow sees no GPU "
                                   "(is the CUDA build, tensorflow[and-cuda], installed?)")
    if config.mode == "mirrored":
        wanted = config.workers_per_node
        if len(gpus) < wanted:
            raise FrameworkUnavailable(f"mirrored over {wanted} GPUs asked, TF sees {len(gpus)}")
        chosen = gpus[:wanted]
    else:
        chosen = [gpus[dist.local_rank % len(gpus)]]
    tf.config.set_visible_devices(chosen, "GPU")
    for gpu in chosen:
        tf.config.experimental.set_memory_growth(gpu, True)
    return chosen


def tf_versions() -> dict:
    facts = {"tensorflow": tf.__version__}
    build = tf.sysconfig.get_build_info()
    if build.get("is_cuda_build"):
        facts.update(cuda=str(build.get("cuda_version")), cudnn=str(build.get("cudnn_version")))
    return facts


def momentum_update(var, slot, grad, lr, momentum):
    """PyTorch's SGD with momentum, in one fused kernel: slot = m * slot + g; var -= lr * slot."""
    return tf.raw_ops.ResourceApplyMomentum(var=var.handle, accum=slot.handle,
                                            lr=tf.cast(lr, var.dtype), grad=grad,
                                            momentum=tf.cast(momentum, var.dtype),
                                            use_locking=False, use_nesterov=False)


# ----------------------------------------------------------------------------- trainers

class TensorFlowTrainer(Trainer):
    """Dispatches on the mode: constructing TensorFlowTrainer gives the mode's subclass."""

    def __new__(cls, spec, config: RunConfig, dist: DistInfo):
        if cls is TensorFlowTrainer:
            cls = trainer_class(config, dist)
        return super().__new__(cls)

    @classmethod
    def serve(cls, config: RunConfig, role: str, index: int) -> int:
        from adapters.tensorflow_ps import serve

        return serve(config, role, index)

    _profile_ready = False

    def profile_step(self, overlapped: bool):
        """See `_profile`. The first call first runs one untimed iteration of each kind: the
        profile's own functions are traced and optimised on first use, which the worker's
        warm-up (of `step`) does not cover. Every rank calls this equally often, so the
        extra iterations keep synchronous ranks in step."""
        if not self._profile_ready:
            self._profile_ready = True
            self._profile(False)
            self._profile(True)
        return self._profile(overlapped)

    def _profile(self, overlapped: bool) -> dict:
        raise NotImplementedError


def trainer_class(config: RunConfig, dist: DistInfo):
    distributed = config.world_size > 1
    if config.mode == "ps" and distributed:
        from adapters.tensorflow_ps import GraphPSTrainer

        return GraphPSTrainer
    if config.mode == "ps-async" and distributed:
        from adapters.tensorflow_ps import AsyncPSTrainer

        return AsyncPSTrainer
    if config.mode not in ("collective", "ps", "ps-async", "mirrored"):
        raise FrameworkUnavailable(f"unknown TensorFlow mode {config.mode!r}")
    return StrategyTrainer


class StrategyTrainer(TensorFlowTrainer):
    """TF2 custom training loop: one device, `collective` (MultiWorkerMirroredStrategy) or
    `mirrored` (MirroredStrategy over local GPUs).

    The fast path is one tf.function per step: forward, backward, the strategy's all-reduce
    of the whole gradient (TF packs it into one tensor unless `bytes_per_pack` is set) and
    the momentum update. `profile_step` runs the same pieces separately (see its docstring).
    """

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        if config.dtype != "float32":
            raise FrameworkUnavailable(f"the TensorFlow adapter trains in float32 only, "
                                       f"not {config.dtype}")
        configure_threads(config)
        tf.random.set_seed(config.seed)
        self.gpus = local_gpus(config, dist)
        self.layout = choose_layout(config, bool(self.gpus))
        self.model = TFModel(spec, self.layout, config.dropout, native_groups=bool(self.gpus))
        self.xla = bool(config.options.get("xla", False))
        self.strategy = self._make_strategy()
        self.replicas = self.strategy.num_replicas_in_sync if self.strategy else 1
        self.local_replicas = (len(self.strategy.extended.worker_devices)
                               if self.strategy else 1)
        self.comm_options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=int(config.options.get("bytes_per_pack", 0)))
        self._create_variables()
        self._build_functions()
        self.batches = self._input_pipeline()
        self._loss = None
        self._update_seconds = None

    # -- set-up ------------------------------------------------------------------------------
    def _make_strategy(self):
        if self.config.mode == "mirrored" and len(self.gpus) > 1:
            return tf.distribute.MirroredStrategy([g.name.replace("physical_device:", "")
                                                   for g in self.gpus])
        if self.config.mode == "mirrored" and self.config.workers_per_node > 1:
            raise FrameworkUnavailable("mode 'mirrored' runs one process over several GPUs; "
                                       "this machine has none for TensorFlow (use collective)")
        if not self.dist.distributed:
            return None
        if "TF_CONFIG" not in os.environ:
            raise FrameworkUnavailable("collective mode needs TF_CONFIG (set by the launcher)")
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                          if self.gpus else
                          tf.distribute.experimental.CommunicationImplementation.RING)
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation))

    def _scope(self):
        import contextlib

        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    def _create_variables(self):
        with self._scope():
            self.params = {name: tf.Variable(tf.zeros(shape), name=name.replace(".", "/"))
                           for name, shape in self.model.param_shapes.items()}
            self.slots = {name: tf.Variable(tf.zeros(shape), trainable=False,
                                            name=name.replace(".", "/") + "/momentum")
                          for name, shape in self.model.param_shapes.items()}
            # Per-replica statistics (like PyTorch without SyncBatchNorm); read from the
            # first replica, so reading them needs no collective.
            self.buffers = {name: tf.Variable(tf.zeros(shape), trainable=False,
                                              name=name.replace(".", "/"),
                                              synchronization=tf.VariableSynchronization.ON_READ,
                                              aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                            for name, shape in self.model.buffer_shapes.items()}
        self.names = list(self.params)
        self.trainable = [self.params[n] for n in self.names]

    def _local(self, variables: dict) -> dict:
        """This process's (first) local copy of each variable."""
        return {n: (v.values[0] if hasattr(v, "values") else v) for n, v in variables.items()}

    def _build_functions(self):
        model, lr, momentum = self.model, self.config.lr, self.config.momentum
        names = self.names

        def grads_fn(images, labels):
            with tf.GradientTape() as tape:
                logits, _ = model(images, self.params, self.buffers, training=True)
                loss = model.loss(logits, labels)
            grads = tape.gradient(loss, [self.params[n] for n in names])
            return loss, grads

        self._grads = tf.function(grads_fn, jit_compile=self.xla)

        def apply_local(params, slots, grads):
            for name, grad in zip(names, grads):
                momentum_update(params[name], slots[name], grad, lr, momentum)

        def apply_cross(strategy, grads):
            for name, grad in zip(names, grads):
                strategy.extended.update(self.params[name], momentum_update,
                                         args=(self.slots[name], grad, lr, momentum),
                                         group=False)

        def replica_step(images, labels):
            loss, grads = self._grads(images, labels)
            if self.strategy is None:
                apply_local(self.params, self.slots, grads)
                return loss
            context = tf.distribute.get_replica_context()
            if self.replicas > 1:
                grads = context.all_reduce(tf.distribute.ReduceOp.MEAN, grads,
                                           options=self.comm_options)
            context.merge_call(apply_cross, args=(grads,))
            return loss

        def train_step(images, labels):
            if self.strategy is None:
                return replica_step(images, labels)
            return self.strategy.run(replica_step, args=(images, labels))

        self._train_step = tf.function(train_step)

        # Profile pieces over this process's local copies (one replica per process).
        local_params, local_slots, local_buffers = (self._local(self.params),
                                                    self._local(self.slots),
                                                    self._local(self.buffers))
        self._local_params = local_params

        def forward_local(images, labels):
            logits, _ = model(images, local_params, local_buffers, training=True)
            return model.loss(logits, labels)

        def forward_probe(images, labels):  # forward only, statistics left alone
            logits, _ = model(images, local_params, local_buffers, training=True,
                              update_stats=False)
            return model.loss(logits, labels)

        self._forward_probe = tf.function(forward_probe, jit_compile=self.xla)

        def local_grads(images, labels):  # forward and backward in one graph, as in the step
            with tf.GradientTape() as tape:
                loss = forward_local(images, labels)
            return loss, tape.gradient(loss, [local_params[n] for n in names])

        self._local_grads = tf.function(local_grads, jit_compile=self.xla)

        def allreduce(grads):
            def replica(grads):
                # Function inputs carry no device; the collective needs one to reduce to.
                with tf.device(self.strategy.extended.worker_devices[0]):
                    grads = [tf.identity(g) for g in grads]
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.MEAN, grads, options=self.comm_options)

            return self.strategy.run(replica, args=(grads,))

        self._allreduce = tf.function(allreduce) if self.replicas > 1 else None
        self._apply_local = tf.function(
            lambda grads: apply_local(local_params, local_slots, grads))
        self._fused_local = None  # built at the first profile iteration (`_fused_local_step`)

        def barrier_fn():
            def replica():
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.ones([]))

            return self.strategy.run(replica)

        self._barrier = tf.function(barrier_fn) if self.replicas > 1 else None

    def _input_pipeline(self):
        """Batches as device tensors: (images in the model's layout, int64 labels)."""
        rank, world = self.dist.rank, self.dist.world_size
        if self.local_replicas > 1:  # mirrored: local replica i is rank i of the process
            return self._distributed_input()
        if self.config.data == "synthetic":
            device = "/GPU:0" if self.gpus else "/CPU:0"
            with tf.device(device):
                pool = [(tf.constant(images), tf.constant(labels))
                        for images, labels in synthetic_pool(self.spec, self.config, self.model,
                                                             rank, world)]
            return Cycle(pool)
        return iter(jpeg_dataset(self.config, self.model, rank, world))

    def _distributed_input(self):
        replicas = self.local_replicas
        if self.config.data == "synthetic":
            pools = [synthetic_pool(self.spec, self.config, self.model, r, replicas)
                     for r in range(replicas)]
            batches = []
            for step in range(len(pools[0])):
                batches.append(self.strategy.experimental_distribute_values_from_function(
                    lambda ctx, step=step: tuple(
                        tf.constant(a) for a in pools[ctx.replica_id_in_sync_group][step])))
            return Cycle(batches)

        def dataset_fn(context):
            return jpeg_dataset(self.config, self.model, context.input_pipeline_id,
                                context.num_input_pipelines)

        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    # -- weights -----------------------------------------------------------------------------
    def load_weights(self, weights):
        expected = set(self.params) | set(self.buffers)
        missing, unexpected = expected - set(weights), set(weights) - expected
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {sorted(missing)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        for name, variable in {**self.params, **self.buffers}.items():
            variable.assign(self.model.to_tf(name, weights[name]))
        for slot in self.slots.values():
            slot.assign(tf.zeros_like(slot))

    def export_weights(self):
        return {name: self.model.to_canonical(name, variable.numpy())
                for name, variable in {**self.params, **self.buffers}.items()}

    def gradients(self, images, labels):
        x = tf.constant(self.model.images_to_layout(images))
        y = tf.constant(labels)
        if self.strategy is not None:
            loss, grads = self.strategy.run(self._grads, args=(x, y))
            loss = self.strategy.experimental_local_results(loss)[0]
            grads = [self.strategy.experimental_local_results(g)[0] for g in grads]
        else:
            loss, grads = self._grads(x, y)
        return float(loss), {name: self.model.to_canonical(name, g.numpy())
                             for name, g in zip(self.names, grads)}

    # -- iterations --------------------------------------------------------------------------
    def step(self):
        images, labels = next(self.batches)
        self._loss = self._train_step(images, labels)

    def _to_device(self, images, labels):
        if not self.gpus or self.local_replicas > 1:
            return images, labels
        with tf.device("/GPU:0"):
            return tf.identity(images), tf.identity(labels)

    def _fused_local_step(self):
        """The step's compute as TF runs it, without the network: forward, backward, the
        gradients packed into one flat tensor and split back (what the packed all-reduce does
        around its ring) and the momentum update, in one graph. The update goes to scratch
        copies of the weights and momenta, so the replicas stay in step."""
        if self._fused_local is None:
            names, model = self.names, self.model
            params, buffers = self._local_params, self._local(self.buffers)
            scratch = {n: tf.Variable(tf.identity(params[n]), trainable=False) for n in names}
            slots = {n: tf.Variable(tf.zeros_like(params[n]), trainable=False) for n in names}
            lr, momentum = self.config.lr, self.config.momentum

            def fused(images, labels):
                with tf.GradientTape() as tape:
                    logits, _ = model(images, params, buffers, training=True, update_stats=False)
                    loss = model.loss(logits, labels)
                grads = tape.gradient(loss, [params[n] for n in names])
                packed = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
                parts = tf.split(packed, [int(np.prod(g.shape)) for g in grads])
                for name, grad, part in zip(names, grads, parts):
                    momentum_update(scratch[name], slots[name], tf.reshape(part, grad.shape),
                                    lr, momentum)
                return loss

            self._fused_local = tf.function(fused, jit_compile=self.xla)
        return self._fused_local

    def _profile(self, overlapped: bool):
        """Phases, the device synchronised between them.

        Separated kind: forward from a forward-only run of the batch, then forward and backward
        as one compiled graph, as the fused step has them (backward = that graph - forward).
        Timed as two graphs instead (a forward graph under an eager tape keeping what backward
        needs, then the backward graph), alexnet-tiny's backward took 38 ms on 2 CPU cores,
        more than the whole fused step with its all-reduce, and the timed loops between such
        profile rounds ran at 44 ms per step instead of 19. Then the all-reduce of the local
        gradients as its own compiled function (comm), then the momentum update. Last the
        step's compute as one graph (`_fused_local_step`): backward and update are scaled so
        that forward + backward + update is that graph's time. Separate functions cost up to
        10% more than the fused step's compute (each boundary passes every gradient, the
        update is its own dispatch; googlenet-tiny on 2 CPU cores: 39.7 + 8.7 ms against 44.4
        fused), while the fused step itself was this graph + a one-tensor all-reduce of the
        same bytes within 3% for the three tiny models.
        Overlapped kind: TF's own fused step (one graph: forward, backward, all-reduce,
        update); backward_comm = fused step - forward - update, with forward from a forward-only
        run of the same batch just before and update from the latest separated iteration
        (TF fuses them into one graph, so only their sum is directly measured).
        """
        if self.local_replicas > 1:
            return self._profile_fused(overlapped)
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        if overlapped:
            self._forward_probe(images, labels)
            timer.lap("forward")
            self._loss = self._train_step(images, labels)
            timer.lap("backward_comm")
            update = self._update_seconds or 0.0
            timer.laps["backward_comm"] = max(0.0, timer.laps["backward_comm"]
                                              - timer.laps["forward"] - update)
            timer.laps["update"] = update
            return timer.laps
        self._forward_probe(images, labels)
        timer.lap("forward")
        loss, grads = self._local_grads(images, labels)
        timer.lap("backward")
        timer.laps["backward"] = max(0.0, timer.laps["backward"] - timer.laps["forward"])
        if self._allreduce is not None:
            grads = self._allreduce(grads)
            grads = [self.strategy.experimental_local_results(g)[0] for g in grads]
            timer.lap("comm")
        else:
            timer.laps["comm"] = 0.0  # one replica: nothing to communicate
        self._apply_local(grads)
        timer.lap("update")
        self._fused_local_step()(images, labels)
        timer.lap("fused")
        laps = timer.laps
        fused, separate = laps.pop("fused"), laps["backward"] + laps["update"]
        if separate > 0:
            scale = max(0.0, fused - laps["forward"]) / separate
            laps["backward"], laps["update"] = laps["backward"] * scale, laps["update"] * scale
        self._update_seconds = laps["update"]
        self._loss = loss
        return laps

    def _profile_fused(self, overlapped: bool):
        """Several replicas in one process (mirrored on GPUs): io, then the fused step with
        forward taken from a forward-only run; backward, all-reduce and update not separated."""
        timer = PhaseTimer(self.sync)
        images, labels = next(self.batches)
        timer.lap("io")
        timer.laps["h2d"] = 0.0
        self.strategy.run(self._forward_probe, args=(images, labels))
        timer.lap("forward")
        self._loss = self._train_step(images, labels)
        timer.lap("backward_comm" if overlapped else "backward")
        rest = max(0.0, timer.laps.pop("backward_comm" if overlapped else "backward")
                   - timer.laps["forward"])
        if overlapped:
            timer.laps.update(backward_comm=rest, update=0.0)
        else:
            timer.laps.update(backward=rest, comm=0.0, update=0.0)
        return timer.laps

    def last_loss(self):
        if self._loss is None:
            return float("nan")
        if self.strategy is not None and not isinstance(self._loss, tf.Tensor):
            return float(self.strategy.experimental_local_results(self._loss)[0])
        return float(self._loss)

    def sync(self):
        if self.gpus:
            tf.test.experimental.sync_devices()

    def barrier(self):
        if self._barrier is not None:
            self._barrier()

    def versions(self):
        return {**tf_versions(),
                "tf_intra_op_threads": str(tf.config.threading.get_intra_op_parallelism_threads()),
                "tf_inter_op_threads": str(tf.config.threading.get_inter_op_parallelism_threads())}

    def device_name(self):
        if self.gpus:
            details = tf.config.experimental.get_device_details(self.gpus[0])
            return details.get("device_name", "GPU")
        return super().device_name()

    def describe(self):
        facts = {"layout": self.layout, "xla": self.xla, "replicas": self.replicas,
                 "single_device": self.strategy is None,
                 "grouped_conv": "native" if self.model.native_groups else "split per group"}
        if self.strategy is None and self.config.mode != "collective":
            facts["mode_note"] = (f"one worker: the single-device path of every mode, no "
                                  f"{'parameter server' if 'ps' in self.config.mode else 'GPU split'}"
                                  f" started")
        if self.strategy is not None:
            facts.update(strategy=type(self.strategy).__name__,
                         bytes_per_pack=self.comm_options.bytes_per_pack,
                         profile_note="separated: forward from a forward-only run, backward "
                                      "= one forward+backward graph minus it, all-reduce and "
                                      "update their own functions, backward and update scaled "
                                      "to one fused local graph of the step's compute; "
                                      "overlapped: TF's fused step minus a forward-only run and "
                                      "the separated update time")
        return facts

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def comm_scheme(self):
        """The whole gradient in one all-reduce after backward: TF packs the list of gradients
        into one tensor (bytes_per_pack 0), which needs every gradient first, so nothing is sent
        during backward. CollectiveAllReduce runs a ring over gRPC between workers (NCCL among
        the GPUs when it can)."""
        if self.strategy is None or self.replicas == 1:
            return None
        return {"label": f"{type(self.strategy).__name__} all-reduce", "overlap": False,
                "granularity": "whole", "profile_granularity": "whole", "algorithm": "ring",
                "transport": "nccl" if self.gpus else "grpc"}

    def collective_call(self, nbytes):
        """The strategy's all-reduce (the profile's own compiled function) of one float32
        tensor; each new size traces the function once (in the calibration's warm-up)."""
        if self._allreduce is None or self.local_replicas > 1:
            raise NotImplementedError(f"tf:{self.config.mode} with {self.replicas} replica(s) in "
                                      f"{self.local_replicas} per process: calibrate 2+ workers "
                                      "of one replica each")
        tensor = tf.zeros([max(1, int(nbytes) // 4)], tf.float32)
        return lambda: self._allreduce([tensor])


TRAINER = TensorFlowTrainer
