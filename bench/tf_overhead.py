"""Benchmark: the TensorFlow adapter's step against the idiomatic TensorFlow way to train the
same network — a tf_keras model of Keras layers compiled with `model.compile` and stepped by
its own compiled train function (what `fit` runs per step) — and what profile mode costs.

    python -m bench.tf_overhead [--models alexnet,googlenet,resnet50] [--batch 0 (default per model)]

Runs in the TensorFlow environment (it re-executes itself there, with TF_USE_LEGACY_KERAS=1 so
`tf.keras` is tf_keras). Both train the same description with the same canonical weights,
batch, thread count, dropout and SGD momentum; they are timed in interleaved rounds so machine
noise hits both alike; the ratio is of medians. Target: adapter / keras <= 1.05.

The Keras model uses Keras layers: Conv2D (grouped convolutions split into one Conv2D per
group, as TF has no CPU gradient for grouped kernels), MaxPooling2D with 'same' or 'valid'
padding where that equals Caffe's ceil mode (else zero padding, exact for the non-negative
inputs every pool of these nets has), BatchNormalization(momentum=0.9, epsilon=1e-5), Dense,
Dropout, Concatenate, Add, a Lambda for LRN.
"""

from __future__ import annotations

import json
import os
import sys

from bench import interleaved_rounds, medians, reexec_in_framework_env
from core.cli import OneLineParser, comma_list_type
from models import model_facts



def keras_model(spec, weights, dropout: bool):
    """The description as a tf_keras functional model of Keras layers, canonical weights in."""
    import numpy as np
    import tensorflow as tf
    from tensorflow import keras

    from adapters.tensorflow.model import TFModel, window_padding
    from models import layers as L
    from models.spec import pool_output_size

    converter = TFModel(spec, "NHWC", dropout)  # only for the canonical -> TF conversions
    assignments = []  # (keras weight, value)

    in_shapes = {layer.name: shape for layer, shape in spec.leaf_inputs()}

    class Build(L.TreeBuilder):  # the shared walker over Keras layers
        def leaf(self, layer, x):
            return leaf(layer, x, in_shapes[layer.name])

        def concat(self, node, outputs):
            return keras.layers.Concatenate(axis=-1)(outputs)

        def add(self, node, body, shortcut):
            return keras.layers.Add()([body, shortcut])

    def leaf(layer, x, shape):
        if isinstance(layer, L.Conv2d):
            kernel = converter.to_tf(f"{layer.name}.weight", weights[f"{layer.name}.weight"])
            bias = weights.get(f"{layer.name}.bias")
            from models.spec import conv_output_size

            out = conv_output_size(shape[1], layer.kernel, layer.stride, layer.pad)
            padding = window_padding(shape[1], layer.kernel, layer.stride, layer.pad, out)
            if isinstance(padding, tuple):
                x = keras.layers.ZeroPadding2D(layer.pad)(x)
                padding = "VALID"
            groups = layer.groups
            inputs = (keras.layers.Lambda(lambda t: tf.split(t, groups, -1))(x)
                      if groups > 1 else [x])
            outs = []
            for g, part in enumerate(inputs):
                conv = keras.layers.Conv2D(layer.out_channels // groups, layer.kernel,
                                           layer.stride, padding.lower(), use_bias=layer.bias)
                outs.append(conv(part))
                size = layer.out_channels // groups
                values = [kernel[..., g * size:(g + 1) * size]]
                if layer.bias:
                    values.append(bias[g * size:(g + 1) * size])
                assignments.append((conv, values))
            return keras.layers.Concatenate(-1)(outs) if groups > 1 else outs[0]
        if isinstance(layer, L.Pool2d):
            if layer.global_pool:
                pool = (keras.layers.GlobalMaxPooling2D if layer.mode == "max"
                        else keras.layers.GlobalAveragePooling2D)
                return pool(keepdims=True)(x)
            out = pool_output_size(shape[1], layer.kernel, layer.stride, layer.pad)
            padding = window_padding(shape[1], layer.kernel, layer.stride, layer.pad, out)
            if isinstance(padding, tuple):
                x = keras.layers.ZeroPadding2D((padding, padding))(x)
                padding = "VALID"
            cls = keras.layers.MaxPooling2D if layer.mode == "max" else keras.layers.AveragePooling2D
            return cls(layer.kernel, layer.stride, padding.lower())(x)
        if isinstance(layer, L.LRN):
            radius, alpha, k, beta = layer.size // 2, layer.alpha / layer.size, layer.k, layer.beta
            return keras.layers.Lambda(lambda t: tf.nn.local_response_normalization(
                t, radius, k, alpha, beta))(x)
        if isinstance(layer, L.ReLU):
            return keras.layers.ReLU()(x)
        if isinstance(layer, L.Dropout):
            return keras.layers.Dropout(layer.p)(x) if dropout and layer.p > 0 else x
        if isinstance(layer, L.BatchNorm):
            bn = keras.layers.BatchNormalization(momentum=layer.momentum, epsilon=layer.eps)
            y = bn(x)
            assignments.append((bn, [weights[f"{layer.name}.{s}"] for s in
                                     ("weight", "bias", "running_mean", "running_var")]))
            return y
        if isinstance(layer, L.Flatten):
            return keras.layers.Flatten()(x)
        if isinstance(layer, L.Linear):
            dense = keras.layers.Dense(layer.out_features, use_bias=layer.bias)
            y = dense(x)
            values = [converter.to_tf(f"{layer.name}.weight", weights[f"{layer.name}.weight"])]
            if layer.bias:
                values.append(weights[f"{layer.name}.bias"])
            assignments.append((dense, values))
            return y
        raise TypeError(type(layer).__name__)

    c, h, w = spec.input_shape
    inputs = keras.Input((h, w, c), batch_size=None)
    model = keras.Model(inputs, L.walk(spec.root, inputs, Build()))
    for layer, values in assignments:
        layer.set_weights([np.asarray(v) for v in values])
    return model


def measure(model_name: str, batch: int, iterations: int, rounds: int, threads: int) -> dict:
    import tensorflow as tf
    from tensorflow import keras

    from adapters.base import DistInfo, RunConfig
    from adapters.data import synthetic_batch
    from adapters.tensorflow.strategy import SingleDeviceTrainer
    from models import canonical_weights, get_model

    spec = get_model(model_name)
    weights = canonical_weights(spec)
    config = RunConfig(run_id="bench", framework="tf", mode="collective", model=model_name,
                       batch_per_worker=batch, threads_per_worker=threads)
    trainer = SingleDeviceTrainer(spec, config, DistInfo())
    trainer.load_weights(weights)

    model = keras_model(spec, weights, dropout=True)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=config.lr, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    images, labels = synthetic_batch(0, 0, batch, spec.input_shape, spec.num_classes)
    data = tf.data.Dataset.from_tensors((images.transpose(0, 2, 3, 1), labels)).repeat()
    iterator = iter(data)
    train_function = model.make_train_function()  # what fit() runs per step, compiled

    def keras_step():
        train_function(iterator)

    def adapter_step():
        trainer.step()

    def profile_step():
        sum(trainer.profile_step(overlapped=False).values())

    timings = interleaved_rounds(
        {"keras": keras_step, "adapter": adapter_step, "profile": profile_step},
        iterations, rounds)
    result = {"model": model_name, "batch": batch, "threads": threads, **medians(timings)}
    result["adapter_over_keras"] = result["adapter_s"] / result["keras_s"]
    result["profile_over_throughput"] = result["profile_s"] / result["adapter_s"]
    result["adapter_images_per_s"] = batch / result["adapter_s"]
    return result


def main() -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=comma_list_type, default="alexnet,googlenet,resnet50")
    parser.add_argument("--batch", type=int, default=0, help="0: the default CPU batch per model")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: every core")
    args = parser.parse_args()
    reexec_in_framework_env("tf", "bench.tf_overhead", TF_USE_LEGACY_KERAS="1",
                            TF_CPP_MIN_LOG_LEVEL="2")
    import platform

    import tensorflow as tf

    threads = args.threads or os.cpu_count() or 1
    print(json.dumps({"python": platform.python_version(), "tensorflow": tf.__version__,
                      "keras": tf.keras.__name__, "cpu_count": os.cpu_count(),
                      "threads": threads}), flush=True)
    for model in args.models:
        batch = args.batch or model_facts(model).default_batch["cpu"]
        print(json.dumps(measure(model, batch, args.iterations, args.rounds, threads)),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
