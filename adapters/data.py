"""Framework-neutral input data: a learnable synthetic task and a generated JPEG data set.

Every framework must see the same numbers for the equivalence checks, and a rank's slice of a
global batch must equal the same rows of a one-process run's batch. So each synthetic sample
is a pure function of (seed, global sample index): rank r of W at step s with per-worker batch
b gets samples s*W*b + r*b ... + b-1, whatever the framework.

The task is learnable (each class has its own smooth template, samples are template plus
noise) so "a few steps reduce the loss" is a meaningful test, unlike random labels.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

NOISE = 0.5
JPEG_QUALITY = 90
DATASET_MARKER = "dataset.json"


def class_templates(num_classes: int, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """One smooth pattern per class (coarse random grid, nearest-upsampled), float32."""
    channels, height, width = shape
    rng = np.random.default_rng([seed, 7919])
    grid = 4
    coarse = rng.standard_normal((num_classes, channels, grid, grid)).astype(np.float32)
    rows = (np.arange(height) * grid) // height
    cols = (np.arange(width) * grid) // width
    return coarse[:, :, rows][:, :, :, cols]


def sample_label(seed: int, index: int, num_classes: int) -> int:
    return zlib.crc32(f"{seed}:{index}".encode()) % num_classes


def synthetic_batch(
    seed: int, first_index: int, batch: int, shape: tuple[int, int, int], num_classes: int,
    templates: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Samples first_index .. first_index+batch-1 as (NCHW float32 images, int64 labels)."""
    if templates is None:
        templates = class_templates(num_classes, shape, seed)
    images = np.empty((batch, *shape), dtype=np.float32)
    labels = np.empty(batch, dtype=np.int64)
    for row in range(batch):
        index = first_index + row
        label = sample_label(seed, index, num_classes)
        noise = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32)
        images[row] = templates[label] + NOISE * noise
        labels[row] = label
    return images, labels


def rank_batch_start(step: int, rank: int, world_size: int, batch_per_worker: int) -> int:
    """Global index of the first sample rank `rank` sees at `step` (see module docstring)."""
    return (step * world_size + rank) * batch_per_worker


class Cycle:
    """Endless iteration over a fixed list of batches (in whatever form a framework keeps them:
    NumPy, device tensors, NDArrays), so a synthetic input costs nothing per step."""

    def __init__(self, batches: list):
        self.batches, self.position = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch


class SyntheticBatches(Cycle):
    """A small pool of pre-generated batches for one rank, cycled forever.

    Generated once so the timed loop measures the framework, not NumPy; the pool has several
    batches so consecutive steps see different data, as a real input pipeline would give.
    """

    def __init__(self, spec, batch_per_worker: int, rank: int, world_size: int, seed: int,
                 pool: int = 4):
        templates = class_templates(spec.num_classes, spec.input_shape, seed)
        super().__init__([
            synthetic_batch(
                seed, rank_batch_start(step, rank, world_size, batch_per_worker),
                batch_per_worker, spec.input_shape, spec.num_classes, templates,
            )
            for step in range(pool)
        ])


# ----------------------------------------------------------------------------- JPEG files

def jpeg_dataset_dir(cache_root: Path, spec, images_per_class: int, seed: int) -> Path:
    channels, height, width = spec.input_shape
    return Path(cache_root) / f"jpeg-{spec.num_classes}c-{images_per_class}x-{height}x{width}-s{seed}"


def make_jpeg_dataset(root: Path, spec, images_per_class: int = 16, seed: int = 0) -> Path:
    """Write a class-folder JPEG data set (root/class_000/img_00000.jpg ...) if not there.

    Images are the synthetic task rendered to 8-bit RGB and stored slightly larger than the
    model's input so the loaders do real decode + crop work. Written into a temporary folder
    and renamed, so an interrupted generation never leaves a half data set behind.
    """
    root = Path(root)
    if (root / DATASET_MARKER).exists():
        return root
    channels, height, width = spec.input_shape
    stored = (channels, height + height // 8, width + width // 8)
    templates = class_templates(spec.num_classes, stored, seed)
    partial = root.with_name(root.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    index = 0
    for label in range(spec.num_classes):
        folder = partial / f"class_{label:03d}"
        folder.mkdir(exist_ok=True)
        for item in range(images_per_class):
            noise = np.random.default_rng([seed, index]).standard_normal(stored, dtype=np.float32)
            image = templates[label] + NOISE * noise
            pixels = np.clip(image * 64 + 128, 0, 255).astype(np.uint8).transpose(1, 2, 0)
            Image.fromarray(pixels[:, :, :3] if channels >= 3 else pixels[:, :, 0]).save(
                folder / f"img_{index:05d}.jpg", quality=JPEG_QUALITY)
            index += 1
    meta = {"num_classes": spec.num_classes, "images_per_class": images_per_class,
            "stored_shape": stored, "seed": seed}
    (partial / DATASET_MARKER).write_text(json.dumps(meta))
    partial.rename(root)
    return root


def list_jpeg_dataset(root: Path) -> list[tuple[str, int]]:
    """(path, label) pairs sorted by path; label = index of the class folder."""
    root = Path(root)
    if not (root / DATASET_MARKER).exists():
        raise FileNotFoundError(f"no generated JPEG data set in {root}")
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    return [(str(path), label) for label, folder in enumerate(classes)
            for path in sorted(folder.glob("*.jpg"))]


def decode_jpeg(path: str, height: int, width: int) -> np.ndarray:
    """Decode, centre-crop to (height, width) and normalise to a CHW float32 array."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    top = (pixels.shape[0] - height) // 2
    left = (pixels.shape[1] - width) // 2
    crop = pixels[top:top + height, left:left + width]
    return ((crop - 128.0) / 64.0).transpose(2, 0, 1).copy()
