"""`ps`: synchronous parameter servers as the study's TensorFlow ran them.

A TF1 graph (`tf.compat.v1`) built in each worker process, variables placed on the `ps` job by
`replica_device_setter` (greedy by bytes, like tf_cnn_benchmarks; `options["ps_strategy"] =
"round_robin"` for TF's default), gradients aggregated by `SyncReplicasOptimizer` (one gradient
per worker per step, averaged in conditional accumulators on the servers; the chief's queue
runner applies the momentum update there and releases one token per worker). Sessions are
created without MonitoredSession: its recovering session would retry for ever when a server
dies, and its defaults wait 30 s for non-chief readiness (`recovery_wait_secs`) and 120 s on
close (`stop_grace_period_secs`); here readiness is polled every 0.1 s and close waits 1 s.

`serve` runs a server process of either parameter-server mode: a `tf.distribute.Server` for the
`ps` job (or a TF `worker` for ps-async) that serves until the launcher ends it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import tensorflow as tf

from adapters.base import DistInfo, FrameworkUnavailable, PhaseTimer, RunConfig
from adapters.calibration import LOOP_BYTES, messages_per_sample
from adapters.tensorflow.base import TensorFlowTrainer, choose_layout, tf_versions
from adapters.tensorflow.inputs import jpeg_dataset, synthetic_pool
from adapters.tensorflow.model import TFModel
from adapters.tensorflow.strategy import SingleDeviceTrainer

tf.get_logger().setLevel("ERROR")  # TF1 APIs warn of their deprecation on every use

READY_POLL_SECONDS = 0.1
STOP_GRACE_SECONDS = 1
BARRIER_TIMEOUT_SECONDS = 600


def tf_config() -> tuple[dict, dict]:
    try:
        data = json.loads(os.environ["TF_CONFIG"])
        return data["cluster"], data["task"]
    except (KeyError, ValueError) as error:
        raise FrameworkUnavailable(f"parameter-server modes need TF_CONFIG from the launcher "
                                   f"({error})") from None


def session_config(config: RunConfig, device_filters=None):
    threads = max(1, config.threads_per_worker)
    proto = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=int(config.options.get("inter_op_threads",
                                                            max(2, threads))),
        allow_soft_placement=False, device_filters=device_filters or [])
    if config.options.get("xla"):
        proto.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_1
    return proto


def serve(config: RunConfig, role: str, index: int) -> int:
    """A parameter server (TF job `ps`) or, for ps-async, a TF worker: serve until killed."""
    cluster, task = tf_config()
    if config.mode == "ps":
        device_filters = ["/job:ps", "/job:worker"]
    else:
        device_filters = None
        tf.config.set_visible_devices([], "GPU") if config.device != "gpu" else None
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task["type"],
                                  task_index=int(task["index"]), protocol="grpc",
                                  config=session_config(config, device_filters), start=True)
    print(f"{role} {index}: TF {task['type']}:{task['index']} serving at {server.target}",
          file=sys.stderr, flush=True)
    server.join()
    return 0


class GreedyByBytes:
    """replica_device_setter's ps_strategy: each variable to the least-loaded server by bytes
    (tf.contrib.training.GreedyLoadBalancingStrategy with byte_size_load_fn, gone in TF2)."""

    def __init__(self, servers: int):
        self.loads = [0] * servers

    def __call__(self, op) -> int:
        try:
            shape = tf.TensorShape(op.get_attr("shape"))
            dtype = tf.as_dtype(op.get_attr("dtype"))
            size = (shape.num_elements() or 1) * dtype.size
        except (ValueError, TypeError):
            size = 1
        task = int(np.argmin(self.loads))
        self.loads[task] += size
        return task


class SessionCreator(tf.compat.v1.train.SessionCreator):
    """The chief initialises (from the canonical weights fed to the initialisers), the others
    wait for it, polling every READY_POLL_SECONDS (SessionManager's default is 30 s)."""

    def __init__(self, scaffold, master, config, is_chief):
        self.scaffold, self.master, self.config, self.is_chief = scaffold, master, config, is_chief

    def create_session(self):
        self.scaffold.finalize()
        manager = tf.compat.v1.train.SessionManager(
            local_init_op=self.scaffold.local_init_op, ready_op=self.scaffold.ready_op,
            ready_for_local_init_op=self.scaffold.ready_for_local_init_op,
            graph=tf.compat.v1.get_default_graph(), recovery_wait_secs=READY_POLL_SECONDS)
        if self.is_chief:
            return manager.prepare_session(self.master, init_op=self.scaffold.init_op,
                                           init_feed_dict=self.scaffold.init_feed_dict,
                                           config=self.config)
        return manager.wait_for_session(self.master, config=self.config,
                                        max_wait_secs=BARRIER_TIMEOUT_SECONDS)


class ParameterServerMode:
    """What both parameter-server modes share: their servers (`serve`), and one worker on the
    single-device path (the launcher starts no server for it)."""

    @classmethod
    def for_run(cls, config: RunConfig):
        return SingleDeviceTrainer if config.world_size == 1 else cls

    @classmethod
    def serve(cls, config: RunConfig, role: str, index: int) -> int:
        return serve(config, role, index)


class SyncPSTrainer(ParameterServerMode, TensorFlowTrainer):
    """Synchronous parameter servers in TF1 graph mode (see the module docstring)."""

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        if config.device == "gpu":
            raise FrameworkUnavailable("the ps mode is wired for CPU workers here")
        tf.config.set_visible_devices([], "GPU")
        cluster, task = tf_config()
        self.rank, self.workers = dist.rank, dist.world_size
        self.servers = len(cluster["ps"])
        self.is_chief = self.rank == 0
        self.layout = choose_layout(config, gpu=False)
        self.session_config = session_config(
            config, ["/job:ps", f"/job:worker/task:{self.rank}"])
        self.server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker",
                                           task_index=self.rank, protocol="grpc",
                                           config=self.session_config, start=True)
        self.graph = tf.Graph()
        self.model = TFModel(spec, self.layout, config.dropout)
        self.ps_strategy = config.options.get("ps_strategy", "greedy")
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(config.seed)
            self._build(cluster)
        self.session = None
        self._loss = None
        self._barriers = 0

    # -- graph -------------------------------------------------------------------------------
    def _build(self, cluster):
        model, config = self.model, self.config
        worker = f"/job:worker/task:{self.rank}"
        strategy = GreedyByBytes(self.servers) if self.ps_strategy == "greedy" else None
        setter = tf.compat.v1.train.replica_device_setter(
            ps_tasks=self.servers, worker_device=worker, cluster=tf.train.ClusterSpec(cluster),
            ps_strategy=strategy)
        self.init_values = {}
        with tf.compat.v1.device(setter):
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            self.params, self.buffers = {}, {}
            for names, store, trainable in ((model.param_shapes, self.params, True),
                                            (model.buffer_shapes, self.buffers, False)):
                for name, shape in names.items():
                    holder = tf.compat.v1.placeholder(tf.float32, shape, name=f"init_{name}")
                    self.init_values[name] = holder
                    store[name] = tf.compat.v1.Variable(holder, trainable=trainable,
                                                        name=name.replace(".", "/"))
        self.names = list(self.params)
        with tf.compat.v1.device("/job:ps/task:0"):
            self.barrier_count = tf.compat.v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                                       name="dlc_barrier")
            self.barrier_add = self.barrier_count.assign_add(1)
        with tf.compat.v1.device(worker):
            self.batch = self._input()
            logits, self.updates = model(self.batch[0], self.params, self.buffers, training=True)
            self.loss = model.loss(logits, self.batch[1])
            optimizer = tf.compat.v1.train.MomentumOptimizer(config.lr, config.momentum)
            self.sync_optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=self.workers, total_num_replicas=self.workers)
            grads_and_vars = self.sync_optimizer.compute_gradients(
                self.loss, var_list=[self.params[n] for n in self.names])
            self.grads = [g for g, _ in grads_and_vars]
            self.train_op = self.sync_optimizer.apply_gradients(grads_and_vars,
                                                                global_step=self.global_step)
            # A fed path for given batches (the equivalence check, the profile). Not a
            # placeholder_with_default over the iterator: a distributed session was seen to
            # run the iterator for runs that fed it.
            self.images = tf.compat.v1.placeholder(tf.float32, model.input_shape(None), "images")
            self.labels = tf.compat.v1.placeholder(tf.int64, [None], "labels")
            fed_logits, self.fed_updates = model(self.images, self.params, self.buffers,
                                                 training=True)
            self.fed_loss = model.loss(fed_logits, self.labels)
            self.fed_grads = tf.gradients(self.fed_loss, [self.params[n] for n in self.names])
            # Profile pieces: a worker-local copy of the weights, pulled explicitly, so
            # forward and backward can be timed without communication (a graph run executes
            # only what its fetches need: fetching the loss alone leaves the statistics'
            # assignments out).
            self.local = {n: tf.compat.v1.Variable(tf.zeros(model.param_shapes[n]),
                                                   trainable=False, name=f"local/{n}",
                                                   collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
                          for n in self.names}
            self.pull = tf.group(*[self.local[n].assign(self.params[n]) for n in self.names])
            local_logits, self.local_updates = model(self.images, self.local, self.buffers,
                                                     training=True)
            self.local_loss = model.loss(local_logits, self.labels)
            self.local_grads = tf.gradients(self.local_loss, [self.local[n] for n in self.names])
        self.hooks = [self.sync_optimizer.make_session_run_hook(self.is_chief, num_tokens=0)]
        self.calibration_ops = {}  # bytes -> (train op, messages): calibration mode only
        if config.calibrate:
            self._build_calibration(setter, worker)
        for hook in self.hooks:
            hook.begin()
        self.saver = tf.compat.v1.train.Saver([self.global_step])  # Scaffold insists on one

    def _build_calibration(self, setter, worker):
        """Calibration mode: per message size, `messages_per_sample` variables of that size on
        the servers (placed as the model's are) and their own SyncReplicasOptimizer(Momentum)
        with its own step, token queue and chief queue runner, so one run of its train op is
        what one step does to that many tensors: each variable read by the worker (the pull
        its forward makes), a gradient made from it on the worker, pushed into the servers'
        accumulator, the chief's momentum update once every worker's is in, and the token.
        All of a size's messages are in flight together, as a step's are.  Each size's
        stateful ops live in their own container: SyncReplicasOptimizer names its token
        queue `sync_token_q` in every graph, and servers share resources by name (a container
        name takes letters, digits, '.', '-' and '/', not '_').  The graph is finalised when
        the session opens, so all of this is built here."""
        loop_bytes = int(self.config.calibrate.get("loop_bytes", LOOP_BYTES))
        for nbytes in sorted({int(n) for n in self.config.calibrate["sizes"]}):
            count = messages_per_sample(nbytes, loop_bytes, self.MAX_CALIBRATION_ITERS)
            with tf.compat.v1.container(f"dlc-calibration-{nbytes}"), \
                    tf.compat.v1.variable_scope(f"dlc_calibration_{nbytes}"):
                with tf.compat.v1.device(setter):
                    step = tf.compat.v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                                 name="step")
                    variables = [tf.compat.v1.Variable(tf.zeros([max(1, nbytes // 4)]),
                                                       trainable=False, name=f"message{i}")
                                 for i in range(count)]
                with tf.compat.v1.device(worker):  # the gradient: worker work on the pulled value
                    grads = [v * 1e-3 for v in variables]
                    optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                        tf.compat.v1.train.MomentumOptimizer(self.config.lr, self.config.momentum),
                        replicas_to_aggregate=self.workers, total_num_replicas=self.workers)
                    train_op = optimizer.apply_gradients(list(zip(grads, variables)), global_step=step)
            self.calibration_ops[nbytes] = (train_op, count)
            self.hooks.append(optimizer.make_session_run_hook(self.is_chief, num_tokens=0))

    def _input(self):
        if self.config.data == "synthetic":
            pool = synthetic_pool(self.spec, self.config, self.model, self.rank, self.workers)
            dataset = tf.data.Dataset.from_tensor_slices(
                (np.stack([i for i, _ in pool]), np.stack([y for _, y in pool]))).repeat()
        else:
            dataset = jpeg_dataset(self.config, self.model, self.rank, self.workers)
        return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

    # -- session -----------------------------------------------------------------------------
    def _open(self, weights):
        feed = {self.init_values[n]: self.model.to_tf(n, weights[n]) for n in self.init_values}
        with self.graph.as_default():
            scaffold = tf.compat.v1.train.Scaffold(saver=self.saver, init_feed_dict=feed)
            creator = SessionCreator(scaffold, self.server.target, self.session_config,
                                     self.is_chief)
            self.session = creator.create_session()
            self.coordinator = tf.train.Coordinator()
            for hook in self.hooks:
                hook.after_create_session(self.session, self.coordinator)

    def _run(self, fetches, feed_dict=None):
        return self.session.run(fetches, feed_dict=feed_dict)

    # -- weights -----------------------------------------------------------------------------
    def load_weights(self, weights):
        if self.session is None:
            self._check_weight_names(weights)
            self._open(weights)  # the chief initialises the servers' variables from these
            return
        with self.graph.as_default():
            self.assign_weights(weights, lambda variable, value: variable.load(value, self.session))

    def _read_variables(self, variables: dict) -> dict:
        names = list(variables)
        return dict(zip(names, self._run([variables[n] for n in names])))

    def gradients(self, images, labels):
        feed = {self.images: self.model.images_to_layout(images), self.labels: labels}
        loss, grads, _ = self._run([self.fed_loss, self.fed_grads, self.fed_updates], feed)
        return float(loss), {n: self.model.to_canonical(n, g) for n, g in zip(self.names, grads)}

    # -- iterations --------------------------------------------------------------------------
    def step(self):
        _, self._loss, _ = self._run([self.train_op, self.loss, self.updates])

    def _profile(self, overlapped: bool):
        """Phases in graph mode (each a separate session run; nothing runs between them).

        io: the next batch from tf.data fetched to the host (fed back to the local forward and
        backward; the overlapped kind's own step takes the batch after it); h2d: 0 (CPU). Separated kind: comm = pulling every
        weight from the servers into worker-local copies + pushing the gradients (fed back
        from the host) through SyncReplicasOptimizer, which includes waiting for the other
        workers and the chief's momentum update on the servers; forward = the local copy's
        forward; backward = (forward + backward) - forward, because a graph-mode run of the
        gradients recomputes the forward (no partial runs on a distributed master). update = 0:
        it runs on the servers inside the synchronisation and is counted in comm.
        Overlapped kind: TF's own step graph (pull, forward, backward, push, sync in one run,
        overlapping as the dataflow allows) minus the local forward.
        """
        timer = PhaseTimer(lambda: None)
        images, labels = self._run(self.batch)
        timer.lap("io")
        timer.laps["h2d"] = 0.0
        feed = {self.images: images, self.labels: labels}
        self._run(self.pull)
        timer.lap("pull")
        self._run(self.local_loss, feed)
        timer.lap("forward")
        if overlapped:
            _, self._loss, _ = self._run([self.train_op, self.loss, self.updates])
            timer.lap("backward_comm")
            timer.laps["backward_comm"] = max(0.0, timer.laps["backward_comm"]
                                              - timer.laps["forward"])
            timer.laps.pop("pull")
            timer.laps["update"] = 0.0
            return timer.laps
        loss, grads, _ = self._run([self.local_loss, self.local_grads, self.local_updates], feed)
        timer.lap("forward_backward")
        feed_grads = dict(zip(self.grads, grads))
        self._run(self.train_op, feed_grads)
        timer.lap("push")
        self._loss = loss
        laps = timer.laps
        return {"io": laps["io"], "h2d": 0.0, "forward": laps["forward"],
                "backward": max(0.0, laps["forward_backward"] - laps["forward"]),
                "comm": laps["pull"] + laps["push"], "update": 0.0}

    def last_loss(self):
        return float(self._loss) if self._loss is not None else float("nan")

    # -- the performance model's inputs --------------------------------------------------------
    # A step pushes every variable at once (googlenet 116, resnet50 161): so many messages in
    # flight per calibration sample of a small size.
    MAX_CALIBRATION_ITERS = 128

    def comm_scheme(self):
        """The catalogue's push and pull per variable, priced after backward: TF's dataflow
        may start a push as soon as its gradient exists, but the pulls come with the next
        forward and the update waits for every push; on this kind of host the two profile
        kinds differed by 0-18% of the exchange (the record's overlap), and without a
        contention probe an overlapping model would hide all of it."""
        return {**super().comm_scheme(), "servers": self.servers}

    def collective_times(self, sizes, repeats, warmup=2, iters=1):
        """Calibration: one sample per repeat of each size's push/pull step built in
        `_build_calibration` (after a barrier of every worker), as seconds per message.  The
        number of messages was fixed when the graph was built (`messages_per_sample` of the
        run's loop_bytes), so `iters` is that number already."""
        if not self.calibration_ops:
            raise NotImplementedError("tf:ps builds its push/pull micro-benchmark only in "
                                      "calibration mode (launchers.calibrate)")
        times = {}
        for nbytes in sizes:
            if int(nbytes) not in self.calibration_ops:
                raise ValueError(f"no tf:ps calibration step was built for {nbytes} bytes")
            train_op, count = self.calibration_ops[int(nbytes)]
            samples = self.time_collective(lambda: self._run(train_op), repeats, warmup, 1)
            times[int(nbytes)] = [seconds / count for seconds in samples]
        return times

    def barrier(self):
        """Every worker counts itself in on the first server, then waits for the others."""
        self._barriers += 1
        target = self._barriers * self.workers
        self._run(self.barrier_add)
        deadline = time.monotonic() + BARRIER_TIMEOUT_SECONDS
        while self._run(self.barrier_count) < target:
            if time.monotonic() > deadline:
                raise TimeoutError("workers did not all reach the barrier")
            time.sleep(0.01)

    def versions(self):
        return {**tf_versions(), "tf_graph_mode": "tf.compat.v1"}

    def describe(self):
        return {"layout": self.layout, "servers": self.servers, "single_device": False,
                "ps_strategy": self.ps_strategy, "optimizer": "SyncReplicasOptimizer(Momentum)",
                "xla": bool(self.config.options.get("xla", False)),
                "profile_note": "comm = pull weights + push gradients and synchronise (the "
                                "update runs on the servers inside it); backward = local "
                                "forward+backward - forward"}

    def close(self):
        if self.session is None:
            return
        # The chief's queue-runner thread is blocked in a run waiting for gradients that will
        # not come; closing the session ends that run with an error the thread would print.
        previous = threading.excepthook
        threading.excepthook = lambda args: (
            None if args.thread is not None and args.thread.name.startswith("QueueRunnerThread")
            else previous(args))
        self.coordinator.request_stop()
        try:
            self.coordinator.join(stop_grace_period_secs=STOP_GRACE_SECONDS,
                                  ignore_live_threads=True)
        except Exception:  # noqa: BLE001 - closing; a queue-runner error changes nothing now
            pass
        self.session.close()
        self.session = None
