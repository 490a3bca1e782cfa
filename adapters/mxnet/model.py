"""The shared description as Gluon blocks: one child block per leaf, named canonically, and
one hybridized graph walking the description's tree.

Where MXNet departs from the description's (Caffe's) semantics, and what is done:
  - Pooling: Caffe's ceil rule is Gluon's ceil_mode=True (pooling_convention='full'); every
    leaf's output shape equals the description's (tests/test_mxnet.py).
  - LRN: MXNet's operator has Caffe's alpha/size convention, but its MKL-DNN backward is wrong
    (see `LRN`), so on MKL-DNN the layer is composed of plain operators.
  - BatchNorm: momentum has the canonical meaning; MXNet's running variance uses the biased
    batch variance and is updated in backward, so `UnbiasedRunningVar` applies Caffe's
    (torch's, TF's) Bessel correction after backward.
"""

from __future__ import annotations

import numpy as np

from adapters.mxnet.base import gluon, mx, nn
from models import layers as L


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
    `hybrid_forward` runs the description's tree over the leaves through the shared walker, so
    one hybridized graph covers the whole network.
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
        return L.walk(self.spec.root, x, GluonForward(F, self.leaves))


class GluonForward(L.TreeBuilder):
    """One trace of `Network`: `F` is mx.nd or mx.sym, as Gluon passes it."""

    def __init__(self, F, leaves):
        self.F, self.leaves = F, leaves

    def leaf(self, layer, x):
        block = self.leaves.get(layer.name)
        return x if block is None else block(x)  # no block: dropout switched off

    def concat(self, node, outputs):
        return self.F.concat(*outputs, dim=1)

    def add(self, node, body, shortcut):
        return self.F.elemwise_add(body, shortcut)


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
