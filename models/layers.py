"""The framework-neutral layer vocabulary every network is written in.

Each node is a frozen dataclass so a model description is an immutable value: adapters can hash
it, compare it and never mutate it behind each other's back. The vocabulary is exactly what the
three Caffe reference nets need (AlexNet, GoogleNet, ResNet-50) and nothing more, so that every
framework adapter can translate every node.

Names are Caffe's layer names with '/' and '-' replaced by '_' (e.g. ``inception_3a_1x1``,
``res2a_branch2a``): they become parameter names (``NAME.weight``) in every framework, and some
frameworks reject '/' or '-' in variable names.

Semantics follow Caffe because the study (Shi, Wang, Chu, DataCom 2018) ran Caffe's model
definitions; see each class for the points where frameworks differ.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Union

_NAME = re.compile(r"[A-Za-z0-9_]+")


def _check_name(node) -> None:
    if not isinstance(node.name, str) or not _NAME.fullmatch(node.name):
        raise ValueError(
            f"{type(node).__name__} name {node.name!r} must match [A-Za-z0-9_]+ "
            "(Caffe's '/' and '-' become '_')"
        )


def _check_int(node, field: str, minimum: int) -> None:
    value = getattr(node, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{node.name}: {field} must be an int >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Conv2d:
    """2-D convolution with a square kernel; weight layout OIHW = (out, in/groups, k, k).

    `groups` > 1 reproduces AlexNet's two-GPU split (Caffe's `group: 2`): input and output
    channels are split into `groups` independent halves. Output size uses floor, as every
    framework does for convolution.
    """

    name: str
    out_channels: int
    kernel: int
    stride: int = 1
    pad: int = 0
    groups: int = 1
    bias: bool = True

    def __post_init__(self):
        _check_name(self)
        _check_int(self, "out_channels", 1)
        _check_int(self, "kernel", 1)
        _check_int(self, "stride", 1)
        _check_int(self, "pad", 0)
        _check_int(self, "groups", 1)
        if self.out_channels % self.groups:
            raise ValueError(
                f"{self.name}: out_channels {self.out_channels} not divisible by "
                f"groups {self.groups}"
            )


@dataclass(frozen=True)
class Pool2d:
    """Max or average pooling with Caffe's ceil-mode output size.

    Caffe rounds the output size up: ceil((H + 2*pad - kernel)/stride) + 1, then drops the last
    window if it would start inside the bottom/right padding (only possible when pad > 0). That
    is why GoogleNet's pool1 maps 112 -> 56 and ResNet-50's pool1 maps 112 -> 56 without padding;
    floor mode would give 55. PyTorch's `ceil_mode=True` implements the same rule; TensorFlow
    and MXNet need explicit padding or `pooling_convention='full'`.

    `global_pool=True` pools the whole spatial extent to 1x1 (Caffe's `global_pooling`), so the
    final 7x7 pools of GoogleNet and ResNet-50 also work on the small inputs of tiny variants.
    Average pooling divides by the window clipped to the padded input (Caffe; PyTorch's
    `count_include_pad=True` does the same); the reference nets only average without padding.
    """

    name: str
    mode: str
    kernel: int = 0
    stride: int = 1
    pad: int = 0
    global_pool: bool = False

    def __post_init__(self):
        _check_name(self)
        if self.mode not in ("max", "avg"):
            raise ValueError(f"{self.name}: pool mode must be 'max' or 'avg', got {self.mode!r}")
        _check_int(self, "stride", 1)
        _check_int(self, "pad", 0)
        if self.global_pool:
            if self.pad:
                raise ValueError(f"{self.name}: a global pool takes no padding")
            return
        _check_int(self, "kernel", 1)
        if self.pad > self.kernel // 2:
            # Caffe needs pad < kernel; PyTorch needs pad <= kernel/2: keep the stricter one.
            raise ValueError(f"{self.name}: pad {self.pad} exceeds half the kernel {self.kernel}")


@dataclass(frozen=True)
class LRN:
    """Local response normalisation across channels, Caffe's ACROSS_CHANNELS convention.

    y = x / (k + alpha/size * sum_{size channels centred on c} x^2) ** beta. Note alpha is
    divided by `size` (Caffe, PyTorch); TensorFlow's `local_response_normalization` takes the
    undivided alpha and a half-width radius, so its adapter passes alpha/size and size//2.
    """

    name: str
    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0

    def __post_init__(self):
        _check_name(self)
        _check_int(self, "size", 1)
        if self.size % 2 == 0:
            raise ValueError(
                f"{self.name}: LRN size must be odd (a centred window), got {self.size}"
            )


@dataclass(frozen=True)
class ReLU:
    """Rectified linear unit, elementwise."""

    name: str

    def __post_init__(self):
        _check_name(self)


@dataclass(frozen=True)
class Dropout:
    """Inverted dropout with drop probability `p` (kept values scaled by 1/(1-p) in training)."""

    name: str
    p: float

    def __post_init__(self):
        _check_name(self)
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"{self.name}: dropout p must be in [0, 1), got {self.p!r}")


@dataclass(frozen=True)
class Flatten:
    """(C, H, W) -> (C*H*W,) in C-major (NCHW) order.

    Caffe's InnerProduct flattens implicitly; making it a node fixes the order once, so a
    channels-last framework knows it must transpose to NCHW before flattening (or permute the
    following Linear weight) to share canonical weights.
    """

    name: str

    def __post_init__(self):
        _check_name(self)


@dataclass(frozen=True)
class BatchNorm:
    """Batch normalisation over channels with learnable scale and shift.

    Caffe splits this into BatchNorm (statistics) + Scale (gamma, beta); merged here into one
    node with parameters NAME.weight (gamma), NAME.bias (beta) and buffers NAME.running_mean,
    NAME.running_var. `momentum` follows the Caffe/TensorFlow/MXNet convention
    running = momentum * running + (1 - momentum) * batch; PyTorch's `momentum` is 1 - this.
    """

    name: str
    eps: float = 1e-5
    momentum: float = 0.9

    def __post_init__(self):
        _check_name(self)
        if not self.eps > 0:
            raise ValueError(f"{self.name}: eps must be > 0, got {self.eps!r}")
        if not 0.0 <= self.momentum <= 1.0:
            raise ValueError(f"{self.name}: momentum must be in [0, 1], got {self.momentum!r}")


@dataclass(frozen=True)
class Linear:
    """Fully connected layer on a flat input; weight layout (out, in)."""

    name: str
    out_features: int
    bias: bool = True

    def __post_init__(self):
        _check_name(self)
        _check_int(self, "out_features", 1)


Leaf = Union[Conv2d, Pool2d, LRN, ReLU, Dropout, Flatten, BatchNorm, Linear]
LEAF_TYPES = (Conv2d, Pool2d, LRN, ReLU, Dropout, Flatten, BatchNorm, Linear)


def _as_tuple(node, field: str, allowed: tuple, what: str) -> None:
    items = getattr(node, field)
    if not isinstance(items, (tuple, list)):
        raise ValueError(f"{node.name}: {field} must be a tuple of {what}")
    items = tuple(items)
    for item in items:
        if not isinstance(item, allowed):
            raise ValueError(f"{node.name}: {field} holds {type(item).__name__}, expected {what}")
    object.__setattr__(node, field, items)  # lists become tuples so nodes stay hashable


@dataclass(frozen=True)
class Sequential:
    """Nodes applied one after another."""

    name: str
    layers: tuple

    def __post_init__(self):
        _check_name(self)
        _as_tuple(self, "layers", NODE_TYPES, "layer nodes")


@dataclass(frozen=True)
class Concat:
    """Branches applied to the same input, outputs concatenated along channels (Inception)."""

    name: str
    branches: tuple

    def __post_init__(self):
        _check_name(self)
        _as_tuple(self, "branches", (Sequential,), "Sequential branches")
        if not self.branches:
            raise ValueError(f"{self.name}: Concat needs at least one branch")


@dataclass(frozen=True)
class Residual:
    """output = body(x) + shortcut(x); identity shortcut when `shortcut` is None.

    The ReLU after the addition is a separate ReLU node following this one (Caffe's
    Eltwise + ReLU), so the add itself has no activation.
    """

    name: str
    body: Sequential
    shortcut: Optional[Sequential] = None

    def __post_init__(self):
        _check_name(self)
        if not isinstance(self.body, Sequential):
            raise ValueError(f"{self.name}: Residual body must be a Sequential")
        if self.shortcut is not None and not isinstance(self.shortcut, Sequential):
            raise ValueError(f"{self.name}: Residual shortcut must be a Sequential or None")


Node = Union[Leaf, Sequential, Concat, Residual]
NODE_TYPES = LEAF_TYPES + (Sequential, Concat, Residual)


class TreeBuilder:
    """What a framework gives `walk` to execute (or build) a network from its description:
    how to apply one leaf layer, join branches and add a shortcut.  The walk itself — in order
    through a Sequential, every branch of a Concat on the same input, a Residual's body plus its
    shortcut (identity when there is none) — is the same for every framework, so it lives here.
    `x` is whatever flows through the framework's graph: a tensor, a symbol, or a (function,
    shape) pair for a builder that compiles the network ahead of running it."""

    def leaf(self, layer, x):
        raise NotImplementedError

    def concat(self, node: Concat, outputs: list):
        raise NotImplementedError

    def add(self, node: Residual, body, shortcut):
        raise NotImplementedError


def walk(node, x, builder: TreeBuilder):
    """`node` applied to `x` through `builder` (see `TreeBuilder`)."""
    if isinstance(node, Sequential):
        for child in node.layers:
            x = walk(child, x, builder)
        return x
    if isinstance(node, Concat):
        return builder.concat(node, [walk(branch, x, builder) for branch in node.branches])
    if isinstance(node, Residual):
        shortcut = x if node.shortcut is None else walk(node.shortcut, x, builder)
        return builder.add(node, walk(node.body, x, builder), shortcut)
    return builder.leaf(node, x)
