"""Deterministic initial weights in the canonical layout, so every framework starts equal.

Each tensor is drawn from its own generator seeded by (seed, crc32(name)): the numbers for
``conv1.weight`` do not depend on which other tensors exist or on the order they are drawn in,
so a framework that creates parameters in a different order, or a tiny variant sharing layer
names, still gets reproducible values. crc32 is used because Python's ``hash`` of a str is
salted per process.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from .layers import Conv2d, Linear
from .spec import ModelSpec


def stable_hash(name: str) -> int:
    """A process-independent 32-bit hash of a tensor name."""
    return zlib.crc32(name.encode("utf-8"))


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, stable_hash(name)])


def _he_normal(shape: tuple, fan_in: int, rng: np.random.Generator) -> np.ndarray:
    """He/Kaiming normal, std = sqrt(2 / fan_in): keeps activations' scale through ReLUs."""
    std = np.float32(math.sqrt(2.0 / fan_in))
    return rng.standard_normal(shape, dtype=np.float32) * std


def _initial(layer, suffix: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    if suffix == "weight" and isinstance(layer, (Conv2d, Linear)):
        return _he_normal(shape, math.prod(shape[1:]), rng)  # fan_in = in/groups * k * k
    if suffix in ("weight", "running_var"):  # BN gamma and variance start at 1
        return np.ones(shape, dtype=np.float32)
    return np.zeros(shape, dtype=np.float32)  # biases, BN beta and running mean


def canonical_weights(spec: ModelSpec, seed: int = 0) -> dict:
    """{name: float32 C-contiguous array} for every parameter and BN buffer of `spec`.

    Parameters come first in forward order, then buffers. Conv and Linear weights are He
    normal, biases 0, BN gamma 1 and beta 0, running mean 0 and running variance 1.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    layers = {layer.name: layer for layer in spec.walk()}
    shapes = {**spec.parameter_shapes(), **spec.buffer_shapes()}
    weights = {}
    for full_name, shape in shapes.items():
        layer_name, suffix = full_name.rsplit(".", 1)
        array = _initial(layers[layer_name], suffix, shape, _rng(int(seed), full_name))
        weights[full_name] = np.ascontiguousarray(array, dtype=np.float32)
    return weights


def check_weights(spec: ModelSpec, weights: dict) -> None:
    """Raise ValueError unless `weights` has exactly `spec`'s tensors with the right shapes."""
    expected = {**spec.parameter_shapes(), **spec.buffer_shapes()}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ValueError(f"{spec.name}: weights missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in expected.items():
        if tuple(weights[name].shape) != tuple(shape):
            raise ValueError(f"{name}: shape {weights[name].shape}, expected {shape}")


def save_npz(path, weights: dict) -> None:
    """Write weights to an uncompressed .npz (compression buys little on random floats)."""
    np.savez(path, **weights)


def load_npz(path) -> dict:
    """Read weights written by `save_npz`, preserving the stored order."""
    with np.load(path, allow_pickle=False) as data:
        return {name: np.ascontiguousarray(data[name]) for name in data.files}
