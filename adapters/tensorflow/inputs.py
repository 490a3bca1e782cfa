"""Input pipelines of the TensorFlow modes: the generated JPEG files through tf.data, and the
synthetic batches every framework sees, in the model's layout."""

from __future__ import annotations

import tensorflow as tf

from adapters.base import RunConfig
from adapters.data import SyntheticBatches, list_jpeg_dataset
from adapters.tensorflow.model import TFModel


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
