"""A model = a layer tree + input shape + class count, with shape inference and per-layer costs.

Everything the rest of dlcompare needs to know about a network without running it comes from
here: shapes (to build it in any framework and to check the build), parameter shapes in the
canonical layout (to share initial weights), forward FLOPs (to report and model compute time)
and per-layer gradient bytes in backward order (for the communication model: layer l's gradient
can be sent as soon as its backward is done).

Canonical parameter layout, which every adapter converts from and to:
  - names: ``NAME.weight``, ``NAME.bias`` for the leaf layer NAME; BN buffers
    ``NAME.running_mean``, ``NAME.running_var``;
  - Conv2d weight (out, in/groups, kh, kw) (OIHW); Linear weight (out, in), where `in` indexes
    the (C, H, W) flatten of the previous output in C-major order; BN weight = gamma, bias = beta.

FLOP convention (forward, per sample; a multiply-add counts as 2 FLOPs, as in the papers' GFLOP
figures written as 2 x GMAC):
  - Conv2d: 2 * Cin/groups * k*k * Cout * Hout*Wout, plus Cout*Hout*Wout bias adds.
  - Linear: 2 * in * out, plus out bias adds.
  - Pool2d: kernel*kernel ops per output element (k*k - 1 compares or adds, plus the final
    divide for average; windows clipped by the border are still counted whole); a global pool
    counts H*W per output channel.
  - ReLU: 1 per element. Dropout: 1 per element (the mask multiply; drawing the mask is not
    counted). Flatten and Concat: 0 (they only move data).
  - LRN: size + 4 per element (square, size-1 window adds, scale by alpha/size, add k, power,
    divide).
  - BatchNorm: 4 per element (subtract mean, scale by 1/std, multiply gamma, add beta); the
    batch statistics computed in training (about 3 more per element) are not counted.
  - Residual: 1 per output element (the add).
  - The softmax cross-entropy loss after the last node is not counted.
Convolution and Linear dominate every reference net (> 99 % of FLOPs), so these elementwise
conventions move totals by well under 1 %.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Callable, Iterator, Optional

from .layers import (
    LEAF_TYPES,
    LRN,
    BatchNorm,
    Concat,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    Pool2d,
    ReLU,
    Residual,
    Sequential,
)

Shape = tuple  # tuple[int, ...]: (C, H, W) for images, (N,) once flat
BYTES_PER_PARAM = 4  # float32 gradients


@dataclass(frozen=True)
class LayerStats:
    """One row of `ModelSpec.layer_table()`: a layer's shapes and costs for one sample."""

    name: str
    kind: str
    input_shape: Shape
    output_shape: Shape
    params: int
    flops: int
    grad_bytes: int

    def as_dict(self) -> dict:
        row = asdict(self)
        row["input_shape"] = list(self.input_shape)
        row["output_shape"] = list(self.output_shape)
        return row


# --------------------------------------------------------------------------- shapes


def _need_image(layer, shape: Shape) -> None:
    if len(shape) != 3:
        raise ValueError(
            f"{layer.name}: {type(layer).__name__} needs a (C, H, W) input, got {shape}"
        )


def conv_output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """Floor rule shared by all frameworks for convolution."""
    return (size + 2 * pad - kernel) // stride + 1


def pool_output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """Caffe's ceil rule for pooling (PyTorch's ceil_mode=True is the same rule).

    Rounding up lets the last window hang over the edge; when padded, a window that would start
    at or beyond the end of the real input plus padding is dropped, so every window sees at
    least one padded-input position.
    """
    out = -(-(size + 2 * pad - kernel) // stride) + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _conv_shape(layer: Conv2d, shape: Shape) -> Shape:
    _need_image(layer, shape)
    c, h, w = shape
    if c % layer.groups:
        raise ValueError(f"{layer.name}: {c} input channels not divisible by groups {layer.groups}")
    if min(h, w) + 2 * layer.pad < layer.kernel:
        raise ValueError(
            f"{layer.name}: kernel {layer.kernel} exceeds input {h}x{w} with pad {layer.pad}"
        )
    ho = conv_output_size(h, layer.kernel, layer.stride, layer.pad)
    wo = conv_output_size(w, layer.kernel, layer.stride, layer.pad)
    return (layer.out_channels, ho, wo)


def _pool_shape(layer: Pool2d, shape: Shape) -> Shape:
    _need_image(layer, shape)
    c, h, w = shape
    if layer.global_pool:
        return (c, 1, 1)
    if min(h, w) + 2 * layer.pad < layer.kernel:
        raise ValueError(
            f"{layer.name}: kernel {layer.kernel} exceeds input {h}x{w} with pad {layer.pad}"
        )
    ho = pool_output_size(h, layer.kernel, layer.stride, layer.pad)
    wo = pool_output_size(w, layer.kernel, layer.stride, layer.pad)
    return (c, ho, wo)


def _linear_shape(layer: Linear, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise ValueError(
            f"{layer.name}: Linear needs a flat input, got {shape} (add a Flatten before it)"
        )
    return (layer.out_features,)


def _same_shape(layer, shape: Shape) -> Shape:
    return shape


def _lrn_shape(layer: LRN, shape: Shape) -> Shape:
    _need_image(layer, shape)
    return shape


def _flatten_shape(layer: Flatten, shape: Shape) -> Shape:
    return (math.prod(shape),)


_LEAF_SHAPE: dict = {
    Conv2d: _conv_shape,
    Pool2d: _pool_shape,
    Linear: _linear_shape,
    LRN: _lrn_shape,
    Flatten: _flatten_shape,
    ReLU: _same_shape,
    Dropout: _same_shape,
    BatchNorm: _same_shape,
}

Visit = Optional[Callable[[object, Shape, Shape], None]]


def _trace(node, shape: Shape, visit: Visit) -> Shape:
    """Infer `node`'s output shape; call visit(node, in, out) for every node in forward order.

    Containers are visited after their contents (a Concat or Residual after its last branch),
    which is where their merge happens in the forward pass.
    """
    if isinstance(node, LEAF_TYPES):
        out = _LEAF_SHAPE[type(node)](node, shape)
    elif isinstance(node, Sequential):
        out = shape
        for layer in node.layers:
            out = _trace(layer, out, visit)
    elif isinstance(node, Concat):
        out = _concat_shape(node, [_trace(b, shape, visit) for b in node.branches])
    elif isinstance(node, Residual):
        out = _residual_shape(node, shape, visit)
    else:
        raise ValueError(f"not a layer node: {node!r}")
    if min(out) < 1:
        raise ValueError(f"{node.name}: output shape {out} from input {shape} is empty")
    if visit is not None:
        visit(node, shape, out)
    return out


def _concat_shape(node: Concat, outs: list) -> Shape:
    if any(len(o) != 3 for o in outs) or len({o[1:] for o in outs}) != 1:
        raise ValueError(f"{node.name}: Concat branches disagree on spatial size: {outs}")
    return (sum(o[0] for o in outs), *outs[0][1:])


def _residual_shape(node: Residual, shape: Shape, visit: Visit) -> Shape:
    body = _trace(node.body, shape, visit)
    short = shape if node.shortcut is None else _trace(node.shortcut, shape, visit)
    if body != short:
        raise ValueError(f"{node.name}: Residual body gives {body} but shortcut gives {short}")
    return body


# --------------------------------------------------------------------------- parameters


def layer_parameter_shapes(layer, in_shape: Shape) -> dict:
    """Trainable parameters of a leaf in the canonical layout: {'weight': shape, 'bias': shape}."""
    if isinstance(layer, Conv2d):
        k = layer.kernel
        shapes = {"weight": (layer.out_channels, in_shape[0] // layer.groups, k, k)}
        if layer.bias:
            shapes["bias"] = (layer.out_channels,)
        return shapes
    if isinstance(layer, Linear):
        shapes = {"weight": (layer.out_features, in_shape[0])}
        if layer.bias:
            shapes["bias"] = (layer.out_features,)
        return shapes
    if isinstance(layer, BatchNorm):
        return {"weight": (in_shape[0],), "bias": (in_shape[0],)}
    return {}


def layer_buffer_shapes(layer, in_shape: Shape) -> dict:
    """Non-trainable state of a leaf: BatchNorm's running statistics."""
    if isinstance(layer, BatchNorm):
        return {"running_mean": (in_shape[0],), "running_var": (in_shape[0],)}
    return {}


# --------------------------------------------------------------------------- FLOPs


def node_flops(node, in_shape: Shape, out_shape: Shape) -> int:
    """Forward FLOPs per sample of one node, by the convention in this module's docstring."""
    out_n = math.prod(out_shape)
    if isinstance(node, Conv2d):
        per_out = 2 * (in_shape[0] // node.groups) * node.kernel * node.kernel
        return out_n * (per_out + (1 if node.bias else 0))
    if isinstance(node, Linear):
        return out_n * (2 * in_shape[0] + (1 if node.bias else 0))
    if isinstance(node, Pool2d):
        window = in_shape[1] * in_shape[2] if node.global_pool else node.kernel ** 2
        return out_n * window
    if isinstance(node, LRN):
        return out_n * (node.size + 4)
    if isinstance(node, BatchNorm):
        return out_n * 4
    if isinstance(node, (ReLU, Dropout, Residual)):
        return out_n
    return 0  # Flatten, Concat, Sequential


# --------------------------------------------------------------------------- the model


def _all_nodes(node) -> Iterator:
    """Every node, containers before their contents (for name checks)."""
    yield node
    children: tuple = ()
    if isinstance(node, Sequential):
        children = node.layers
    elif isinstance(node, Concat):
        children = node.branches
    elif isinstance(node, Residual):
        children = (node.body,) + (() if node.shortcut is None else (node.shortcut,))
    for child in children:
        yield from _all_nodes(child)


def _check_shape(shape, what: str) -> Shape:
    shape = tuple(shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ValueError(f"{what} must be positive ints, got {shape}")
    return shape


@dataclass(frozen=True)
class ModelSpec:
    """A network: its layer tree, input (C, H, W), class count and the source it reproduces.

    Construction validates the whole model (unique names, every shape possible, the last
    layer producing `num_classes` logits), so a ModelSpec that exists is buildable.
    """

    name: str
    input_shape: tuple
    num_classes: int
    root: Sequential
    reference: str = ""

    def __post_init__(self):
        shape = _check_shape(self.input_shape, f"{self.name}: input_shape")
        if len(shape) != 3:
            raise ValueError(f"{self.name}: input_shape must be (C, H, W), got {shape}")
        object.__setattr__(self, "input_shape", shape)
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) \
                or self.num_classes < 1:
            raise ValueError(f"{self.name}: num_classes must be a positive int")
        if not isinstance(self.root, Sequential):
            raise ValueError(f"{self.name}: root must be a Sequential")
        self._check_unique_names()
        out = self._records[-1][2]
        if out != (self.num_classes,):
            raise ValueError(
                f"{self.name}: the last layer gives {out}, expected ({self.num_classes},) logits"
            )

    def _check_unique_names(self) -> None:
        seen: set = set()
        for node in _all_nodes(self.root):
            if node.name in seen:
                raise ValueError(f"{self.name}: node name {node.name!r} is used twice")
            seen.add(node.name)

    @cached_property
    def _records(self) -> list:
        """(node, input shape, output shape) for every node in forward order."""
        records: list = []
        _trace(self.root, self.input_shape, lambda n, i, o: records.append((n, i, o)))
        return records

    # ---- structure and shapes

    def walk(self) -> list:
        """Leaf layers in forward order: depth-first, Concat branch by branch, Residual body
        then shortcut."""
        return [n for n, _, _ in self._records if isinstance(n, LEAF_TYPES)]

    def leaf_inputs(self) -> list:
        """(leaf layer, its input shape) in forward order: what a framework builder needs to
        create every layer without walking the tree itself."""
        return [(n, i) for n, i, _ in self._records if isinstance(n, LEAF_TYPES)]

    def output_shape(self, node, input_shape) -> Shape:
        """Output shape of any node (leaf or container) fed `input_shape`; ValueError if
        impossible."""
        return _trace(node, _check_shape(input_shape, "input_shape"), None)

    def output_shapes(self) -> dict:
        """{node name: output shape} for every node of this model, containers included
        (e.g. 'inception_3a' -> (256, 28, 28))."""
        return {n.name: out for n, _, out in self._records}

    def node(self, name: str):
        """The node called `name` (leaf or container)."""
        for node in _all_nodes(self.root):
            if node.name == name:
                return node
        raise KeyError(f"{self.name} has no node {name!r}")

    # ---- costs

    def layer_table(self) -> list:
        """LayerStats for every leaf in forward order, plus one row per merge node (Concat,
        Residual) where the merge happens, so Residual adds are costed and the total of the
        rows equals `total_flops`. Use `walk()` for leaves only."""
        rows = []
        for node, i, o in self._records:
            if isinstance(node, Sequential):
                continue
            params = sum(math.prod(s) for s in layer_parameter_shapes(node, i).values())
            rows.append(LayerStats(
                name=node.name, kind=type(node).__name__, input_shape=i, output_shape=o,
                params=params, flops=node_flops(node, i, o),
                grad_bytes=BYTES_PER_PARAM * params,
            ))
        return rows

    @property
    def total_params(self) -> int:
        """Trainable parameters (BN running statistics excluded, as in published counts)."""
        return sum(math.prod(s) for s in self.parameter_shapes().values())

    @property
    def total_flops(self) -> int:
        """Forward FLOPs per sample (see the module docstring for the convention)."""
        return sum(row.flops for row in self.layer_table())

    def _named_shapes(self, per_layer: Callable) -> dict:
        shapes = {}
        for node, i, _ in self._records:
            if isinstance(node, LEAF_TYPES):
                for suffix, shape in per_layer(node, i).items():
                    shapes[f"{node.name}.{suffix}"] = shape
        return shapes

    def parameter_shapes(self) -> dict:
        """{'NAME.weight' | 'NAME.bias': shape} of trainable parameters, in forward order."""
        return self._named_shapes(layer_parameter_shapes)

    def buffer_shapes(self) -> dict:
        """{'NAME.running_mean' | 'NAME.running_var': shape} of BN statistics, forward order."""
        return self._named_shapes(layer_buffer_shapes)

    def gradient_sizes_backward(self) -> list:
        """[(layer name, gradient bytes)] for layers with parameters, last layer first: the
        order in which backward produces gradients and wait-free backprop can send them."""
        return [(r.name, r.grad_bytes) for r in reversed(self.layer_table()) if r.params]
