"""The three networks of the study, as the Caffe definitions it ran, plus tiny variants.

Full models reproduce the Caffe prototxts layer by layer (names, kernels, strides, pads,
groups, LRNs, ceil-mode pools) because the study measured those exact networks; their parameter
counts are pinned by tests against the published figures.

Tiny variants keep the same layer sequence, kinds, kernels, strides, pads and groups, and only
divide channel widths by 8, shrink the fully connected layers, use 10 classes and a small input
chosen so that every pool stays valid under Caffe's rule. They exist so adapters' conformance
tests exercise the real topology (groups, LRN, inception concat, projection shortcuts) in
milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from .layers import LRN, BatchNorm, Concat, Conv2d, Dropout, Flatten, Linear, Pool2d, ReLU, \
    Residual, Sequential
from .spec import ModelSpec

TINY_WIDTH_DIVISOR = 8
TINY_CLASSES = 10

ALEXNET_REFERENCE = (
    "Caffe bvlc_alexnet (Krizhevsky et al. 2012; LRN before pooling, unlike CaffeNet): "
    "BVLC/caffe models/bvlc_alexnet/train_val.prototxt"
)
GOOGLENET_REFERENCE = (
    "Caffe bvlc_googlenet (Szegedy et al. 2015, Inception v1), auxiliary heads omitted: "
    "BVLC/caffe models/bvlc_googlenet/train_val.prototxt"
)
RESNET50_REFERENCE = (
    "He et al. 2015, ResNet-50 as in KaimingHe/deep-residual-networks "
    "prototxt/ResNet-50-deploy.prototxt (stride 2 in the first 1x1 of stages 3-5)"
)


# --------------------------------------------------------------------------- AlexNet


def alexnet(tiny: bool = False) -> ModelSpec:
    """bvlc_alexnet: 5 convs (conv2, conv4, conv5 in two groups), 2 LRNs, 3 FCs; 227x227 input.

    Tiny: widths / 8 (still even, so groups=2 holds), FC 256, input 3x96x96 so pool5 is 2x2
    (a non-trivial flatten order for the cross-framework checks).
    """
    d = TINY_WIDTH_DIVISOR if tiny else 1
    fc = 256 if tiny else 4096
    classes = TINY_CLASSES if tiny else 1000
    layers = (
        Conv2d("conv1", 96 // d, 11, stride=4), ReLU("relu1"), LRN("norm1", 5, 1e-4, 0.75),
        Pool2d("pool1", "max", 3, stride=2),
        Conv2d("conv2", 256 // d, 5, pad=2, groups=2), ReLU("relu2"),
        LRN("norm2", 5, 1e-4, 0.75), Pool2d("pool2", "max", 3, stride=2),
        Conv2d("conv3", 384 // d, 3, pad=1), ReLU("relu3"),
        Conv2d("conv4", 384 // d, 3, pad=1, groups=2), ReLU("relu4"),
        Conv2d("conv5", 256 // d, 3, pad=1, groups=2), ReLU("relu5"),
        Pool2d("pool5", "max", 3, stride=2),
        Flatten("flatten"),
        Linear("fc6", fc), ReLU("relu6"), Dropout("drop6", 0.5),
        Linear("fc7", fc), ReLU("relu7"), Dropout("drop7", 0.5),
        Linear("fc8", classes),
    )
    return ModelSpec(
        name="alexnet-tiny" if tiny else "alexnet",
        input_shape=(3, 96, 96) if tiny else (3, 227, 227),
        num_classes=classes,
        root=Sequential("alexnet", layers),
        reference=ALEXNET_REFERENCE,
    )


# --------------------------------------------------------------------------- GoogleNet

# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) per module, from bvlc_googlenet.
INCEPTION_CHANNELS = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _conv_relu(prefix: str, suffix: str, out: int, kernel: int, **kw) -> tuple:
    """Caffe GoogleNet naming: conv `prefix_suffix`, its ReLU `prefix_relu_suffix`."""
    return (Conv2d(f"{prefix}_{suffix}", out, kernel, **kw), ReLU(f"{prefix}_relu_{suffix}"))


def inception(module: str, channels: tuple) -> Concat:
    """One Inception v1 module; the Concat takes Caffe's 'inception_XX/output' name."""
    n1, n3r, n3, n5r, n5, npool = channels
    p = f"inception_{module}"
    branches = (
        _conv_relu(p, "1x1", n1, 1),
        _conv_relu(p, "3x3_reduce", n3r, 1) + _conv_relu(p, "3x3", n3, 3, pad=1),
        _conv_relu(p, "5x5_reduce", n5r, 1) + _conv_relu(p, "5x5", n5, 5, pad=2),
        (Pool2d(f"{p}_pool", "max", 3, stride=1, pad=1),) + _conv_relu(p, "pool_proj", npool, 1),
    )
    return Concat(f"{p}_output", tuple(
        Sequential(f"{p}_branch{i}", layers) for i, layers in enumerate(branches, 1)
    ))


def googlenet(tiny: bool = False, aux: bool = False) -> ModelSpec:
    """bvlc_googlenet: stem with two LRNs, inception 3a-5b, global average pool, dropout 0.4.

    Auxiliary heads (loss1/loss2, tapped after inception_4a and 4d) are NOT represented:
    the layer vocabulary describes one path ending in one implicit loss, while each aux head
    is a second output with its own weighted (0.3) loss; representing it would need a
    multi-output node that every adapter supports. They only matter for training quality, not
    for the per-iteration cost the study compares beyond their extra 6,379,728 parameters
    (loss1: 3,188,840; loss2: 3,190,888), so `aux=True` raises NotImplementedError.

    Tiny: widths / 8, input 3x64x64 (pools 32 -> 16 -> 8 -> 4 -> 2, then global).
    """
    if aux:
        raise NotImplementedError(
            "googlenet auxiliary heads are not represented: they are extra outputs with their "
            "own losses, and the layer vocabulary has a single output path"
        )
    d = TINY_WIDTH_DIVISOR if tiny else 1
    classes = TINY_CLASSES if tiny else 1000
    inc = {m: inception(m, tuple(c // d for c in ch)) for m, ch in INCEPTION_CHANNELS.items()}
    layers = (
        *_conv_relu("conv1", "7x7_s2", 64 // d, 7, stride=2, pad=3),
        Pool2d("pool1_3x3_s2", "max", 3, stride=2), LRN("pool1_norm1", 5, 1e-4, 0.75),
        *_conv_relu("conv2", "3x3_reduce", 64 // d, 1),
        *_conv_relu("conv2", "3x3", 192 // d, 3, pad=1),
        LRN("conv2_norm2", 5, 1e-4, 0.75), Pool2d("pool2_3x3_s2", "max", 3, stride=2),
        inc["3a"], inc["3b"], Pool2d("pool3_3x3_s2", "max", 3, stride=2),
        inc["4a"], inc["4b"], inc["4c"], inc["4d"], inc["4e"],
        Pool2d("pool4_3x3_s2", "max", 3, stride=2),
        inc["5a"], inc["5b"],
        Pool2d("pool5_7x7_s1", "avg", global_pool=True), Dropout("pool5_drop_7x7_s1", 0.4),
        Flatten("flatten"), Linear("loss3_classifier", classes),
    )
    return ModelSpec(
        name="googlenet-tiny" if tiny else "googlenet",
        input_shape=(3, 64, 64) if tiny else (3, 224, 224),
        num_classes=classes,
        root=Sequential("googlenet", layers),
        reference=GOOGLENET_REFERENCE,
    )


# --------------------------------------------------------------------------- ResNet-50

# (stage, blocks, bottleneck width, output width, stride of the stage's first block)
RESNET50_STAGES = ((2, 3, 64, 256, 1), (3, 4, 128, 512, 2), (4, 6, 256, 1024, 2),
                   (5, 3, 512, 2048, 2))


def _conv_bn(conv: str, bn: str, out: int, kernel: int, **kw) -> tuple:
    """Bias-free conv then BN (Caffe's BatchNorm + Scale), as in every ResNet conv."""
    return (Conv2d(conv, out, kernel, bias=False, **kw), BatchNorm(bn))


def bottleneck(block: str, mid: int, out: int, stride: int, project: bool) -> tuple:
    """Bottleneck `res{block}`: 1x1 (carrying the stride, as in Caffe's original) -> 3x3 ->
    1x1, plus a conv+BN projection shortcut when the shape changes; then the ReLU after
    the add."""
    r, b = f"res{block}", f"bn{block}"
    body = Sequential(f"{r}_branch2", (
        *_conv_bn(f"{r}_branch2a", f"{b}_branch2a", mid, 1, stride=stride),
        ReLU(f"{r}_branch2a_relu"),
        *_conv_bn(f"{r}_branch2b", f"{b}_branch2b", mid, 3, pad=1),
        ReLU(f"{r}_branch2b_relu"),
        *_conv_bn(f"{r}_branch2c", f"{b}_branch2c", out, 1),
    ))
    shortcut = None
    if project:
        shortcut = Sequential(f"{r}_shortcut",
                              _conv_bn(f"{r}_branch1", f"{b}_branch1", out, 1, stride=stride))
    return (Residual(r, body, shortcut), ReLU(f"{r}_relu"))


def resnet50(tiny: bool = False) -> ModelSpec:
    """ResNet-50 (He et al. 2015, Caffe): conv1 7x7/2 + BN, ceil-mode max pool 112 -> 56,
    bottleneck stages (3, 4, 6, 3), global average pool, fc1000.

    Tiny: widths / 8, input 3x64x64 (spatial 32 -> 16 -> 8 -> 4 -> 2, then global).
    """
    d = TINY_WIDTH_DIVISOR if tiny else 1
    classes = TINY_CLASSES if tiny else 1000
    layers = [*_conv_bn("conv1", "bn_conv1", 64 // d, 7, stride=2, pad=3), ReLU("conv1_relu"),
              Pool2d("pool1", "max", 3, stride=2)]
    for stage, blocks, mid, out, stride in RESNET50_STAGES:
        for i in range(blocks):
            layers += bottleneck(f"{stage}{'abcdef'[i]}", mid // d, out // d,
                                 stride if i == 0 else 1, project=(i == 0))
    layers += [Pool2d("pool5", "avg", global_pool=True), Flatten("flatten"),
               Linear("fc1000", classes)]
    return ModelSpec(
        name="resnet50-tiny" if tiny else "resnet50",
        input_shape=(3, 64, 64) if tiny else (3, 224, 224),
        num_classes=classes,
        root=Sequential("resnet50", tuple(layers)),
        reference=RESNET50_REFERENCE,
    )


# --------------------------------------------------------------------------- catalogue

@dataclass(frozen=True)
class ModelFacts:
    """What dlcompare knows of a network besides its layers.

    - ``default_batch``: the per-worker batch when a campaign gives none, per device: on a
      GPU the study's per-GPU batch, on a CPU one that keeps a full-model iteration near a
      second on a small machine;
    - ``tolerance``: the relative gradient error two correct float32 frameworks may show
      (``analysis.equivalence``: measured at batch 2, seed 0, torch against tf, about 4-10x the
      worst tensor and above PyTorch's own float32-vs-float64 error; kinks of ReLU and
      max-pool and batch norm over 2 samples make it model-dependent);
    - ``step_s_per_sample``: seconds per training step per sample, one worker with one thread
      (PyTorch on a 2-core CPU VM, 2026-12, median of 5-20 steps after 2 of warm-up), and
      ``startup_s``: what making its canonical weights and graph adds to a run's start-up;
      both feed the dry run's estimate.
    """

    build: Callable[[], ModelSpec]
    default_batch: dict
    tolerance: float
    step_s_per_sample: float | None = None
    startup_s: float = 0.0


TINY_BATCH = {"gpu": 16, "cpu": 16}

MODELS: dict[str, ModelFacts] = {
    "alexnet": ModelFacts(lambda: alexnet(), {"gpu": 1024, "cpu": 16}, 5e-2, 0.104, 6.0),
    "googlenet": ModelFacts(lambda: googlenet(), {"gpu": 128, "cpu": 8}, 3e-3, 0.252, 6.0),
    "resnet50": ModelFacts(lambda: resnet50(), {"gpu": 32, "cpu": 4}, 1e-1, 0.444, 5.0),
    "alexnet-tiny": ModelFacts(lambda: alexnet(tiny=True), TINY_BATCH, 1e-4, 0.00176),
    "googlenet-tiny": ModelFacts(lambda: googlenet(tiny=True), TINY_BATCH, 1e-4, 0.0042),
    "resnet50-tiny": ModelFacts(lambda: resnet50(tiny=True), TINY_BATCH, 5e-3, 0.0045),
}
MODEL_NAMES = tuple(MODELS)


class UnknownModel(ValueError):
    """A model name the zoo does not know."""


def model_facts(name: str) -> ModelFacts:
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise UnknownModel(f"unknown model {name!r} (known: {', '.join(MODEL_NAMES)})") from None


@lru_cache(maxsize=None)
def get_model(name: str) -> ModelSpec:
    """The ModelSpec called `name` (specs are immutable, so one instance is shared)."""
    return model_facts(name).build()
