"""The shared model description (models/) as TensorFlow ops over variables named by the
canonical names, and the momentum update every mode applies.

The model runs the description's tree through the shared walker (`models.layers.walk`), each
leaf compiled once into raw `tf.nn` ops, so weights and gradients convert to and from the
canonical layout by name: conv OIHW <-> HWIO, linear (out, in) <-> (in, out) with the rows of
the first Linear after a Flatten permuted when activations are NHWC (the canonical flatten order
is C, H, W).

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
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from models import layers as L
from models.spec import conv_output_size


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


class Forward(L.TreeBuilder):
    """One forward pass of a `TFModel`: its compiled leaves, branches concatenated along the
    layout's channel axis, shortcuts added; merges assert their shapes like the leaves."""

    def __init__(self, model: "TFModel", ctx: Ctx):
        self.model, self.ctx = model, ctx

    def leaf(self, layer, x):
        return self.model.leaves[layer.name](x, self.ctx)

    def concat(self, node, outputs):
        return self.model.check_shape(tf.concat(outputs, self.model.channel_axis), node)

    def add(self, node, body, shortcut):
        return self.model.check_shape(body + shortcut, node)


class TFModel:
    """The shared description's leaves compiled into closures over `tf.nn` ops, run by the
    shared tree walker.

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
        self.leaves = self._compile_leaves()
        self.shapes = spec.output_shapes()

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
        return L.walk(self.spec.root, images, Forward(self, ctx)), ctx.updates

    def loss(self, logits, labels):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    # -- compiling the description -----------------------------------------------------------
    def _expect(self, fn, node, out_shape):
        """Wrap `fn` so tracing asserts the output shape equals models' shape inference."""
        return lambda x, ctx: self.check_shape(fn(x, ctx), node, out_shape)

    def check_shape(self, y, node, out_shape=None):
        """`y`, after asserting its shape is the description's output of `node`."""
        c, *hw = out_shape or self.shapes[node.name]
        expected = ([*hw, c] if self.layout == "NHWC" else [c, *hw]) if hw else [c]
        got = y.shape.as_list()[1:]
        if got != expected:
            raise AssertionError(f"{node.name}: TF output shape {got} but the model "
                                 f"description gives {expected}")
        return y

    def _compile_leaves(self) -> dict:
        """Every leaf as a closure over `tf.nn` ops, in forward order (a Linear after a
        Flatten learns the flatten's shape from the one before it), each asserting its
        output shape."""
        leaves = {}
        for layer, shape in self.spec.leaf_inputs():
            out = self.spec.output_shape(layer, shape)
            leaves[layer.name] = self._expect(self._leaf(layer, shape, out), layer, out)
        return leaves

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


def momentum_update(var, slot, grad, lr, momentum):
    """PyTorch's SGD with momentum, in one fused kernel: slot = m * slot + g; var -= lr * slot."""
    return tf.raw_ops.ResourceApplyMomentum(var=var.handle, accum=slot.handle,
                                            lr=tf.cast(lr, var.dtype), grad=grad,
                                            momentum=tf.cast(momentum, var.dtype),
                                            use_locking=False, use_nesterov=False)
