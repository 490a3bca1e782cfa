"""MXNet adapter: the shared description as a hybridized Gluon HybridBlock, trained by
`gluon.Trainer` over one of MXNet's kvstores (MXNet 1.9.1, the last release).

Modes are kvstore types, chosen on the CLI (`--frameworks mxnet:dist_sync`):

- `dist_sync`, `dist_device_sync`: ps-lite parameter servers, one process per worker. The
  launcher (launchers/rendezvous/dmlc.py) starts a scheduler, `config.servers` servers and the
  workers with the DMLC_* variables; never MXNet's bundled tools/launch.py. Each worker pushes
  its gradients after (and overlapped with) backward; the servers sum them over workers and,
  as MXNet does by default (`update_on_kvstore`), apply the SGD update themselves; the workers
  pull the new weights. So every worker holds the very same bits after a step. Setting
  MXNET_UPDATE_ON_KVSTORE=0 (MXNet's own switch) makes the servers only sum and the workers
  update; the record's `extra` says which ran. With one worker this is an honest 1-worker
  baseline: the same scheduler, server and push/pull, over one worker.
- `local`, `device`, `nccl`: MXNet's in-process data parallelism. ONE process drives
  `workers_per_node` devices (contexts); the kvstore reduces the contexts' gradients in that
  process (`local` on the CPU, `device` on the devices, `nccl` with NCCL, GPU builds only).
  On a CPU the devices are the contexts cpu(0) .. cpu(N-1), each with its own engine worker
  thread and OMP_NUM_THREADS threads. With one device Gluon uses no kvstore at all (its own
  fast path); `extra.kvstore` says "none" then.
- Unknown names are rejected here and in the registry: MXNet's `kv.create` silently returns a
  local store for any name it does not know (`horovod`, typos). `dist_async` is rejected on
  purpose: it is asynchronous (never mixed into synchronous comparisons) and, without an
  optimizer on the servers, its servers die and the workers hang.

SGD with momentum. MXNet's `sgd_mom_update` keeps state s = m*s - lr*rescale*g and does w += s;
torch keeps v = m*v + g and does w -= lr*v. With a constant learning rate s = -lr*v at every
step, so both follow the same trajectory; the first step is bit-identical (both states start
at zero) and later steps differ by rounding order only. The loss is per sample (summed by
backward) and `trainer.step(global batch)` sets rescale_grad = 1/global batch (the optimizer
the servers run is sent with it at the first step); the kvstore sums the workers' (contexts')
gradients, so the update uses the mean gradient over the global batch, which is what torch
DDP's mean of equal-batch means gives.

Input data. Synthetic batches (adapters/data.py) are turned into NDArrays on their devices
once, so the timed loop measures MXNet, as torch's zero-copy `from_numpy` does. The generated
JPEG files go through MXNet's own fast path: the project packs the very JPEG bytes (no
re-encoding) into an indexed RecordIO file once, next to the data set, and
`mx.io.ImageRecordIter` reads it: C++ threads decode (OpenCV), centre-crop and normalise in
the worker process, with a prefetch buffer, sharded across workers by num_parts/part_index.
Chosen over Gluon's ImageFolderDataset + DataLoader because that is MXNet's production path
(ImageNet training reads RecordIO made by im2rec, as the study's era did), it needs no
forked Python loader processes (fork and MXNet's engine threads do not mix well, and there is
nothing to leave behind when a run is killed), and it shards natively for distributed runs.
`loader_workers` sets its decode threads.

Where MXNet departs from the description's (Caffe's) semantics, and what is done:
  - Pooling: Caffe's ceil rule is Gluon's ceil_mode=True (pooling_convention='full'); every
    leaf's output shape equals the description's (tests/test_mxnet.py).
  - LRN: MXNet's operator has Caffe's alpha/size convention, but its MKL-DNN backward is wrong
    (see `LRN`), so on MKL-DNN the layer is composed of plain operators.
  - BatchNorm: momentum has the canonical meaning; MXNet's running variance uses the biased
    batch variance and is updated in backward, so `UnbiasedRunningVar` applies Caffe's
    (torch's, TF's) Bessel correction after backward.

Threads: the launcher sets OMP_NUM_THREADS to the run's threads per worker; MXNet's engine
keeps one worker thread per CPU context (MXNET_CPU_WORKER_NTHREADS). MKL-DNN (oneDNN) stays
on (MXNET_MKLDNN_ENABLED, MXNet's default and its CPU fast path); the record says so.

ps-lite roles: for DMLC_ROLE server or scheduler, `import mxnet` itself runs the role's whole
loop and exits the process. This module imports MXNet with the role masked so its classes can
be defined, and `serve()` then runs the role explicitly.
"""

from __future__ import annotations

import fcntl
import gc
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from adapters.base import DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig, Trainer
from adapters.data import Cycle, SyntheticBatches, list_jpeg_dataset
from models import layers as L


def _import_mxnet():
    """Import MXNet as a plain library whatever DMLC_ROLE says (see the module docstring)."""
    role = os.environ.get("DMLC_ROLE")
    if role in ("server", "scheduler"):
        os.environ["DMLC_ROLE"] = "worker"
    try:
        import mxnet  # the one import of MXNet, under the role it must see (above)
    finally:
        if role is not None:
            os.environ["DMLC_ROLE"] = role
    return mxnet


mx = _import_mxnet()
from mxnet import autograd, gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402

SERVER_MODES = ("dist_sync", "dist_device_sync")
IN_PROCESS_MODES = ("local", "device", "nccl")
KVSTORE_MODES = SERVER_MODES + IN_PROCESS_MODES
REJECTED_MODES = {
    "dist_async": "asynchronous (not comparable with synchronous SGD), and MXNet's servers die "
                  "without a server-side optimizer",
    "dist_device_async": "asynchronous (not comparable with synchronous SGD)",
    "horovod": "MXNet 1.9.1 has no horovod kvstore (kv.create silently returns a local store); "
               "Horovod is its own adapter",
}


def check_mode(mode: str) -> None:
    """Reject kvstore names MXNet would silently turn into a local store."""
    if mode in KVSTORE_MODES:
        return
    why = REJECTED_MODES.get(mode)
    known = ", ".join(KVSTORE_MODES)
    raise ValueError(f"mxnet kvstore {mode!r} is not supported: {why}" if why else
                     f"unknown mxnet kvstore {mode!r} (known: {known}); MXNet itself would "
                     "silently run a local store under that name")


def mxnet_features() -> list[str]:
    features = mx.runtime.Features()
    return sorted(name for name in features.keys() if features.is_enabled(name))


def mkldnn_active() -> bool:
    """MXNet's CPU operators run through MKL-DNN (oneDNN): built in and not switched off."""
    return "MKLDNN" in mxnet_features() and os.environ.get("MXNET_MKLDNN_ENABLED", "1") != "0"


# ----------------------------------------------------------------------------- model builder

class LRN(gluon.HybridBlock):
    """Caffe's ACROSS_CHANNELS LRN: y = x / (k + alpha/size * sum of x^2 over `size`
    channels centred on x's) ** beta. MXNet's LRN operator divides alpha by nsize as Caffe does
    (checked against torch's to 1e-7 with alpha up to 1).

    `composite` works around a bug in MXNet 1.9.1's MKL-DNN LRN: its backward is wrong when
    the incoming gradient is in a blocked MKL-DNN layout (nChw8c, which the next convolution's
    backward produces when the channels are a multiple of 8), and in hybridized graphs even
    when the gradient is reordered to NCHW first. With AlexNet's alpha = 1e-4 the input
    gradient is off by ~3e-4 relative (GoogleNet-tiny's conv1 gradient by 2e-3), with alpha = 1
    by ~70 %. So on MKL-DNN the layer is written with plain operators (square, a sum pool over
    the channel window, power, multiply): the same formula, and autograd's exact gradient.
    Without MKL-DNN (GPU, MXNET_MKLDNN_ENABLED=0) MXNet's own LRN operator runs.
    """

    def __init__(self, layer: L.LRN, shape, composite: bool, **kwargs):
        super().__init__(**kwargs)
        self.layer = layer
        self.shape = tuple(shape)
        self.composite = composite

    def hybrid_forward(self, F, x):
        layer = self.layer
        if not self.composite:
            return F.LRN(x, alpha=layer.alpha, beta=layer.beta, knorm=layer.k, nsize=layer.size)
        channels, height, width = self.shape
        squares = F.reshape(F.square(x), shape=(0, 1, channels, height * width))
        window = F.Pooling(squares, kernel=(layer.size, 1), stride=(1, 1),
                           pad=(layer.size // 2, 0), pool_type="sum")
        window = F.reshape(window, shape=(0, channels, height, width))
        return x * ((window * (layer.alpha / layer.size) + layer.k) ** (-layer.beta))


class Network(gluon.HybridBlock):
    """The shared description executed by Gluon.

    Every leaf is a child block named after the description's layer (parameter names
    `conv1_weight`, ...); `params_by_name` maps canonical names (`conv1.weight`, BN
    `bn_conv1.running_var`) to Gluon parameters, so weights cross without a lookup table.
    `hybrid_forward` walks the description's tree (Sequential / Concat / Residual) over the
    leaves, so one hybridized graph covers the whole network.
    """

    def __init__(self, spec, dropout: bool, mkldnn: bool = True):
        super().__init__(prefix="", params=None)
        self.spec = spec
        self.mkldnn = mkldnn  # CPU operators through MKL-DNN: avoid its LRN (see LRN)
        self.leaves: dict[str, gluon.HybridBlock] = {}
        self.params_by_name: dict[str, gluon.Parameter] = {}
        with self.name_scope():
            for node, shape in spec.leaf_inputs():
                self._add_leaf(node, shape, dropout)

    def _add_leaf(self, node, shape, dropout):
        """Create and register one leaf block (layers with no block of their own, such as
        Flatten handled in the forward walk, give None)."""
        leaf = make_leaf(node, shape, dropout, self.mkldnn)
        if leaf is not None:
            self.register_child(leaf, node.name)
            self.leaves[node.name] = leaf
            self.params_by_name.update(canonical_parameters(node, leaf))

    def hybrid_forward(self, F, x):
        return self._run(F, self.spec.root, x)

    def _run(self, F, node, x):
        if isinstance(node, L.Sequential):
            for child in node.layers:
                x = self._run(F, child, x)
            return x
        if isinstance(node, L.Concat):
            return F.concat(*[self._run(F, branch, x) for branch in node.branches], dim=1)
        if isinstance(node, L.Residual):
            shortcut = x if node.shortcut is None else self._run(F, node.shortcut, x)
            return F.elemwise_add(self._run(F, node.body, x), shortcut)
        leaf = self.leaves.get(node.name)
        return x if leaf is None else leaf(x)  # no leaf: dropout switched off


def make_leaf(layer, in_shape, dropout: bool, mkldnn: bool = True):
    prefix = f"{layer.name}_"
    channels = in_shape[0]
    if isinstance(layer, L.Conv2d):
        # Gluon's Conv2D weight is (out, in/groups, kh, kw): the canonical OIHW layout.
        return nn.Conv2D(layer.out_channels, layer.kernel, strides=layer.stride,
                         padding=layer.pad, groups=layer.groups, use_bias=layer.bias,
                         in_channels=channels, prefix=prefix)
    if isinstance(layer, L.Pool2d):
        return make_pool(layer, prefix)
    if isinstance(layer, L.LRN):
        return LRN(layer, in_shape, composite=mkldnn, prefix=prefix)
    if isinstance(layer, L.ReLU):
        return nn.Activation("relu", prefix=prefix)
    if isinstance(layer, L.Dropout):
        return nn.Dropout(layer.p, prefix=prefix) if dropout and layer.p > 0 else None
    if isinstance(layer, L.BatchNorm):
        # MXNet's momentum is the canonical one: running = m * running + (1 - m) * batch.
        return nn.BatchNorm(axis=1, momentum=layer.momentum, epsilon=layer.eps,
                            in_channels=channels, prefix=prefix)
    if isinstance(layer, L.Linear):
        # Dense weight is (out, in); `in` is the NCHW flatten made by the Flatten node.
        return nn.Dense(layer.out_features, use_bias=layer.bias, flatten=True,
                        in_units=int(np.prod(in_shape)), prefix=prefix)
    if isinstance(layer, L.Flatten):
        return nn.Flatten(prefix=prefix)
    raise TypeError(f"no MXNet builder for {type(layer).__name__}")


def make_pool(layer, prefix: str):
    if layer.global_pool:
        cls = nn.GlobalMaxPool2D if layer.mode == "max" else nn.GlobalAvgPool2D
        return cls(prefix=prefix)
    # ceil_mode=True is pooling_convention='full': Caffe's ceil rule for the output size.
    if layer.mode == "max":
        return nn.MaxPool2D(layer.kernel, layer.stride, layer.pad, ceil_mode=True,
                            prefix=prefix)
    return nn.AvgPool2D(layer.kernel, layer.stride, layer.pad, ceil_mode=True,
                        count_include_pad=True, prefix=prefix)


def canonical_parameters(layer, leaf) -> dict:
    """{canonical name: Gluon Parameter} of one leaf."""
    name = layer.name
    if isinstance(layer, (L.Conv2d, L.Linear)):
        found = {f"{name}.weight": leaf.weight}
        if layer.bias:
            found[f"{name}.bias"] = leaf.bias
        return found
    if isinstance(layer, L.BatchNorm):
        return {f"{name}.weight": leaf.gamma, f"{name}.bias": leaf.beta,
                f"{name}.running_mean": leaf.running_mean,
                f"{name}.running_var": leaf.running_var}
    return {}


class UnbiasedRunningVar:
    """Bessel-correct the running variance MXNet's BatchNorm keeps, as Caffe, torch and TF do.

    MXNet updates running_var = m * running_var + (1 - m) * var with the biased batch variance
    (divided by n = batch * H * W); the canonical convention (Caffe's) and the other adapters
    use the unbiased one (divided by n - 1). Only the running statistics differ (training
    normalises with the batch's own statistics either way); the one-step check compares them.
    The correction needs no new statistics: from MXNet's new value r1 and the old r0,
    (1 - m) * var = r1 - m * r0, so the Caffe value is r1 + (r1 - m * r0) / (n - 1), that is
    (1 + c) * r1 - m * c * r0 with c = 1 / (n - 1). MXNet's BatchNorm updates its running
    statistics in backward (not in forward as torch does), so r0 is copied before forward and
    r1 corrected after backward.

    Both are done for all BN layers at once by MXNet's fused multi-tensor SGD operator
    (weight = (1 - lr * wd) * weight - lr * grad), a handful of operator calls per step instead
    of three per layer (ResNet-50 has 53): the copy is lr = wd = -1 (0 * r0' + r0, exact), the
    correction is weight r1, grad r0, lr = m * c, wd = -1 / m. It writes the statistics in
    place, which also orders it after BatchNorm's backward: that backward writes them through
    an input it declares read-only, so the engine would run a plain later *read* of them
    concurrently with it (and read the old value), while an in-place write waits for it.
    `options["mxnet_bn_running_var"] = "biased"` keeps MXNet's own update instead.
    """

    CHUNK = 32  # multi_sgd_update handles at most 60 tensors per call (61 crashes 1.9.1)

    def __init__(self, spec, network, contexts):
        items = []  # (running_var parameter, momentum, H * W)
        for row in spec.layer_table():
            if row.kind == "BatchNorm":
                layer = spec.node(row.name)
                if 0.0 < layer.momentum < 1.0:
                    items.append((network.params_by_name[f"{row.name}.running_var"],
                                  layer.momentum, row.input_shape[1] * row.input_shape[2]))
        self.items = items
        # Argument lists built once: the statistics' NDArrays stay the same objects (set_data
        # copies into them), and Python-side argument handling is most of these calls' cost.
        self.calls: dict = {}  # ctx -> [(running, saved, momenta, spatials)] per chunk
        for ctx in contexts:
            chunks = []
            for start in range(0, len(items), self.CHUNK):
                part = items[start:start + self.CHUNK]
                chunks.append(([param.data(ctx) for param, _, _ in part],
                               [mx.nd.zeros(param.shape, ctx=ctx) for param, _, _ in part],
                               [momentum for _, momentum, _ in part],
                               [spatial for _, _, spatial in part]))
            self.calls[ctx] = chunks
        self.corrections: dict = {}  # (ctx, batch) -> prepared correct() calls

    def save(self, contexts) -> None:
        """Before forward: r0, copied into finite buffers (0 * buffer + r0)."""
        for ctx in contexts:
            for running, saved, _, _ in self.calls[ctx]:
                data = [a for pair in zip(saved, running) for a in pair]
                mx.nd.multi_sgd_update(*data, lrs=(-1.0,) * len(saved), wds=(-1.0,) * len(saved),
                                       num_weights=len(saved), out=saved)

    def correct(self, contexts, batch: int) -> None:
        """After backward: r1 <- (1 + c) * r1 - m * c * r0 (a layer whose n = batch * H * W
        is 1 has no unbiased variance: it keeps MXNet's value)."""
        for ctx in contexts:
            key = (ctx, batch)
            if key not in self.corrections:
                prepared = []
                for running, saved, momenta, spatials in self.calls[ctx]:
                    keep = [i for i, spatial in enumerate(spatials) if batch * spatial > 1]
                    if keep:
                        c = [1.0 / (batch * spatials[i] - 1) for i in keep]
                        prepared.append((
                            [a for i in keep for a in (running[i], saved[i])],
                            [running[i] for i in keep],
                            tuple(momenta[i] * ci for i, ci in zip(keep, c)),
                            tuple(-1.0 / momenta[i] for i in keep)))
                self.corrections[key] = prepared
            for data, out, lrs, wds in self.corrections[key]:
                mx.nd.multi_sgd_update(*data, lrs=lrs, wds=wds, num_weights=len(out), out=out)


# ----------------------------------------------------------------------------- input pipelines

class SyntheticNDArrays(Cycle):
    """SyntheticBatches turned into NDArrays once, cycled forever; each batch is a list with
    one slice per context.

    With several contexts (in-process modes) the process draws the global batch and context i
    takes rows i*b .. (i+1)*b - 1: the same samples rank i of a multi-process run gets. The
    slices live in host memory as the PyTorch adapter's do: on their CPU context itself, or
    pinned for a GPU (the h2d phase copies them there).
    """

    def __init__(self, spec, batch_per_context: int, contexts, rank: int, world_size: int,
                 seed: int):
        count = len(contexts)
        source = SyntheticBatches(spec, batch_per_context * count, rank, world_size, seed)
        hosts = [c if c.device_type == "cpu" else mx.cpu_pinned(0) for c in contexts]
        batches = []
        for images, labels in source.batches:
            rows = [slice(i * batch_per_context, (i + 1) * batch_per_context)
                    for i in range(count)]
            batches.append((
                [mx.nd.array(images[r], ctx=h) for r, h in zip(rows, hosts)],
                [mx.nd.array(labels[r], ctx=h, dtype="float32") for r, h in zip(rows, hosts)]))
        super().__init__(batches)


def recordio_paths(data_dir: str) -> tuple[Path, Path]:
    """Where the packed RecordIO of a generated JPEG data set lives: beside its folder."""
    root = Path(data_dir).resolve()
    folder = root.with_name(root.name + ".mxnet-recordio")
    return folder / "data.rec", folder / "data.idx"


def pack_recordio(data_dir: str) -> tuple[Path, Path]:
    """Pack the data set's JPEG files, bytes unchanged, into an indexed RecordIO (once).

    Written into a temporary folder and renamed under a file lock, so concurrent workers pack
    it once and an interrupted packing never leaves a half file that looks done.
    """
    rec, idx = recordio_paths(data_dir)
    folder = rec.parent
    if (folder / "complete").exists():
        return rec, idx
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "complete").exists():
            return rec, idx
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        items = list_jpeg_dataset(data_dir)
        writer = mx.recordio.MXIndexedRecordIO(str(partial / idx.name),
                                               str(partial / rec.name), "w")
        for index, (path, label) in enumerate(items):
            header = mx.recordio.IRHeader(0, float(label), index, 0)
            writer.write_idx(index, mx.recordio.pack(header, Path(path).read_bytes()))
        writer.close()
        (partial / "complete").write_text(f"{len(items)} images from {data_dir}\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return rec, idx


class RecordBatches:
    """ImageRecordIter over the packed files, forever; each batch split over the contexts.

    Yields CPU NDArrays (the h2d phase moves them to their contexts). The iterator decodes,
    centre-crops to the model's input and normalises (x - 128) / 64 as adapters/data.py does.
    """

    def __init__(self, spec, config: RunConfig, dist: DistInfo, contexts):
        rec, idx = pack_recordio(config.data_dir)
        images = len(list_jpeg_dataset(config.data_dir))
        if images < config.global_batch:
            raise ValueError(f"data set of {images} images is smaller than the global "
                             f"batch {config.global_batch}")
        self.contexts = contexts
        self.iterator = mx.io.ImageRecordIter(
            path_imgrec=str(rec), path_imgidx=str(idx), data_shape=spec.input_shape,
            batch_size=config.batch_per_worker * len(contexts), shuffle=True,
            seed=config.seed, num_parts=dist.world_size, part_index=dist.rank,
            preprocess_threads=max(1, config.loader_workers), prefetch_buffer=4,
            rand_crop=False, rand_mirror=False, round_batch=True, label_width=1,
            mean_r=128.0, mean_g=128.0, mean_b=128.0, std_r=64.0, std_g=64.0, std_b=64.0,
            dtype="float32", ctx="cpu", verbose=False)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            batch = self.iterator.next()
        except StopIteration:
            self.iterator.reset()
            batch = self.iterator.next()
        return batch.data[0], batch.label[0]


# ----------------------------------------------------------------------------- trainer

class MXNetTrainer(Trainer):
    """gluon.Trainer over an in-process kvstore (`local`, `device`, `nccl`): one process drives
    `workers_per_node` contexts and the kvstore reduces their gradients in this process.  The
    ps-lite modes are `PSLiteTrainer`, below."""

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


class PSLiteTrainer(MXNetTrainer):
    """`dist_sync`, `dist_device_sync`: one worker per process over ps-lite parameter servers
    (scheduler and servers started by the launcher, played by `serve`)."""

    distributed = True
    # Keys in flight per calibration sample (`collective_times`): as many as a backward
    # pushes (googlenet 116 tensors, resnet50 161): the servers pipeline what is in flight,
    # 0.77 ms per small key with 20 in flight against 0.49 ms per key in googlenet-tiny's
    # iterations.
    MAX_CALIBRATION_ITERS = 128
    PROBE_KEYS = 2_000_000  # the contention probe's keys, one per gradient, far from the others

    def _create_kvstore(self):
        """Dist stores are created here, which joins ps-lite (blocks until every scheduler,
        server and worker has registered), so a broken rendezvous fails at start-up."""
        if "DIST_KVSTORE" not in mxnet_features():
            raise FrameworkUnavailable("this MXNet build has no distributed kvstore (ps-lite)")
        if "DMLC_PS_ROOT_URI" not in os.environ:
            raise ValueError(f"mxnet:{self.config.mode} needs the ps-lite rendezvous (DMLC_* "
                             "variables from launchers/rendezvous/dmlc.py)")
        kv = mx.kv.create(self.config.mode)
        if kv.num_workers != self.dist.world_size:
            raise RuntimeError(f"ps-lite has {kv.num_workers} workers, the run {self.dist.world_size}")
        return kv

    # -- performance model --------------------------------------------------------------------
    def comm_scheme(self):
        """Dist modes: each gradient tensor pushed to the servers as soon as backward made it
        (MXNet's engine runs the pushes by priority, overlapping the rest of backward), summed
        there (and the update applied there with update_on_kvstore), then pulled. Tensors over
        MXNET_KVSTORE_BIGARRAY_BOUND elements (default 1e6) are split over all servers, smaller
        ones go whole to one server, so `servers` slices are exact only for the big tensors.
        (In-process modes reduce in this process's memory, which the model has no term for:
        their `comm_scheme` is None.)"""
        return super().comm_scheme()

    def collective_times(self, sizes, repeats, warmup=2, iters=1):
        """Push and pull through the dist kvstore (the servers sum every worker's push) of
        `iters` float32 keys per size, all issued back to back and then waited for; each sample
        starts after a kvstore barrier and is the time per key. Each key goes by one
        `kv.pushpull` with a falling priority, gluon.Trainer's call: a `push` then a `pull`
        per key cost 0.5-0.6 ms per small key in flight against 0.42 ms with `pushpull`, and
        an iteration's exchange measured 0.38-0.45 ms per key.

        One key per message, as backward sends them: the engine keeps the keys in flight at
        once, as it does a backward's gradients. Pushing and pulling one key `iters` times
        instead serialises every round trip (the pull waits for the push, the next push for the
        pull): 0.94 ms per small key on loopback against 0.22 ms in flight together.

        The kvstore is set up as training sets it first, so with the update on the servers
        (MXNet's default) every calibration key also goes through the servers' Python updater
        as a gradient does: about 0.3 ms per key, which a calibration without it missed (the
        model under-predicted googlenet-tiny's exchange 27 ms against 59 ms measured). Keys
        are initialised once (a dist kvstore cannot initialise a key twice), far from
        gluon.Trainer's keys."""
        self._update_on_kvstore()  # the optimizer on the servers, as in an iteration
        if not hasattr(self, "_calibration_keys"):
            self._calibration_keys = {}
        count = max(1, int(iters))
        times = {}
        for nbytes in sizes:
            nbytes = int(nbytes)
            keys = self._calibration_keys.setdefault(nbytes, [])
            while len(keys) < count:
                key = 1_000_000 + sum(len(k) for k in self._calibration_keys.values())
                buffer = mx.nd.zeros(max(1, nbytes // 4), ctx=self.contexts[0])
                self.kv.init(key, buffer)
                keys.append((key, buffer))
            in_flight = keys[:count]

            def push_pull_all(in_flight=in_flight):
                for position, (key, buffer) in enumerate(in_flight):
                    self.kv.pushpull(key, buffer, out=buffer, priority=-position)
                for _, buffer in in_flight:
                    buffer.wait_to_read()

            times[nbytes] = [t / count for t in self.time_collective(push_pull_all, repeats, warmup, 1)]
        return times

    def contention_probe(self, rounds):
        """The contention calibration (adapters/calibration.py): backward timed alone and with
        every gradient pushed (to a probe key of its shape) and pulled back the way
        gluon.Trainer does, the engine starting each push once backward has written that
        gradient; alternating, `rounds` of each after one of each untimed. Backward ends when
        every gradient is written, which a one-element copy of each gradient, queued behind
        backward before the push, marks: waiting on the gradient itself would wait for the
        exchange too, since on a CPU context the kvstore pulls into the pushed array (its
        `comm_buf_` is the gradient), which had each round's backward end with its exchange
        and fitted contention to 1 (the most) in every campaign where backward itself had
        slowed far less. The ready times are the marks' in backward order; the exchange
        ends when the pulls are back. (Pushing a 64 KiB buffer made to depend on each
        gradient instead slowed backward 13% where the gradients themselves slow it 2-3x: the
        servers' updater and ps-lite copy what is pushed.)"""
        self._update_on_kvstore()  # the servers' updater on, as in an iteration
        grads = [p.list_grad()[0] for p in self.network.collect_params().values()
                 if p.grad_req != "null"][::-1]  # backward order: the last layer first
        buffers = []
        for index in range(len(grads)):
            buffer = mx.nd.zeros(grads[index].shape, ctx=self.contexts[0])
            self.kv.init(self.PROBE_KEYS + index, buffer)
            buffers.append(buffer)
        sources = [mx.nd.zeros(grad.shape, ctx=self.contexts[0]) for grad in grads]
        rounds_ = self.probe_rounds(lambda send: self._probe_backward(grads, buffers if send else None),
                                    rounds, replay=lambda ready: self._probe_replay(sources, buffers, ready))
        ready = rounds_.pop("ready")
        return {"bytes": [int(g.size) * 4 for g in grads], **rounds_, "ready_s": ready}

    def _probe_backward(self, grads, buffers):
        data, labels = self._to_devices(next(self.batches))
        losses = self._forward(data, labels)
        mx.nd.waitall()
        start = time.perf_counter()
        self._backward(losses)
        # read by the engine once backward wrote the gradient, before the pull writes it
        marks = [grad.reshape((-1,))[:1].copy() for grad in grads]
        if buffers is not None:
            last = len(grads) - 1
            for index, (grad, buffer) in enumerate(zip(grads, buffers)):
                # gluon.Trainer's call: priority -i for parameter i (grads are in backward order)
                self.kv.pushpull(self.PROBE_KEYS + index, grad, out=buffer, priority=index - last)
        ready = []
        for mark in marks:
            mark.wait_to_read()
            ready.append(time.perf_counter() - start)
        seconds = time.perf_counter() - start
        mx.nd.waitall()
        return seconds, ready, time.perf_counter() - start

    def _probe_replay(self, sources, buffers, ready) -> float:
        """The probe's exchange without backward: each key pushed and pulled as in
        `_probe_backward`, at its ready time from the round's alone half (sleeping until
        then), all waited for; seconds from the start until the last pull was back."""
        last = len(sources) - 1
        return self.replay_at(ready, lambda i: self.kv.pushpull(self.PROBE_KEYS + i, sources[i], out=buffers[i],
                                                                priority=i - last), mx.nd.waitall)

    # -- ps-lite roles ------------------------------------------------------------------------
    @classmethod
    def serve(cls, config: RunConfig, role: str, index: int) -> int:
        """Run ps-lite's scheduler or a server until the workers stop it (or the launcher
        kills it); the servers sum gradients and, with update_on_kvstore, run the optimizer
        the workers send them."""
        check_mode(config.mode)
        if role not in ("scheduler", "server"):
            raise ValueError(f"mxnet:{config.mode} has no {role!r} role")
        if os.environ.get("DMLC_ROLE") != role:
            raise ValueError(f"DMLC_ROLE is {os.environ.get('DMLC_ROLE')!r}, expected {role!r}")
        server = mx.kv.KVStoreServer(mx.kv.create("dist"))
        server.run()  # returns when the workers have finished (ps-lite's final barrier)
        return 0


TRAINERS = {"dist_sync": PSLiteTrainer, "dist_device_sync": PSLiteTrainer,
            "local": MXNetTrainer, "device": MXNetTrainer, "nccl": MXNetTrainer}
