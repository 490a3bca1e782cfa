"""`ps-async`: TF2 ParameterServerStrategy with a ClusterCoordinator, asynchronous by design
(registered as not synchronous, never mixed into synchronous comparisons). The coordinator
(dlcompare's one reporting worker process) schedules step functions on the TF workers, each
reading variables from the servers and applying its own update there without waiting for the
others. Its servers and TF workers are started by `serve` (adapters/tensorflow/ps.py)."""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from adapters.base import DistInfo, RunConfig
from adapters.tensorflow.base import (TensorFlowTrainer, choose_layout, configure_threads,
                                      tf_versions)
from adapters.tensorflow.inputs import jpeg_dataset, synthetic_pool
from adapters.tensorflow.model import TFModel, momentum_update
from adapters.tensorflow.ps import ParameterServerMode, tf_config


class AsyncPSTrainer(ParameterServerMode, TensorFlowTrainer):
    """TF2 ParameterServerStrategy + ClusterCoordinator (asynchronous; see the module doc).

    One `step()` schedules one step function per TF worker (the global batch), returning at
    once; `sync()` joins the coordinator. The weights each worker reads may be older than
    other workers' updates: that is the scheme.
    """

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        tf.config.set_visible_devices([], "GPU")
        configure_threads(config)
        self.layout = choose_layout(config, gpu=False)
        self.model = TFModel(spec, self.layout, config.dropout)
        cluster, _ = tf_config()
        self.workers, self.servers = len(cluster["worker"]), len(cluster["ps"])
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        with self.strategy.scope():
            self.params = {n: tf.Variable(tf.zeros(s), name=n.replace(".", "/"))
                           for n, s in self.model.param_shapes.items()}
            self.slots = {n: tf.Variable(tf.zeros(s), trainable=False,
                                         name=n.replace(".", "/") + "/momentum")
                          for n, s in self.model.param_shapes.items()}
            self.buffers = {n: tf.Variable(tf.zeros(s), trainable=False, name=n.replace(".", "/"))
                            for n, s in self.model.buffer_shapes.items()}
        self.names = list(self.params)
        self._build_functions()
        self._results = []

    def _dataset_fn(self, context):
        rank = context.input_pipeline_id if context else 0
        if self.config.data == "synthetic":
            pool = synthetic_pool(self.spec, self.config, self.model, rank, self.workers)
            return tf.data.Dataset.from_tensor_slices(
                (np.stack([i for i, _ in pool]), np.stack([y for _, y in pool]))).repeat()
        return jpeg_dataset(self.config, self.model, rank, self.workers)

    def _build_functions(self):
        model, names, lr, momentum = self.model, self.names, self.config.lr, self.config.momentum

        def grads_fn(images, labels):
            with tf.GradientTape() as tape:
                logits, _ = model(images, self.params, self.buffers, training=True)
                loss = model.loss(logits, labels)
            return loss, tape.gradient(loss, [self.params[n] for n in names])

        def replica_step(images, labels):
            loss, grads = grads_fn(images, labels)
            for name, grad in zip(names, grads):
                momentum_update(self.params[name], self.slots[name], grad, lr, momentum)
            return loss

        def replica_backward(images, labels):
            return grads_fn(images, labels)[0]

        def replica_forward(images, labels):
            logits, _ = model(images, self.params, self.buffers, training=True,
                              update_stats=False)
            return model.loss(logits, labels)

        def on_worker(fn):
            @tf.function
            def scheduled(iterator):
                images, labels = next(iterator)
                return self.strategy.run(fn, args=(images, labels))
            return scheduled

        self._step_fn = on_worker(replica_step)
        self._backward_fn = on_worker(replica_backward)
        self._forward_fn = on_worker(replica_forward)

        @tf.function
        def grads_given(images, labels):
            return self.strategy.run(grads_fn, args=(images, labels))

        self._grads_given = grads_given
        dataset = self.strategy.distribute_datasets_from_function(self._dataset_fn)
        self.iterator = iter(self.coordinator.create_per_worker_dataset(dataset))

    def gradients(self, images, labels):
        x = tf.constant(self.model.images_to_layout(images))
        result = self.coordinator.schedule(self._grads_given, args=(x, tf.constant(labels)))
        loss, grads = result.fetch()
        return float(loss), {n: self.model.to_canonical(n, np.asarray(g))
                             for n, g in zip(self.names, grads)}

    def step(self):
        self._results = [self.coordinator.schedule(self._step_fn, args=(self.iterator,))
                         for _ in range(self.workers)]

    def _timed(self, fn) -> float:
        start = time.perf_counter()
        self.coordinator.schedule(fn, args=(self.iterator,))
        self.coordinator.join()
        return time.perf_counter() - start

    def _profile(self, overlapped: bool):
        """One worker's step functions, each scheduled alone and joined (so each time holds a
        dispatch round trip): forward-only, forward+backward, full step (reads from and
        updates on the servers). Phases are differences: backward = fb - f, comm (+ the
        update, which runs on the servers) = full - fb; io and h2d happen inside the
        worker's function and are not separable here (0)."""
        self.coordinator.join()
        forward = self._timed(self._forward_fn)
        both = self._timed(self._backward_fn)
        full = self._timed(self._step_fn)
        laps = {"io": 0.0, "h2d": 0.0, "forward": forward}
        if overlapped:
            laps.update(backward_comm=max(0.0, full - forward), update=0.0)
        else:
            laps.update(backward=max(0.0, both - forward), comm=max(0.0, full - both),
                        update=0.0)
        return laps

    def last_loss(self):
        if not self._results:
            return float("nan")
        return float(self._results[-1].fetch())

    def sync(self):
        self.coordinator.join()

    def versions(self):
        return tf_versions()

    def describe(self):
        return {"layout": self.layout, "servers": self.servers, "tf_workers": self.workers,
                "single_device": False, "asynchronous": True,
                "strategy": "ParameterServerStrategy+ClusterCoordinator",
                "profile_note": "phases are differences of one worker's scheduled functions; "
                                "io/h2d not separable"}
