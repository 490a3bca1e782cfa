"""The TF2 modes: one device, `collective` (MultiWorkerMirroredStrategy) and `mirrored`
(MirroredStrategy over one process's GPUs), all one compiled custom training loop
(`StrategyTrainer`) under the strategy each mode's class makes."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import tensorflow as tf

from adapters.base import (DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig, fused_step_laps,
                           scale_to_fused)
from adapters.data import Cycle
from adapters.tensorflow.base import (TensorFlowTrainer, choose_layout, configure_threads,
                                      local_gpus, tf_versions)
from adapters.tensorflow.inputs import jpeg_dataset, synthetic_pool
from adapters.tensorflow.model import TFModel, momentum_update


class StrategyTrainer(TensorFlowTrainer):
    """TF2 custom training loop under a `tf.distribute` strategy chosen by the mode's subclass
    (`_make_strategy`; None: one device, no strategy).

    The fast path is one tf.function per step: forward, backward, the strategy's all-reduce
    of the whole gradient (TF packs it into one tensor unless `bytes_per_pack` is set) and
    the momentum update. `profile_step` runs the same pieces separately (see its docstring).
    """

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        if config.dtype != "float32":
            raise FrameworkUnavailable(f"the TensorFlow adapter trains in float32 only, "
                                       f"not {config.dtype}")
        configure_threads(config)
        tf.random.set_seed(config.seed)
        self.gpus = local_gpus(config, dist)
        self.layout = choose_layout(config, bool(self.gpus))
        self.model = TFModel(spec, self.layout, config.dropout, native_groups=bool(self.gpus))
        self.xla = bool(config.options.get("xla", False))
        self.strategy = self._make_strategy()
        self.replicas = self.strategy.num_replicas_in_sync if self.strategy else 1
        self.local_replicas = (len(self.strategy.extended.worker_devices)
                               if self.strategy else 1)
        self.comm_options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=int(config.options.get("bytes_per_pack", 0)))
        self._create_variables()
        self._build_functions()
        self.batches = self._input_pipeline()
        self._loss = None
        self._update_seconds = None

    # -- set-up ------------------------------------------------------------------------------
    def _make_strategy(self):
        """The mode's `tf.distribute` strategy, or None for one device."""
        raise NotImplementedError

    def _scope(self):
        return self.strategy.scope() if self.strategy else contextlib.nullcontext()

    def _create_variables(self):
        with self._scope():
            self.params = {name: tf.Variable(tf.zeros(shape), name=name.replace(".", "/"))
                           for name, shape in self.model.param_shapes.items()}
            self.slots = {name: tf.Variable(tf.zeros(shape), trainable=False,
                                            name=name.replace(".", "/") + "/momentum")
                          for name, shape in self.model.param_shapes.items()}
            # Per-replica statistics (like PyTorch without SyncBatchNorm); read from the
            # first replica, so reading them needs no collective.
            self.buffers = {name: tf.Variable(tf.zeros(shape), trainable=False,
                                              name=name.replace(".", "/"),
                                              synchronization=tf.VariableSynchronization.ON_READ,
                                              aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
                            for name, shape in self.model.buffer_shapes.items()}
        self.names = list(self.params)
        self.trainable = [self.params[n] for n in self.names]

    def _local(self, variables: dict) -> dict:
        """This process's (first) local copy of each variable."""
        return {n: (v.values[0] if hasattr(v, "values") else v) for n, v in variables.items()}

    def _build_functions(self):
        model, lr, momentum = self.model, self.config.lr, self.config.momentum
        names = self.names

        def grads_fn(images, labels):
            with tf.GradientTape() as tape:
                logits, _ = model(images, self.params, self.buffers, training=True)
                loss = model.loss(logits, labels)
            grads = tape.gradient(loss, [self.params[n] for n in names])
            return loss, grads

        self._grads = tf.function(grads_fn, jit_compile=self.xla)

        def apply_local(params, slots, grads):
            for name, grad in zip(names, grads):
                momentum_update(params[name], slots[name], grad, lr, momentum)

        def apply_cross(strategy, grads):
            for name, grad in zip(names, grads):
                strategy.extended.update(self.params[name], momentum_update,
                                         args=(self.slots[name], grad, lr, momentum),
                                         group=False)

        def replica_step(images, labels):
            loss, grads = self._grads(images, labels)
            if self.strategy is None:
                apply_local(self.params, self.slots, grads)
                return loss
            context = tf.distribute.get_replica_context()
            if self.replicas > 1:
                grads = context.all_reduce(tf.distribute.ReduceOp.MEAN, grads,
                                           options=self.comm_options)
            context.merge_call(apply_cross, args=(grads,))
            return loss

        def train_step(images, labels):
            if self.strategy is None:
                return replica_step(images, labels)
            return self.strategy.run(replica_step, args=(images, labels))

        self._train_step = tf.function(train_step)

        # Profile pieces over this process's local copies (one replica per process).
        local_params, local_slots, local_buffers = (self._local(self.params),
                                                    self._local(self.slots),
                                                    self._local(self.buffers))
        self._local_params = local_params

        def forward_local(images, labels):
            logits, _ = model(images, local_params, local_buffers, training=True)
            return model.loss(logits, labels)

        def forward_probe(images, labels):  # forward only, statistics left alone
            logits, _ = model(images, local_params, local_buffers, training=True,
                              update_stats=False)
            return model.loss(logits, labels)

        self._forward_probe = tf.function(forward_probe, jit_compile=self.xla)

        def local_grads(images, labels):  # forward and backward in one graph, as in the step
            with tf.GradientTape() as tape:
                loss = forward_local(images, labels)
            return loss, tape.gradient(loss, [local_params[n] for n in names])

        self._local_grads = tf.function(local_grads, jit_compile=self.xla)

        def allreduce(grads):
            def replica(grads):
                # Function inputs carry no device; the collective needs one to reduce to.
                with tf.device(self.strategy.extended.worker_devices[0]):
                    grads = [tf.identity(g) for g in grads]
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.MEAN, grads, options=self.comm_options)

            return self.strategy.run(replica, args=(grads,))

        self._allreduce = tf.function(allreduce) if self.replicas > 1 else None
        self._apply_local = tf.function(
            lambda grads: apply_local(local_params, local_slots, grads))
        self._fused_local = None  # built at the first profile iteration (`_fused_local_step`)

        def barrier_fn():
            def replica():
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.ones([]))

            return self.strategy.run(replica)

        self._barrier = tf.function(barrier_fn) if self.replicas > 1 else None

    def _input_pipeline(self):
        """Batches as device tensors: (images in the model's layout, int64 labels)."""
        rank, world = self.dist.rank, self.dist.world_size
        if self.local_replicas > 1:  # mirrored: local replica i is rank i of the process
            return self._distributed_input()
        if self.config.data == "synthetic":
            device = "/GPU:0" if self.gpus else "/CPU:0"
            with tf.device(device):
                pool = [(tf.constant(images), tf.constant(labels))
                        for images, labels in synthetic_pool(self.spec, self.config, self.model,
                                                             rank, world)]
            return Cycle(pool)
        return iter(jpeg_dataset(self.config, self.model, rank, world))

    def _distributed_input(self):
        replicas = self.local_replicas
        if self.config.data == "synthetic":
            pools = [synthetic_pool(self.spec, self.config, self.model, r, replicas)
                     for r in range(replicas)]
            batches = []
            for step in range(len(pools[0])):
                batches.append(self.strategy.experimental_distribute_values_from_function(
                    lambda ctx, step=step: tuple(
                        tf.constant(a) for a in pools[ctx.replica_id_in_sync_group][step])))
            return Cycle(batches)

        def dataset_fn(context):
            return jpeg_dataset(self.config, self.model, context.input_pipeline_id,
                                context.num_input_pipelines)

        return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

    # -- weights -----------------------------------------------------------------------------
    def gradients(self, images, labels):
        x = tf.constant(self.model.images_to_layout(images))
        y = tf.constant(labels)
        if self.strategy is not None:
            loss, grads = self.strategy.run(self._grads, args=(x, y))
            loss = self.strategy.experimental_local_results(loss)[0]
            grads = [self.strategy.experimental_local_results(g)[0] for g in grads]
        else:
            loss, grads = self._grads(x, y)
        return float(loss), {name: self.model.to_canonical(name, g.numpy())
                             for name, g in zip(self.names, grads)}

    # -- iterations --------------------------------------------------------------------------
    def step(self):
        images, labels = next(self.batches)
        self._loss = self._train_step(images, labels)

    def _to_device(self, images, labels):
        if not self.gpus or self.local_replicas > 1:
            return images, labels
        with tf.device("/GPU:0"):
            return tf.identity(images), tf.identity(labels)

    def _fused_local_step(self):
        """The step's compute as TF runs it, without the network: forward, backward, the
        gradients packed into one flat tensor and split back (what the packed all-reduce does
        around its ring) and the momentum update, in one graph. The update goes to scratch
        copies of the weights and momenta, so the replicas stay in step."""
        if self._fused_local is None:
            names, model = self.names, self.model
            params, buffers = self._local_params, self._local(self.buffers)
            scratch = {n: tf.Variable(tf.identity(params[n]), trainable=False) for n in names}
            slots = {n: tf.Variable(tf.zeros_like(params[n]), trainable=False) for n in names}
            lr, momentum = self.config.lr, self.config.momentum

            def fused(images, labels):
                with tf.GradientTape() as tape:
                    logits, _ = model(images, params, buffers, training=True, update_stats=False)
                    loss = model.loss(logits, labels)
                grads = tape.gradient(loss, [params[n] for n in names])
                packed = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
                parts = tf.split(packed, [int(np.prod(g.shape)) for g in grads])
                for name, grad, part in zip(names, grads, parts):
                    momentum_update(scratch[name], slots[name], tf.reshape(part, grad.shape),
                                    lr, momentum)
                return loss

            self._fused_local = tf.function(fused, jit_compile=self.xla)
        return self._fused_local

    def _profile(self, overlapped: bool):
        """Phases, the device synchronised between them.

        Separated kind: forward from a forward-only run of the batch (the faster of one before
        and one after the other phases), then forward and backward as one compiled graph, as the
        fused step has them (backward = that graph - forward).
        Timed as two graphs instead (a forward graph under an eager tape keeping what backward
        needs, then the backward graph), alexnet-tiny's backward took 38 ms on 2 CPU cores,
        more than the whole fused step with its all-reduce, and the timed loops between such
        profile rounds ran at 44 ms per step instead of 19. Then the all-reduce of the local
        gradients as its own compiled function (comm), then the momentum update. Last the
        step's compute as one graph (`_fused_local_step`): backward and update are scaled so
        that forward + backward + update is that graph's time. Separate functions cost up to
        10% more than the fused step's compute (each boundary passes every gradient, the
        update is its own dispatch; googlenet-tiny on 2 CPU cores: 39.7 + 8.7 ms against 44.4
        fused), while the fused step itself was this graph + a one-tensor all-reduce of the
        same bytes within 3% for the three tiny models.
        Overlapped kind: TF's own fused step (one graph: forward, backward, all-reduce,
        update); backward_comm = fused step - forward - update, with forward from a forward-only
        run of the same batch just before and update from the latest separated iteration
        (TF fuses them into one graph, so only their sum is directly measured).
        """
        if self.local_replicas > 1:
            return self._profile_fused(overlapped)
        timer = PhaseTimer(self.sync)
        batch = next(self.batches)
        timer.lap("io")
        images, labels = self._to_device(*batch)
        timer.lap("h2d")
        if overlapped:
            self._forward_probe(images, labels)
            timer.lap("forward")
            self._loss = self._train_step(images, labels)
            timer.lap("backward_comm")
            return fused_step_laps(timer.laps, self._update_seconds or 0.0)
        self._forward_probe(images, labels)
        timer.lap("forward")
        loss, grads = self._local_grads(images, labels)
        timer.lap("backward")  # forward and backward: the forward is taken off below
        if self._allreduce is not None:
            grads = self._allreduce(grads)
            grads = [self.strategy.experimental_local_results(g)[0] for g in grads]
            timer.lap("comm")
        else:
            timer.laps["comm"] = 0.0  # one replica: nothing to communicate
        self._apply_local(grads)
        timer.lap("update")
        self._fused_local_step()(images, labels)
        timer.lap("fused")
        # forward: the faster of two forward-only runs, so that a forward the machine slowed once
        # does not leave backward (local gradients less forward) at nothing
        again = PhaseTimer(self.sync)
        self._forward_probe(images, labels)
        again.lap("forward")
        timer.laps["forward"] = min(timer.laps["forward"], again.laps["forward"])
        timer.laps["backward"] = max(0.0, timer.laps["backward"] - timer.laps["forward"])
        laps = scale_to_fused(timer.laps, timer.laps.pop("fused"))
        self._update_seconds = laps["update"]
        self._loss = loss
        return laps

    def _profile_fused(self, overlapped: bool):
        """Several replicas in one process (mirrored on GPUs): io, then the fused step with
        forward taken from a forward-only run; backward, all-reduce and update not separated."""
        timer = PhaseTimer(self.sync)
        images, labels = next(self.batches)
        timer.lap("io")
        timer.laps["h2d"] = 0.0
        self.strategy.run(self._forward_probe, args=(images, labels))
        timer.lap("forward")
        self._loss = self._train_step(images, labels)
        timer.lap("backward_comm" if overlapped else "backward")
        rest = max(0.0, timer.laps.pop("backward_comm" if overlapped else "backward")
                   - timer.laps["forward"])
        if overlapped:
            timer.laps.update(backward_comm=rest, update=0.0)
        else:
            timer.laps.update(backward=rest, comm=0.0, update=0.0)
        return timer.laps

    def last_loss(self):
        if self._loss is None:
            return float("nan")
        if self.strategy is not None and not isinstance(self._loss, tf.Tensor):
            return float(self.strategy.experimental_local_results(self._loss)[0])
        return float(self._loss)

    def sync(self):
        if self.gpus:
            tf.test.experimental.sync_devices()

    def barrier(self):
        if self._barrier is not None:
            self._barrier()

    def versions(self):
        return {**tf_versions(),
                "tf_intra_op_threads": str(tf.config.threading.get_intra_op_parallelism_threads()),
                "tf_inter_op_threads": str(tf.config.threading.get_inter_op_parallelism_threads())}

    def device_name(self):
        if self.gpus:
            details = tf.config.experimental.get_device_details(self.gpus[0])
            return details.get("device_name", "GPU")
        return super().device_name()

    def describe(self):
        facts = {"layout": self.layout, "xla": self.xla, "replicas": self.replicas,
                 "single_device": self.strategy is None,
                 "grouped_conv": "native" if self.model.native_groups else "split per group"}
        if self.strategy is None and self.config.mode != "collective":
            facts["mode_note"] = (f"one worker: the single-device path of every mode, no "
                                  f"{'parameter server' if 'ps' in self.config.mode else 'GPU split'}"
                                  f" started")
        if self.strategy is not None:
            facts.update(strategy=type(self.strategy).__name__,
                         bytes_per_pack=self.comm_options.bytes_per_pack,
                         profile_note="separated: forward from a forward-only run, backward "
                                      "= one forward+backward graph minus it, all-reduce and "
                                      "update their own functions, backward and update scaled "
                                      "to one fused local graph of the step's compute; "
                                      "overlapped: TF's fused step minus a forward-only run and "
                                      "the separated update time")
        return facts

    # -- inputs of the performance model (analysis/perfmodel.py) -------------------------------
    def sends_gradients(self):
        return self.strategy is not None and self.replicas > 1

    def comm_transport(self):
        """CollectiveAllReduce's ring runs over gRPC between workers, NCCL among GPUs."""
        return "nccl" if self.gpus else "grpc"

    def collective_call(self, nbytes):
        """The strategy's all-reduce (the profile's own compiled function) of one float32
        tensor; each new size traces the function once (in the calibration's warm-up)."""
        if self._allreduce is None or self.local_replicas > 1:
            raise NotImplementedError(f"tf:{self.config.mode} with {self.replicas} replica(s) in "
                                      f"{self.local_replicas} per process: calibrate 2+ workers "
                                      "of one replica each")
        tensor = tf.zeros([max(1, int(nbytes) // 4)], tf.float32)
        return lambda: self._allreduce([tensor])


class SingleDeviceTrainer(StrategyTrainer):
    """One worker on one device, no strategy: the single-device path every mode takes with one
    worker, so each mode's scaling table has the same 1-worker baseline."""

    def _make_strategy(self):
        return None


class CollectiveTrainer(StrategyTrainer):
    """`collective`: MultiWorkerMirroredStrategy, one process per worker, gradients averaged by
    collective all-reduce over gRPC (ring on CPUs, NCCL among GPUs; TF_CONFIG from
    launchers/rendezvous/tf.py)."""

    def _make_strategy(self):
        if not self.dist.distributed:
            return None
        if "TF_CONFIG" not in os.environ:
            raise FrameworkUnavailable("collective mode needs TF_CONFIG (set by the launcher)")
        implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                          if self.gpus else
                          tf.distribute.experimental.CommunicationImplementation.RING)
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation))


class MirroredTrainer(StrategyTrainer):
    """`mirrored`: MirroredStrategy over the GPUs of one process (`--workers N` = GPUs; the
    launcher starts one process)."""

    def _make_strategy(self):
        if len(self.gpus) > 1:
            return tf.distribute.MirroredStrategy([g.name.replace("physical_device:", "")
                                                   for g in self.gpus])
        if self.config.workers_per_node > 1:
            raise FrameworkUnavailable("mode 'mirrored' runs one process over several GPUs; "
                                       "this machine has none for TensorFlow (use collective)")
        return None
