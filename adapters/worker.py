"""The one worker entry point every framework runs: `python -m adapters.worker RUN.json`.

Each rank: build the trainer, load the canonical weights, warm up, time `repeats` loops of
`iterations` steps (throughput mode: no synchronisation but one at the end of each loop), and
`profile_iterations` steps of each profile kind (phases synchronised), spread over the gaps
after the timed loops so that both see the machine in the same state. Each rank writes its
timings to rank_dir/rank<r>.json; after a barrier rank 0 merges them into the one result
record. The slowest rank defines a synchronous iteration, so merged times take the maximum
over ranks. Adapters print no results themselves.

Every process started here (workers and serving roles) ends when the process that started
it is gone (`watch_parent`), so no rank trains on for a launcher that was killed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

PARENT_POLL_S = 1.0


def watch_parent(interval: float = PARENT_POLL_S) -> None:
    """End this process (its whole process group when it leads one, as under sshd) once its
    parent is gone: the launcher, mpirun, horovodrun's or sshd's session process. A thread
    polls getppid(); PR_SET_PDEATHSIG cannot stand in for it here, since it fires when the
    parent's forking *thread* ends, which in a framework's launcher need not be the parent's
    end. Nothing to watch when started as pid 1 of a container (its runtime removes it);
    DLC_PARENT_WATCH=0 turns it off (bench/fault_overhead.py measures its cost)."""
    parent = os.getppid()
    if parent <= 1 or os.environ.get("DLC_PARENT_WATCH") == "0":
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":  # before the imports below: the launcher may be gone by their end
    watch_parent()

import numpy as np  # noqa: E402

from adapters.base import DistInfo, FrameworkUnavailable, RunConfig, Trainer  # noqa: E402
from adapters.calibration import run_calibration  # noqa: E402
from adapters.data import rank_batch_start, synthetic_batch  # noqa: E402
from adapters.machine import interval, machine_fields, sample  # noqa: E402
from adapters.rankfiles import environment, wait_for_rank_files  # noqa: E402
from adapters.registry import framework_info, load_trainer  # noqa: E402
from analysis.perfmodel import split_backward_by_flops  # noqa: E402
from analysis import trace  # noqa: E402
from analysis.record import PHASES, empty_record, phase_entry  # noqa: E402
from core.files import write_json_atomic, write_text_atomic  # noqa: E402
from models import canonical_weights, get_model  # noqa: E402

EXIT_UNAVAILABLE = 3


class Progress:
    """Rank 0 writes 'done total phase' to a small file the launcher polls for its run bar."""

    def __init__(self, rank_dir: str, rank: int, total: int):
        self.path = Path(rank_dir) / "progress" if rank == 0 and rank_dir else None
        self.total = total
        self.done = 0

    def advance(self, phase: str) -> None:
        self.done += 1
        if self.path is not None:
            write_text_atomic(self.path, f"{self.done} {self.total} {phase}")


def maybe_inject_fault(config: RunConfig, rank: int, step: int) -> None:
    """Test-only fault injection: crash or hang one rank at one step (--inject-fault)."""
    fault = config.fault
    if not fault or int(fault.get("rank", 0)) != rank or int(fault.get("at", 0)) != step:
        return
    if fault["kind"] == "crash":
        print(f"injected crash on rank {rank} at step {step}", file=sys.stderr, flush=True)
        os._exit(17)
    if fault["kind"] == "hang":
        print(f"injected hang on rank {rank} at step {step}", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a real hang does not die politely
        while True:
            time.sleep(3600)


# Warm-up goes on, a window of steps at a time, while a window's mean step time is this much
# below the one before it on any rank; at most this many windows beyond the fixed warm-up.
WARMUP_TREND = 0.05
WARMUP_WINDOWS_CAP = 8


def warm_up(trainer, config: RunConfig, rank: int, progress: Progress) -> dict:
    """`config.warmup` untimed steps, then windows of ``iterations // 2`` steps (at least 2)
    until the step time stops falling on every rank (`Trainer.any_rank`: the ranks decide
    together, so every rank takes the same steps), at most `WARMUP_WINDOWS_CAP` windows: a
    fixed count leaves a slow first repeat in the timing.  Where the ranks cannot decide
    together, the fixed steps only.  Returns the steps taken and whether the time had stopped
    falling (True), was still falling at the cap (False) or was not checked (None)."""
    step = 0

    def steps(count: int) -> None:
        nonlocal step
        for _ in range(count):
            maybe_inject_fault(config, rank, step)
            trainer.step()
            step += 1
            progress.advance("warmup")

    steps(config.warmup)
    trainer.sync()
    if trainer.any_rank(False) is None:
        return {"warmup_steps": step, "warmup_steady": None}
    window, previous = max(2, config.iterations // 2), math.inf
    for _ in range(WARMUP_WINDOWS_CAP):
        progress.total += window
        start = time.perf_counter()
        steps(window)
        trainer.sync()
        mean = (time.perf_counter() - start) / window
        if not trainer.any_rank(mean < previous * (1 - WARMUP_TREND)):
            return {"warmup_steps": step, "warmup_steady": True}
        previous = mean
    return {"warmup_steps": step, "warmup_steady": False}


def timed_loops(trainer, config: RunConfig, rank: int, progress: Progress,
                after_repeat=lambda repeat: None) -> dict:
    """Warm-up (`warm_up`), then repeats of timed loops; returns per-repeat mean seconds per
    iteration and the warm-up's steps.  `after_repeat(r)` runs, untimed, after timed loop r."""
    warmed = warm_up(trainer, config, rank, progress)
    step = warmed["warmup_steps"]
    repeat_times, losses = [], []
    for repeat in range(config.repeats):
        start = time.perf_counter()
        for _ in range(config.iterations):
            maybe_inject_fault(config, rank, step)
            trainer.step()
            step += 1
            progress.advance("timed")
        trainer.sync()
        repeat_times.append((time.perf_counter() - start) / config.iterations)
        losses.append(trainer.last_loss())
        after_repeat(repeat)
    return {"repeat_times": repeat_times, "losses": losses, "steps": step, **warmed}


class ProfileRounds:
    """The profile iterations of both kinds (see Trainer.profile_step), run a share at a time
    between the timed loops: a profile taken after all timed loops saw a different machine
    (load, clock, allocator state) than the loops it is compared with, and the model's
    prediction inherits every such difference as error."""

    def __init__(self, trainer, config: RunConfig, progress: Progress):
        self.trainer, self.config, self.progress = trainer, config, progress
        self.rounds: list[int] = []  # profile iterations after each timed loop
        # every profile iteration by kind, as it ran: its start, phases and messages
        self.timed: dict[str, list[dict]] = {"separated": [], "overlapped": []}
        self.clock_s = clock_at_barrier(trainer)

    @property
    def separate(self) -> list[dict]:
        """Each separated iteration's phases (for the model)."""
        return [it["laps"] for it in self.timed["separated"]]

    @property
    def overlapped(self) -> list[dict]:
        return [it["laps"] for it in self.timed["overlapped"]]

    def share(self, repeat: int) -> None:
        """After timed loop `repeat`: this loop's share of the profile iterations."""
        total, repeats = self.config.profile_iterations, max(1, self.config.repeats)
        count = total * (repeat + 1) // repeats - total * repeat // repeats
        for _ in range(count):
            self._profile("separated")
            self.progress.advance("profile")
            self._profile("overlapped")
            self.progress.advance("profile")
        self.rounds.append(count)

    def _profile(self, kind: str) -> None:
        """One profile iteration of `kind`, kept with its wall-clock start and the messages
        the scheme exposes for the trace."""
        start = time.time()
        laps = self.trainer.profile_step(overlapped=kind == "overlapped")
        messages = self.trainer.last_messages()
        self.timed[kind].append({"kind": kind, "start_s": start, "laps": dict(laps),
                                 "messages": [list(m) for m in messages] if messages else None})

    def trace(self) -> dict:
        """This rank's part of the run's trace (analysis/trace.py): every profile iteration as
        it ran, in order, so that the trace can show the same iteration on every rank."""
        return {"rank": self.trainer.dist.rank, "host": socket.gethostname(), "clock_s": self.clock_s,
                "iterations": [it for kind in self.timed.values() for it in kind]}

    def medians(self) -> dict:
        """Median seconds per phase over the profile iterations of both kinds."""
        medians = {key: statistics.median(p[key] for p in self.separate) for key in self.separate[0]}
        medians["backward_comm"] = statistics.median(p["backward_comm"] for p in self.overlapped)
        medians["iteration_overlapped"] = statistics.median(sum(p.values()) for p in self.overlapped)
        return medians


def write_trace(run_dir: Path, record: dict, results: list[dict]) -> None:
    """The run's trace beside its record, written after it: a trace that cannot be built is a
    warning on stderr, never a lost measurement."""
    try:
        trace.write(run_dir / trace.TRACE_FILE,
                    trace.measured(record, [dict(r["trace"], layer_ready=r.get("layer_ready")) for r in results]))
    except Exception as error:  # noqa: BLE001 - the record is what matters
        print(f"warning: no trace for {record.get('run_id')}: {type(error).__name__}: {error}", file=sys.stderr)


def clock_at_barrier(trainer) -> float | None:
    """The wall clock right after a barrier that every rank leaves within its latency: the
    trace shifts each rank by its reading's difference from rank 0's, so hosts whose clocks
    differ line up.  None where the trainer has no barrier (ranks line up by wall clock)."""
    if trainer.dist.distributed and type(trainer).barrier is Trainer.barrier:
        return None
    trainer.barrier()
    return time.time()


def overlap_fraction(backward: float, comm: float, backward_comm: float) -> float | None:
    """Share of communication hidden behind backward: (t_b + t_c - t_bc) / t_c, in [0, 1].

    t_b and t_c come from iterations where communication runs after backward, t_bc from
    iterations where the framework overlaps them its own way. None without communication.
    """
    if comm <= 1e-6:
        return None
    return float(min(1.0, max(0.0, (backward + comm - backward_comm) / comm)))


def run_check(trainer, config: RunConfig, spec, dist: DistInfo) -> None:
    """Equivalence mode: dump loss + local gradients on this rank's first batch, then take
    `steps` SGD steps and dump the weights, for comparison against other runs/frameworks."""
    out = Path(config.check["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    start = rank_batch_start(0, dist.rank, dist.world_size, config.batch_per_worker)
    images, labels = synthetic_batch(config.seed, start, config.batch_per_worker,
                                     spec.input_shape, spec.num_classes)
    loss, grads = trainer.gradients(images, labels)
    np.savez(out / f"grads_rank{dist.rank}.npz", __loss__=np.float64(loss), **grads)
    for step in range(int(config.check.get("steps", 1))):
        trainer.step()
    trainer.sync()
    np.savez(out / f"weights_rank{dist.rank}.npz", **trainer.export_weights())
    loss_after, _ = trainer.gradients(images, labels)
    (out / f"loss_rank{dist.rank}.json").write_text(
        json.dumps({"before": loss, "after": loss_after}))


# --------------------------------------------------------------------------- performance model

def layer_profile(trainer, config: RunConfig) -> list[list] | None:
    """Median over `profile_iterations` of when each layer's gradient is final, counted from
    the start of backward ([[layer, seconds]], backward order); None where the framework
    cannot observe it (`Trainer.layer_backward_profile` raises NotImplementedError)."""
    runs = []
    for _ in range(max(1, config.profile_iterations)):
        try:
            runs.append(dict(trainer.layer_backward_profile()))
        except NotImplementedError:
            return None
    layers = set(runs[0]).intersection(*runs[1:])
    ready = {layer: statistics.median(run[layer] for run in runs) for layer in layers}
    return [[layer, t] for layer, t in sorted(ready.items(), key=lambda item: item[1])]


def model_inputs(trainer, config: RunConfig) -> dict:
    """What the performance model needs from this rank besides the phases."""
    return {"layer_ready": layer_profile(trainer, config), "comm_scheme": trainer.comm_scheme()}


def model_extra(spec, results: list[dict], backward: float, slowest: dict | None) -> dict:
    """The record's extra keys for the performance model (analysis/perfmodel.py), `slowest`
    being `slowest_rank_compute(results)`:

    - ``layer_backward_s``: [[layer, seconds]] in backward order, one entry per layer with
      parameters: the time from the previous such layer's gradient being final to this one's
      (so the entries add up to the backward time);
    - ``layer_backward_source``: ``hooks`` when measured per layer by the framework (the
      slowest rank's ready times, scaled to the profile's measured backward), or
      ``flop-share`` when the measured backward was split by the layers' FLOPs;
    - ``comm_scheme``: the adapter's `Trainer.comm_scheme()` (absent when it gives none);
    - ``rank_comm_s``: each rank's separated comm phase (a faster rank's includes its wait
      for the slowest; the record's phase is the exchange timed from the last rank's
      arrival, `collective_time`);
    - ``rank_phases_s``: each rank's phase medians (the record's phases are per-phase maxima
      over ranks, whose sum can exceed every rank's own iteration);
    - ``sync_compute_s``: the median over separated profile iterations of the slowest rank's
      compute before the gradient exchange (io + h2d + forward + backward) and of its update:
      a synchronous iteration waits in every round for whichever rank is slowest in that round,
      which on a busy machine is more than any one rank's median.
    """
    extra = {"rank_comm_s": [r["profile"].get("comm") for r in results],
             "rank_phases_s": [{p: r["profile"].get(p) for p in PHASES} for r in results]}
    if slowest:
        extra["sync_compute_s"] = slowest
    scheme = results[0].get("comm_scheme")
    if scheme:
        extra["comm_scheme"] = scheme
    params = {name for name, _ in spec.gradient_sizes_backward()}
    measured = [r.get("layer_ready") for r in results]
    if all(measured) and all(set(dict(m)) == params for m in measured):
        ready = {layer: max(dict(m)[layer] for m in measured) for layer in params}
        ordered = sorted(ready.items(), key=lambda item: item[1])
        scale = backward / ordered[-1][1] if ordered and ordered[-1][1] > 0 else 1.0
        previous, layers = 0.0, []
        for layer, t in ordered:
            layers.append([layer, max(0.0, (t - previous) * scale)])
            previous = t
        extra.update(layer_backward_s=layers, layer_backward_source="hooks")
    else:
        rows = [(row.name, row.flops, row.params > 0) for row in spec.layer_table()]
        extra.update(layer_backward_s=[list(item) for item in split_backward_by_flops(backward, rows)],
                     layer_backward_source="flop-share")
    return extra


def slowest_rank_compute(results: list[dict]) -> dict | None:
    """{"before_comm": s, "update": s, "comm": s}: the compute a synchronous iteration waits
    for and the exchange itself (`collective_time`), as the same statistic as the measured
    iteration time; "comm_median" is the plain median over iterations, the record's comm phase.

    Per separated profile iteration the maximum over ranks (iteration i of every rank ends in
    the same collective); then, per round of profile iterations (``profile_rounds``: those
    run right after one timed loop), the mean, since a timed loop's time is a mean over its
    iterations; then the median over rounds, as the measured time is the median over loops.
    On this 2-core machine whole stretches of a second run 50% slow: the median over all
    iterations sits in the fast stretches, 5-10% under the loops' median; a round next to a
    loop shares that loop's stretch."""
    runs = [r.get("profile_samples") or [] for r in results]
    count = min(len(run) for run in runs) if runs else 0
    if count == 0:
        return None
    before, comm, update = [], [], []
    for i in range(count):
        arrivals = [sum(float(run[i].get(p, 0.0)) for p in ("io", "h2d", "forward", "backward"))
                    for run in runs]
        before.append(max(arrivals))
        comm.append(collective_time(arrivals, [float(run[i].get("comm", 0.0)) for run in runs]))
        update.append(max(float(run[i].get("update", 0.0)) for run in runs))
    rounds = [n for n in results[0].get("profile_rounds") or [count] if n > 0]
    if sum(rounds) != count:
        rounds = [count]

    def median_of_round_means(values: list[float]) -> float:
        means, start = [], 0
        for size in rounds:
            means.append(statistics.fmean(values[start:start + size]))
            start += size
        return statistics.median(means)

    return {"before_comm": median_of_round_means(before), "update": median_of_round_means(update),
            "comm": median_of_round_means(comm), "comm_median": statistics.median(comm),
            "iterations": count, "rounds": len(rounds)}


def collective_time(arrivals: list[float], comms: list[float]) -> float:
    """Seconds one gradient exchange took once the last rank arrived at it.

    Each rank's comm phase runs from its own arrival (the end of its backward) to the end of
    the exchange, which ends on every rank at about the same moment; a rank that finished
    backward early spends its comm phase waiting for the others. That wait is rank skew, not
    communication: counted as comm it inflates the phase and makes a scheme that cannot
    overlap (CNTK's) look as if it hid skew/(skew + comm) of its communication. Ranks start
    a profile iteration together (the previous one ended in a collective), so the exchange
    lasted max(arrival + comm) - max(arrival)."""
    return max(0.0, max(a + c for a, c in zip(arrivals, comms)) - max(arrivals))


def rank_result(config: RunConfig, trainer, timings: dict, profile: dict) -> dict:
    return {"timings": timings, "profile": profile, "versions": trainer.versions(),
            "device_name": trainer.device_name(), "extra": trainer.describe()}


def merge_ranks(config: RunConfig, spec, results: list[dict]) -> dict:
    """Build the one record from every rank's result (slowest rank per repeat/phase)."""
    repeat_times = [max(r["timings"]["repeat_times"][i] for r in results)
                    for i in range(config.repeats)]
    phases = {key: max(r["profile"][key] for r in results) for key in results[0]["profile"]}
    slowest = slowest_rank_compute(results)
    if slowest and len(results) > 1:
        phases["comm"] = slowest["comm_median"]  # without the wait for the slowest rank
    median = statistics.median(repeat_times)
    first = results[0]
    info = framework_info(config.framework)
    record = empty_record(
        run_id=config.run_id, campaign=config.campaign, config_hash=config.config_hash,
        framework=config.framework, framework_label=info.label, mode=config.mode,
        synchronous=int(config.mode in info.synchronous_modes), model=config.model,
        params=spec.total_params, flops=spec.total_flops, device_kind=config.device,
        device_name=first["device_name"], nodes=config.nodes,
        workers_per_node=config.workers_per_node, world_size=config.world_size,
        servers=config.servers,
        batch_per_worker=config.batch_per_worker, global_batch=config.global_batch,
        scaling="weak", dtype=config.dtype, layout=first["extra"].get("layout", config.layout),
        data=config.data, warmup=config.warmup, iterations=config.iterations,
        repeats=config.repeats, threads_per_worker=config.threads_per_worker,
        bandwidth=config.bandwidth, latency=config.latency,
        iter_time_median=median,
        iter_time_p10=float(np.percentile(repeat_times, 10)),
        iter_time_p90=float(np.percentile(repeat_times, 90)),
        iter_time_std=float(np.std(repeat_times)),
        throughput=config.global_batch / median,
        throughput_per_worker=config.batch_per_worker / median,
        profile_iter_time=phases["iteration_overlapped"],  # communication the framework's own way
        overlap=overlap_fraction(phases["backward"], phases["comm"], phases["backward_comm"]),
        loss_first=first["timings"]["losses"][0], loss_last=first["timings"]["losses"][-1],
        git_revision=config.git_revision, status="ok",
        **machine_fields([r["machine"] for r in results if r.get("machine")], config.threads_per_worker,
                         config.device),
    )
    record["phases"] = [phase_entry(p, phases[p]) for p in PHASES]
    record["env"] = environment(first["versions"])
    record["extra"] = {**first["extra"], "repeat_times": repeat_times,
                       "warmup_steps": first["timings"].get("warmup_steps"),
                       "warmup_steady": first["timings"].get("warmup_steady"),
                       "bound_cores": [r.get("bound_cores") for r in results] if first.get("bound_cores") else None,
                       "profile_backward_comm": phases["backward_comm"],
                       "per_rank_median": [statistics.median(r["timings"]["repeat_times"])
                                           for r in results]}
    record["extra"].update(model_extra(spec, results, phases["backward"], slowest))
    record["extra"].update(peak_memory(results))
    return record


def peak_memory(results: list[dict]) -> dict:
    """Each rank's peak memory: the device's where its framework tracks it (GPUs), else the
    rank's resident set; the largest over ranks and what it is a share of (the device's
    memory, or the machine's)."""
    device = [r.get("device_memory") for r in results]
    if all(device):
        peaks, total, kind = [d[0] for d in device], device[0][1], "device"
    else:
        machines = [r.get("machine") or {} for r in results]
        peaks = [m.get("peak_resident_bytes") for m in machines]
        total, kind = machines[0].get("memory_total_bytes"), "resident"
    if not all(isinstance(p, int) for p in peaks):
        return {}
    return {"peak_memory_bytes": max(peaks), "rank_peak_memory_bytes": peaks, "peak_memory_kind": kind,
            "memory_total_bytes": total}


def bind_to_cores(config: RunConfig, rank: int) -> list[int] | None:
    """With ``--option bind_cores=true``: this rank and the threads it starts from now on kept
    to `threads_per_worker` cores of their own (slot rank mod slots of the cores this process
    may use, so that ranks sharing a machine never share a core while there are enough); None
    without the option or where the system cannot bind."""
    if not config.options.get("bind_cores") or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, min(config.threads_per_worker, len(cores)))
    slot = rank % max(1, len(cores) // per)
    mine = cores[slot * per:(slot + 1) * per]
    os.sched_setaffinity(0, mine)
    return mine


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m adapters.worker RUN.json", file=sys.stderr)
        return 2
    config = RunConfig.from_json(argv[0])
    role = os.environ.get("DLC_ROLE", "worker")
    if role != "worker":  # a parameter server, scheduler, ...: the adapter serves the workers
        return load_trainer(config.framework, config.mode).serve(config, role,
                                                    int(os.environ.get("DLC_ROLE_INDEX", "0")))
    dist = DistInfo.from_env()
    bound = bind_to_cores(config, dist.rank)  # before the framework starts its thread pools
    spec = get_model(config.model)
    try:
        trainer_class = load_trainer(config.framework, config.mode).for_run(config)
        if config.dtype not in trainer_class.DTYPES:
            raise FrameworkUnavailable(f"{config.framework} runs {', '.join(trainer_class.DTYPES)}, "
                                       f"not {config.dtype}")
        trainer = trainer_class(spec, config, dist)
    except FrameworkUnavailable as error:
        print(f"unavailable: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        trainer.load_weights(canonical_weights(spec, config.seed))
        if config.check:
            run_check(trainer, config, spec, dist)
            trainer.barrier()
            return 0
        if config.calibrate:
            run_calibration(trainer, config, dist)
            trainer.barrier()
            return 0
        total = config.warmup + config.iterations * config.repeats + 2 * config.profile_iterations
        progress = Progress(config.rank_dir, dist.rank, total)
        profile = ProfileRounds(trainer, config, progress)
        before = sample()
        timings = timed_loops(trainer, config, dist.rank, progress, after_repeat=profile.share)
        machine = interval(before, sample())
        rank_dir = Path(config.rank_dir)
        write_json_atomic(rank_dir / f"rank{dist.rank}.json",
                          {**rank_result(config, trainer, timings, profile.medians()),
                           **model_inputs(trainer, config), "profile_samples": profile.separate,
                           "machine": machine, "bound_cores": bound, "device_memory": trainer.device_memory(),
                           "profile_rounds": profile.rounds, "trace": profile.trace()})
        trainer.barrier()
        if dist.rank == 0:
            results = wait_for_rank_files(rank_dir, dist.world_size)
            record = merge_ranks(config, spec, results)
            write_json_atomic(Path(config.record_path), record)
            write_trace(Path(config.record_path).parent, record, results)
        return 0
    finally:
        trainer.close()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:  # noqa: BLE001 - the launcher records the tail of stderr
        traceback.print_exc()
        sys.exit(1)
