"""The `Trainer` contract every framework adapter implements, and the run settings it receives.

A trainer is built inside one worker process (one rank). The worker (adapters/worker.py) owns
timing, repeats, progress, fault injection and the result record; the trainer owns only the
framework: the model built from the shared description, the optimizer, the input pipeline
and the gradient aggregation scheme. This split keeps every framework's numbers produced by
the same measuring code.
"""

from __future__ import annotations

import abc
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np

from core import schemes as catalogue


@dataclass
class RunConfig:
    """Everything one run needs; written by the launcher as RUN.json, read by every rank."""

    run_id: str
    framework: str
    mode: str
    model: str
    batch_per_worker: int
    campaign: str = "adhoc"
    config_hash: str = ""
    device: str = "cpu"  # cpu or gpu
    nodes: int = 1
    workers_per_node: int = 1
    servers: int = 0  # parameter servers, for the modes that have them
    warmup: int = 2
    iterations: int = 10
    repeats: int = 3
    profile_iterations: int = 4
    data: str = "synthetic"  # synthetic or files
    data_dir: str = ""
    layout: str = "NCHW"
    dtype: str = "float32"
    dropout: bool = True
    seed: int = 0
    lr: float = 0.01
    momentum: float = 0.9
    threads_per_worker: int = 1
    loader_workers: int = 2
    options: dict = field(default_factory=dict)  # adapter-specific (channels_last, ...)
    record_path: str = ""
    rank_dir: str = ""
    git_revision: str = ""
    bandwidth: str | None = None
    latency: str | None = None
    fault: dict | None = None  # test-only: {"kind": "crash"|"hang", "rank": r, "at": step}
    check: dict | None = None  # equivalence mode: {"steps": n, "out_dir": path}
    # calibration mode (launchers/calibrate.py): {"sizes": [bytes], "repeats": n, "warmup": n}
    calibrate: dict | None = None
    # which separate launch of its configuration this run is (1..launches): it ran in that
    # round of the campaign's interleaved order (launchers/plan.py: `in_rounds`)
    launch: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_per_worker

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "RunConfig":
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown run settings in {path}: {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2, sort_keys=True))


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job; the launcher sets DLC_* beside the framework's own
    rendezvous variables so every adapter reads its rank the same way."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "DistInfo":
        """DLC_* where the launcher set them, else what mpirun (OpenMPI) or horovodrun tells
        each rank."""
        def first(*names: str, default: str) -> int:
            return int(next((os.environ[n] for n in names if n in os.environ), default))

        return cls(
            rank=first("DLC_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK",
                       default="0"),
            world_size=first("DLC_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE",
                             default="1"),
            local_rank=first("DLC_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK",
                             default="0"),
        )

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class FrameworkUnavailable(RuntimeError):
    """The framework (or the asked-for device or mode) cannot run in this environment."""


class Trainer(abc.ABC):
    """One rank's synchronous SGD trainer for one model in one framework.

    Lifecycle: construct (build model, join the process group, set up data) ->
    `load_weights(canonical)` -> any number of `step()` / `profile_step()` -> `close()`.
    Weights and gradients cross the boundary as NumPy arrays in the canonical layout of
    models/ (conv OIHW, linear (out, in), names `layer.weight`), so every framework can start
    from the same numbers and be compared to every other.
    """

    # Calibration: at most this many back-to-back calls per sample of a small message
    # (`collective_times`' iters; nccl-tests' -n).
    MAX_CALIBRATION_ITERS = 20
    # The RunConfig.dtype values the adapter runs; the worker reports any other as unavailable
    # rather than run float32 under another name.
    DTYPES: tuple[str, ...] = ("float32",)

    def __init__(self, spec, config: RunConfig, dist: DistInfo):
        self.spec = spec
        self.config = config
        self.dist = dist

    @classmethod
    def for_run(cls, config: RunConfig) -> type["Trainer"]:
        """The class that runs `config` for this mode: itself, unless the mode hands some
        topologies to another class (TensorFlow's parameter-server modes run one worker on the
        single-device path, with no server started)."""
        return cls

    @classmethod
    def serve(cls, config: RunConfig, role: str, index: int) -> int:
        """Play a non-worker role of the run (parameter server, scheduler) until the workers
        are done or the launcher ends it; returns the exit code. Only adapters whose schemes
        have such roles override this."""
        raise NotImplementedError(f"{cls.__name__} has no {role!r} role")

    @abc.abstractmethod
    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Set parameters and buffers from canonical NumPy arrays."""

    @abc.abstractmethod
    def export_weights(self) -> dict[str, np.ndarray]:
        """Parameters and buffers as canonical NumPy arrays."""

    @abc.abstractmethod
    def gradients(self, images: np.ndarray, labels: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """Loss and this rank's local (not aggregated) gradients on a given NCHW batch,
        without updating weights: the cross-framework equivalence check compares these."""

    @abc.abstractmethod
    def step(self) -> None:
        """One synchronous SGD iteration on the framework's fast path: next batch, forward,
        backward, gradient aggregation, update. Adds no synchronisation of its own."""

    @abc.abstractmethod
    def profile_step(self, overlapped: bool) -> dict[str, float]:
        """The same iteration with the device synchronised around each phase.

        With `overlapped=False` returns seconds for io, h2d, forward, backward, comm, update,
        communication run after backward so the two are separable. With `overlapped=True`
        communication runs the framework's normal way (overlapped where it overlaps) and the
        dict holds io, h2d, forward, backward_comm, update; the worker derives the overlap
        from the two kinds.
        """

    @abc.abstractmethod
    def last_loss(self) -> float:
        """Loss of the latest step (may synchronise the device)."""

    def sync(self) -> None:
        """Wait for queued device work; a no-op where execution is synchronous."""

    def barrier(self) -> None:
        """Wait for every rank; a no-op for one rank."""

    def device_memory(self) -> tuple[int, int] | None:
        """(the most device memory this rank has allocated so far, the device's memory) in
        bytes, on an accelerator whose framework tracks it; None on a CPU or where it does not."""
        return None

    def last_messages(self) -> list[list] | None:
        """The messages of the latest iteration as [[name, start, end, bytes]], wall-clock
        seconds (`MessageLog`), for the run's trace; None where the framework sends them out of
        sight of Python (DDP's reducer, Horovod's background thread, a compiled step)."""
        return None

    def any_rank(self, flag: bool) -> bool | None:
        """Whether any rank passed True, the same answer on every rank: for what all ranks must
        decide together (how long warm-up lasts).  None where this trainer cannot ask the other
        ranks, so the caller keeps to its fixed plan; one rank answers alone."""
        return flag if not self.dist.distributed else None

    def versions(self) -> dict[str, str]:
        """Framework and library versions for the result record."""
        return {}

    def device_name(self) -> str:
        """The compute device's name for the result record."""
        return cpu_name()

    def describe(self) -> dict:
        """Adapter-specific facts for the record's `extra` (bucket sizes, backend, ...)."""
        return {}

    def close(self) -> None:
        """Leave the process group and free the device."""

    # -- inputs of the performance model (analysis/perfmodel.py); optional ------------------

    def comm_scheme(self) -> dict | None:
        """How this run aggregates gradients, in the terms of `analysis.perfmodel.Scheme`
        (overlap, granularity, bucket sizes, merge, algorithm, servers, profile_granularity),
        plus transport (the key calibrations are shared by) and label: the scheme catalogue's
        description of the run's mode (`core.schemes.SchemeInfo.describe`) with the run's
        options, servers, the transport it really uses (`comm_transport`) and the model's
        parameter shapes (a compressing scheme's bytes on the wire).  None where no
        gradient crosses ranks (`sends_gradients`) or the model has no terms for the scheme;
        the model then assumes the whole gradient after backward and marks its prediction as
        assumed."""
        if not self.sends_gradients():
            return None
        config = self.config
        return catalogue.scheme(config.framework, config.mode).describe(
            self.scheme_options(), config.device, config.servers or None, self.comm_transport(),
            list(self.spec.parameter_shapes().values()))

    def sends_gradients(self) -> bool:
        """Whether this run's gradients cross ranks (a one-rank run of most schemes does not)."""
        return True

    def comm_transport(self) -> str | None:
        """The communication stack this run uses (gloo, nccl, mpi, grpc ...); None: the
        catalogue's for the run's device."""
        return None

    def scheme_options(self) -> dict:
        """The option values that shape the scheme (a bucket size, a fusion threshold), as
        this run applies them."""
        return self.config.options

    def layer_backward_profile(self) -> list[tuple[str, float]]:
        """One local iteration (forward, backward without communication, no update) that
        returns [(layer name, seconds from the start of backward until the layer's gradient
        is final)] for every layer with parameters.  Frameworks that cannot observe it raise
        NotImplementedError; the worker then splits the measured backward by FLOPs."""
        raise NotImplementedError(f"{type(self).__name__} cannot time backward per layer")

    def collective_times(self, sizes: list[int], repeats: int, warmup: int = 2,
                         iters: int = 1) -> dict[int, list[float]]:
        """Calibration: `repeats` samples per size (bytes) of the scheme's collective
        (all-reduce, or push + pull) on a float32 buffer, through the framework's own
        communication stack, every rank taking part; each sample starts after a barrier and is
        the mean time of `iters` back-to-back calls (nccl-tests' -n: consecutive messages, as
        backward sends them).  Frameworks that lack it raise NotImplementedError (the
        calibration launcher says so); an implementation without `iters` times single calls."""
        return {int(n): self.time_collective(self.collective_call(int(n)), repeats, warmup, iters)
                for n in sizes}

    def collective_call(self, nbytes: int) -> Callable[[], None]:
        """A blocking call that runs the scheme's collective once on an `nbytes` float32
        message, the way an iteration sends a gradient.  The default `collective_times` times
        it.  Frameworks that lack it raise NotImplementedError (the calibration launcher says
        so)."""
        raise NotImplementedError(f"{type(self).__name__} has no collective micro-benchmark")

    def contention_probe(self, rounds: int) -> dict:
        """Calibration of a scheme that overlaps: the communication-free backward timed alone
        and with every gradient sent through the framework's own asynchronous path as it
        appears ({"bytes": per tensor, "alone_s", "with_s", "done_s", "replay_s": per round,
        "ready_s": per tensor}, in send order; see `adapters/calibration.py`).
        NotImplementedError where the adapter has none: the model then assumes communication
        takes nothing from backward."""
        raise NotImplementedError(f"{type(self).__name__} has no contention probe")

    def probe_rounds(self, backward_once, rounds: int, replay=None) -> dict:
        """`contention_probe`'s loop: `backward_once(send)` -> (seconds until backward ended,
        ready times, seconds until the exchange was back) alone (send=False) and sending
        (True), alternating after a barrier each, one untimed round first.  With `replay`,
        each round then also sends the same messages at the alone half's ready times without
        backward (`replay(ready)` -> seconds until they were back): the exchange's own end
        (a last background cycle, waiting on the handles), which the fit must not take for
        contention.  Returns "alone_s", "with_s" (backward's end), "done_s" (the exchange's
        end) and "replay_s" of the timed rounds, and "ready" of the median alone round."""
        alone, beneath, done, replayed, ready = [], [], [], [], []
        for _ in range(rounds + 1):
            self.barrier()
            seconds, stamps, _ = backward_once(False)
            alone.append(seconds)
            ready.append(stamps)
            self.barrier()
            seconds, _, back = backward_once(True)
            beneath.append(seconds)
            done.append(back)
            if replay is not None:
                self.barrier()
                replayed.append(replay(stamps))
        median_run = sorted(range(1, rounds + 1), key=lambda i: alone[i])[rounds // 2]
        return {"alone_s": alone[1:], "with_s": beneath[1:], "done_s": done[1:],
                **({"replay_s": replayed[1:]} if replay is not None else {}),
                "ready": ready[median_run]}

    def replay_at(self, offsets, send, wait) -> float:
        """A probe's replay, paced: `send(i)` once `offsets[i]` seconds have passed since the
        start (sleeping until then), then `wait()`; seconds from the start until it returned."""
        self.sync()
        start = time.perf_counter()
        for index, offset in enumerate(offsets):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            send(index)
        wait()
        return time.perf_counter() - start

    def time_collective(self, call, repeats: int, warmup: int, iters: int) -> list[float]:
        """`collective_times`' samples of one message: `warmup` untimed calls (connections,
        tracing), then per sample a barrier and the mean seconds of `iters` back-to-back
        calls, the device synchronised before and after them."""
        iters = max(1, int(iters))
        for _ in range(warmup):
            call()
        measured = []
        for _ in range(repeats):
            self.barrier()
            self.sync()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            self.sync()
            measured.append((time.perf_counter() - start) / iters)
        return measured


class MessageLog:
    """The messages a scheme's own code sends in one iteration, each timed around its blocking
    call: what `Trainer.last_messages` gives the run's trace (analysis/trace.py)."""

    def __init__(self):
        self.messages: list[list] = []

    def clear(self) -> None:
        self.messages = []

    def timed(self, name: str, nbytes: int, send: Callable[[], None]) -> None:
        start = time.time()
        send()
        self.messages.append([name, start, time.time(), int(nbytes)])


class PhaseTimer:
    """Successive laps of wall time, the device synchronised before each reading."""

    def __init__(self, sync):
        self.sync = sync
        self.laps: dict[str, float] = {}
        sync()
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.laps[name] = now - self.last
        self.last = now


def scale_to_fused(laps: dict[str, float], fused: float) -> dict[str, float]:
    """Backward and update scaled so that forward + backward + update is `fused`, the same
    step's compute timed as one compiled function: compiled frameworks (TensorFlow, JAX) time
    their phases as separate functions, which cost more than the same work fused (each boundary
    passes every gradient, each function is its own dispatch)."""
    separate = laps["backward"] + laps["update"]
    if separate > 0:
        scale = max(0.0, fused - laps["forward"]) / separate
        laps["backward"], laps["update"] = laps["backward"] * scale, laps["update"] * scale
    return laps


def fused_step_laps(laps: dict[str, float], update: float) -> dict[str, float]:
    """The overlapped profile kind of a compiled framework, whose step (forward, backward, its
    communication, update) is one function: `backward_comm` is that function's lap less the
    forward-only lap and `update`, the separated kind's latest update, which stands in for it."""
    laps["backward_comm"] = max(0.0, laps["backward_comm"] - laps["forward"] - update)
    laps["update"] = update
    return laps


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
