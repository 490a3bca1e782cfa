"""`PSLiteTrainer`: the ps-lite modes (`dist_sync`, `dist_device_sync`), one worker per
process over parameter servers, with their calibration and the scheduler and server roles."""

from __future__ import annotations

import os
import time

from adapters.base import FrameworkUnavailable, RunConfig
from adapters.mxnet.base import check_mode, mx, mxnet_features
from adapters.mxnet.trainer import MXNetTrainer


class PSLiteTrainer(MXNetTrainer):
    """`dist_sync`, `dist_device_sync`: one worker per process over ps-lite parameter servers
    (scheduler and servers started by the launcher, played by `serve`)."""

    distributed = True
    # Keys in flight per calibration sample (`collective_times`): as many as a backward
    # pushes (googlenet 116 tensors, resnet50 161): the servers pipeline what is in flight,
    # 0.77 ms per small key with 20 in flight against 0.49 ms per key in googlenet-tiny's
    # iterations.
    MAX_CALIBRATION_ITERS = 128
    PROBE_KEYS = 2_000_000  # the contention probe's keys, one per gradient, far from the others

    def _create_kvstore(self):
        """Dist stores are created here, which joins ps-lite (blocks until every scheduler,
        server and worker has registered), so a broken rendezvous fails at start-up."""
        if "DIST_KVSTORE" not in mxnet_features():
            raise FrameworkUnavailable("this MXNet build has no distributed kvstore (ps-lite)")
        if "DMLC_PS_ROOT_URI" not in os.environ:
            raise ValueError(f"mxnet:{self.config.mode} needs the ps-lite rendezvous (DMLC_* "
                             "variables from launchers/rendezvous/dmlc.py)")
        kv = mx.kv.create(self.config.mode)
        if kv.num_workers != self.dist.world_size:
            raise RuntimeError(f"ps-lite has {kv.num_workers} workers, the run {self.dist.world_size}")
        return kv

    # -- performance model --------------------------------------------------------------------
    def comm_scheme(self):
        """Dist modes: each gradient tensor pushed to the servers as soon as backward made it
        (MXNet's engine runs the pushes by priority, overlapping the rest of backward), summed
        there (and the update applied there with update_on_kvstore), then pulled. Tensors over
        MXNET_KVSTORE_BIGARRAY_BOUND elements (default 1e6) are split over all servers, smaller
        ones go whole to one server, so `servers` slices are exact only for the big tensors.
        (In-process modes reduce in this process's memory, which the model has no term for:
        their `comm_scheme` is None.)"""
        return super().comm_scheme()

    def collective_times(self, sizes, repeats, warmup=2, iters=1):
        """Push and pull through the dist kvstore (the servers sum every worker's push) of
        `iters` float32 keys per size, all issued back to back and then waited for; each sample
        starts after a kvstore barrier and is the time per key. Each key goes by one
        `kv.pushpull` with a falling priority, gluon.Trainer's call: a `push` then a `pull`
        per key cost 0.5-0.6 ms per small key in flight against 0.42 ms with `pushpull`, and
        an iteration's exchange measured 0.38-0.45 ms per key.

        One key per message, as backward sends them: the engine keeps the keys in flight at
        once, as it does a backward's gradients. Pushing and pulling one key `iters` times
        instead serialises every round trip (the pull waits for the push, the next push for the
        pull): 0.94 ms per small key on loopback against 0.22 ms in flight together.

        The kvstore is set up as training sets it first, so with the update on the servers
        (MXNet's default) every calibration key also goes through the servers' Python updater
        as a gradient does: about 0.3 ms per key, which a calibration without it missed (the
        model under-predicted googlenet-tiny's exchange 27 ms against 59 ms measured). Keys
        are initialised once (a dist kvstore cannot initialise a key twice), far from
        gluon.Trainer's keys."""
        self._update_on_kvstore()  # the optimizer on the servers, as in an iteration
        if not hasattr(self, "_calibration_keys"):
            self._calibration_keys = {}
        count = max(1, int(iters))
        times = {}
        for nbytes in sizes:
            nbytes = int(nbytes)
            keys = self._calibration_keys.setdefault(nbytes, [])
            while len(keys) < count:
                key = 1_000_000 + sum(len(k) for k in self._calibration_keys.values())
                buffer = mx.nd.zeros(max(1, nbytes // 4), ctx=self.contexts[0])
                self.kv.init(key, buffer)
                keys.append((key, buffer))
            in_flight = keys[:count]

            def push_pull_all(in_flight=in_flight):
                for position, (key, buffer) in enumerate(in_flight):
                    self.kv.pushpull(key, buffer, out=buffer, priority=-position)
                for _, buffer in in_flight:
                    buffer.wait_to_read()

            times[nbytes] = [t / count for t in self.time_collective(push_pull_all, repeats, warmup, 1)]
        return times

    def contention_probe(self, rounds):
        """The contention calibration (adapters/calibration.py): backward timed alone and with
        every gradient pushed (to a probe key of its shape) and pulled back the way
        gluon.Trainer does, the engine starting each push once backward has written that
        gradient; alternating, `rounds` of each after one of each untimed. Backward ends when
        every gradient is written, which a one-element copy of each gradient, queued behind
        backward before the push, marks: waiting on the gradient itself would wait for the
        exchange too, since on a CPU context the kvstore pulls into the pushed array (its
        `comm_buf_` is the gradient), which had each round's backward end with its exchange
        and fitted contention to 1 (the most) in every campaign where backward itself had
        slowed far less. The ready times are the marks' in backward order; the exchange
        ends when the pulls are back. (Pushing a 64 KiB buffer made to depend on each
        gradient instead slowed backward 13% where the gradients themselves slow it 2-3x: the
        servers' updater and ps-lite copy what is pushed.)"""
        self._update_on_kvstore()  # the servers' updater on, as in an iteration
        grads = [p.list_grad()[0] for p in self.network.collect_params().values()
                 if p.grad_req != "null"][::-1]  # backward order: the last layer first
        buffers = []
        for index in range(len(grads)):
            buffer = mx.nd.zeros(grads[index].shape, ctx=self.contexts[0])
            self.kv.init(self.PROBE_KEYS + index, buffer)
            buffers.append(buffer)
        sources = [mx.nd.zeros(grad.shape, ctx=self.contexts[0]) for grad in grads]
        rounds_ = self.probe_rounds(lambda send: self._probe_backward(grads, buffers if send else None),
                                    rounds, replay=lambda ready: self._probe_replay(sources, buffers, ready))
        ready = rounds_.pop("ready")
        return {"bytes": [int(g.size) * 4 for g in grads], **rounds_, "ready_s": ready}

    def _probe_backward(self, grads, buffers):
        data, labels = self._to_devices(next(self.batches))
        losses = self._forward(data, labels)
        mx.nd.waitall()
        start = time.perf_counter()
        self._backward(losses)
        # read by the engine once backward wrote the gradient, before the pull writes it
        marks = [grad.reshape((-1,))[:1].copy() for grad in grads]
        if buffers is not None:
            last = len(grads) - 1
            for index, (grad, buffer) in enumerate(zip(grads, buffers)):
                # gluon.Trainer's call: priority -i for parameter i (grads are in backward order)
                self.kv.pushpull(self.PROBE_KEYS + index, grad, out=buffer, priority=index - last)
        ready = []
        for mark in marks:
            mark.wait_to_read()
            ready.append(time.perf_counter() - start)
        seconds = time.perf_counter() - start
        mx.nd.waitall()
        return seconds, ready, time.perf_counter() - start

    def _probe_replay(self, sources, buffers, ready) -> float:
        """The probe's exchange without backward: each key pushed and pulled as in
        `_probe_backward`, at its ready time from the round's alone half (sleeping until
        then), all waited for; seconds from the start until the last pull was back."""
        last = len(sources) - 1
        return self.replay_at(ready, lambda i: self.kv.pushpull(self.PROBE_KEYS + i, sources[i], out=buffers[i],
                                                                priority=i - last), mx.nd.waitall)

    # -- ps-lite roles ------------------------------------------------------------------------
    @classmethod
    def serve(cls, config: RunConfig, role: str, index: int) -> int:
        """Run ps-lite's scheduler or a server until the workers stop it (or the launcher
        kills it); the servers sum gradients and, with update_on_kvstore, run the optimizer
        the workers send them."""
        check_mode(config.mode)
        if role not in ("scheduler", "server"):
            raise ValueError(f"mxnet:{config.mode} has no {role!r} role")
        if os.environ.get("DMLC_ROLE") != role:
            raise ValueError(f"DMLC_ROLE is {os.environ.get('DMLC_ROLE')!r}, expected {role!r}")
        server = mx.kv.KVStoreServer(mx.kv.create("dist"))
        server.run()  # returns when the workers have finished (ps-lite's final barrier)
        return 0
