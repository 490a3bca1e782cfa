"""Real CNTK 2.7 (the study's CNTK), driven from the Python 3.11 worker.

CNTK's wheels exist for Python 3.5/3.6 only, and dlcompare's worker needs 3.10+. So this
Trainer runs in the worker as usual (timing, profile, check mode and the record stay the
worker's) and drives a CNTK process, `DLC_BACKEND_PYTHON adapters/cntk_backend.py`, over a
JSON-lines protocol on its stdin/stdout (see that module). The worker side exports the shared
model description as JSON, writes the canonical weights and the synthetic batches (generated
here with adapters.data, so CNTK sees exactly the other frameworks' numbers) to .npz files and
reads gradients and weights back the same way.

`step()` sends one line and does not wait: the backend works while the worker goes on, like a
device queue, and `sync()` collects the replies. So the per-iteration protocol cost in the
timed loop is one pipe write here plus one read and one reply in the backend, all measured in
`describe()` (protocol_roundtrip_us: a full request/reply round trip of an empty request).

Modes: `single` (one worker, CNTK's Trainer with momentum SGD) and `mpi` (CNTK's
data_parallel_distributed_learner over MPI; see the registry entry and the issue note for how
far it goes on this machine). CPU only (the environment holds the CPU wheel). Where Python 3.6
or CNTK cannot run, the worker exits with one line (FrameworkUnavailable).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from adapters.base import DistInfo, FrameworkUnavailable, RunConfig, Trainer
from adapters.data import SyntheticBatches
from core.envs import EnvBuildError, environment_for
from models import layers as L

BACKEND = Path(__file__).with_name("cntk_backend.py")
BACKEND_ENV = "cntk"
STARTUP_TIMEOUT = 120.0


def node_json(node) -> dict:
    """The description tree as plain JSON: {"type": class name, fields...}, children inline."""
    out = {"type": type(node).__name__}
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, tuple) and value and isinstance(value[0], L.NODE_TYPES):
            value = [node_json(child) for child in value]
        elif isinstance(value, L.NODE_TYPES):
            value = node_json(value)
        out[field.name] = value
    return out


def model_json(spec) -> dict:
    """What the backend builds from: the tree, input shape, classes and every node's expected
    output shape (the backend checks CNTK's shapes against them, catching convention errors
    at build time)."""
    return {"name": spec.name, "input_shape": list(spec.input_shape),
            "num_classes": spec.num_classes, "root": node_json(spec.root),
            "output_shapes": {name: list(shape) for name, shape in spec.output_shapes().items()}}


def backend_python() -> str:
    """The CNTK environment's interpreter: DLC_BACKEND_PYTHON (set by the launchers), else the
    built `cntk` environment if there is one."""
    python = os.environ.get("DLC_BACKEND_PYTHON")
    if python:
        if not os.access(python, os.X_OK):
            raise FrameworkUnavailable(f"DLC_BACKEND_PYTHON={python} is not an interpreter")
        return python
    try:
        env = environment_for(BACKEND_ENV)
    except EnvBuildError as error:
        raise FrameworkUnavailable(f"CNTK 2.7 {error}") from None
    if not env.ready:
        raise FrameworkUnavailable(f"the CNTK environment is not built (DLC_BACKEND_PYTHON is "
                                   f"unset and {env.path} is missing): run it through "
                                   f"launchers.compare, which builds it")
    return str(env.python)


class BackendError(RuntimeError):
    """The CNTK backend reported an error or died."""


class Backend:
    """The CNTK process and its JSON-lines channel."""

    def __init__(self, python: str, env: dict[str, str]):
        self.python = python
        self.process = subprocess.Popen([python, str(BACKEND)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        self.unanswered = 0  # requests sent without waiting for their reply

    def send(self, op: str, **fields) -> None:
        try:
            self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self.died() from None
        self.unanswered += 1

    def receive(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise self.died()
        self.unanswered -= 1
        reply = json.loads(line)
        if not reply.pop("ok"):
            if reply.get("kind") == "unavailable":
                raise FrameworkUnavailable(reply["error"])
            raise BackendError(f"CNTK backend: {reply['error']}")
        return reply

    def call(self, op: str, **fields) -> dict:
        """Send a request and wait for its reply (after any still unanswered ones)."""
        self.send(op, **fields)
        return self.drain()

    def drain(self) -> dict:
        reply = {}
        while self.unanswered:
            reply = self.receive()
        return reply

    def died(self) -> BackendError:
        code = self.process.wait(timeout=30)
        return BackendError(f"the CNTK backend ({self.python}) exited with code {code}; "
                            f"its traceback is above")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.call("close")
            except (BackendError, FrameworkUnavailable, OSError, ValueError):
                pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class CntkTrainer(Trainer):
    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        super().__init__(spec, config, dist)
        if config.device != "cpu":
            raise FrameworkUnavailable("CNTK runs on the CPU here (its environment holds the "
                                       "CPU wheel, cntk 2.7.post2)")
        if config.data != "synthetic":
            raise FrameworkUnavailable("CNTK reads synthetic data only here (its image reader "
                                       "needs libjpeg/libpng sonames this system lacks)")
        self.folder = Path(tempfile.mkdtemp(prefix="dlc-cntk-",
                                            dir=config.rank_dir or None))
        env = {**os.environ}
        env.pop("PYTHONPATH", None)  # dlcompare's packages are 3.10+ code: keep them away
        self.backend = Backend(backend_python(), env)
        try:
            self.facts = self.backend.call("hello")["versions"]
            self.facts.update(self.backend.call("build", model=model_json(spec), options={
                "batch": config.batch_per_worker, "lr": config.lr, "momentum": config.momentum,
                "dropout": config.dropout, "seed": config.seed,
                "threads": config.threads_per_worker, "world_size": dist.world_size}))
            batches = SyntheticBatches(spec, config.batch_per_worker, dist.rank,
                                       dist.world_size, config.seed)
            path = self.folder / "batches.npz"
            np.savez(path, images=np.stack([b[0] for b in batches.batches]),
                     labels=np.stack([b[1] for b in batches.batches]))
            self.backend.call("set_batches", path=str(path))
            path.unlink()
            self.roundtrip = self._roundtrip()
        except BaseException:
            self.close()
            raise

    def _roundtrip(self, count: int = 50) -> float:
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self.backend.call("noop")
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    # -- weights ---------------------------------------------------------------------------
    def load_weights(self, weights):
        path = self.folder / "weights_in.npz"
        np.savez(path, **weights)
        self.backend.call("load_weights", path=str(path))
        path.unlink()

    def export_weights(self):
        path = self.folder / "weights_out.npz"
        self.backend.call("export_weights", path=str(path))
        with np.load(path) as data:
            weights = {name: data[name].copy() for name in data.files}
        path.unlink()
        return weights

    def gradients(self, images, labels):
        inputs, out = self.folder / "batch.npz", self.folder / "grads.npz"
        np.savez(inputs, images=images, labels=labels)
        loss = self.backend.call("gradients", path=str(inputs), out=str(out))["loss"]
        with np.load(out) as data:
            grads = {name: data[name].copy() for name in data.files}
        inputs.unlink()
        out.unlink()
        order = list(self.spec.parameter_shapes())
        return float(loss), {name: grads[name] for name in order}

    # -- iterations ------------------------------------------------------------------------
    def step(self):
        self.backend.send("step", n=1)  # the reply is collected by sync()

    def profile_step(self, overlapped):
        self.backend.drain()
        return self.backend.call("profile", overlapped=bool(overlapped))["phases"]

    def last_loss(self):
        return float(self.backend.call("loss")["loss"])

    def sync(self):
        self.backend.drain()

    def barrier(self):
        if self.dist.distributed:
            self.backend.call("barrier")

    # -- facts -----------------------------------------------------------------------------
    def versions(self):
        return {k: str(v) for k, v in self.facts.items()
                if k.startswith("cntk") and k != "cntk_threads"}

    def describe(self):
        return {"layout": "NCHW", "backend": "mpi" if self.dist.distributed else "none",
                "cntk_threads": self.facts.get("cntk_threads"),
                "protocol_roundtrip_us": round(self.roundtrip * 1e6, 1),
                "backend_python": self.backend.python}

    def comm_scheme(self):
        """CNTK's data_parallel_distributed_learner: once backward is done, the learner's
        update starts one non-blocking MPI all-reduce per gradient tensor (plus one for the
        sample count and loss), waits for all of them, then applies momentum SGD
        (DataParallelDistributedLearner::Update -> MPICommunicatorImpl::AggregateImpl). The
        algorithm is OpenMPI's choice for an in-place MPI_Iallreduce (libnbc's binomial
        tree); that is read from the sources, not measured."""
        return super().comm_scheme()

    def sends_gradients(self):
        return self.dist.distributed

    def collective_times(self, sizes, repeats, warmup=2):
        if not self.dist.distributed:
            raise NotImplementedError("one rank has nothing to all-reduce: calibrate with 2 or "
                                      "more workers")
        times = self.backend.call("collective", sizes=[int(s) for s in sizes],
                                  repeats=int(repeats), warmup=int(warmup))["times"]
        return {int(size): values for size, values in times.items()}

    def close(self):
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TRAINERS = {"mpi": CntkTrainer}
