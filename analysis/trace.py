"""One run's iteration as a trace: `runs/<id>/trace.json` in the Trace Event Format, the JSON
that Perfetto (ui.perfetto.dev) and chrome://tracing open.

What the file holds, one process per row group of the viewer:

- **each rank** (process ``rank r · host``), thread ``compute``: two profile iterations as that
  rank ran them (adapters/worker.py, `ProfileRounds.trace`), of each kind the same iteration on
  every rank, the one whose slowest rank took the median time (`chosen_iterations`): the
  *separated* kind (io, h2d, forward, backward, comm, update: the
  communication after backward, so each phase stands alone) and the *overlapped* kind (the
  framework's own way: ``backward_comm``).  Backward holds one slice per layer with parameters
  where the framework exposes when each gradient is final (the rank's ready times, the median
  over its profile iterations, scaled to this iteration's backward).  Thread ``messages``: the
  messages the scheme's own code sends (`Trainer.last_messages`: each all-reduce with its bytes),
  more threads where messages overlap.  A compiled framework (TensorFlow, JAX) times its phases
  as separate functions scaled to the fused step (`adapters.base.scale_to_fused`): its slices
  are laid end to end from the iteration's start.
- **the model** (process ``model (predicted)``, after the ranks): the performance model's schedule
  of the same iteration (analysis/predict.py's ``timeline``): phases, backward per layer, and the
  transfers on their own thread, starting where rank 0's overlapped iteration starts so the two
  read side by side.  Written when the run's prediction is (`update_model_process`).

Times are wall-clock microseconds from the first rank's first slice.  Ranks on rank 0's host
share its clock; the ranks of another host are shifted by their clock readings right after a
barrier (`clock_at_barrier`) against rank 0's, so hosts whose clocks differ line up to within
the barrier's exit skew (`_shifts`).
Slices on one thread nest strictly (a child inside its parent, siblings apart), as Perfetto's
importer requires; `problems` checks it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Iterable, Mapping

from core.cli import EXIT_FAILED, OneLineParser, fail, listed
from core.files import write_json_atomic

TRACE_FILE = "trace.json"
MODEL_PROCESS = "model (predicted)"
COMPUTE_THREAD, MESSAGE_THREAD = 1, 2
KIND_TITLES = {"separated": "iteration (separated: communication after backward)",
               "overlapped": "iteration (overlapped: the framework's own way)"}


# --------------------------------------------------------------------------- building

class Events:
    """Trace events in integer nanoseconds until written (so that clipping a child into its
    parent is exact), one thread's slices at a time."""

    def __init__(self):
        self.items: list[dict] = []

    def meta(self, pid: int, name: str, value, tid: int | None = None) -> None:
        """A metadata event: ``process_name``/``thread_name`` take a name, ``process_sort_index``
        an index (the viewer's order of processes)."""
        key = "sort_index" if name.endswith("sort_index") else "name"
        event = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
        if tid is not None:
            event["tid"] = tid
        self.items.append(event)

    def slice(self, pid: int, tid: int, name: str, start_ns: int, end_ns: int, cat: str,
              args: Mapping | None = None, within: tuple[int, int] | None = None) -> tuple[int, int]:
        """A complete event ("X"), clipped into `within` (its parent's span); returns its span."""
        if within is not None:
            start_ns, end_ns = min(max(start_ns, within[0]), within[1]), min(max(end_ns, within[0]), within[1])
        end_ns = max(start_ns, end_ns)
        self.items.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
                           "ts": start_ns, "dur": end_ns - start_ns, **({"args": dict(args)} if args else {})})
        return start_ns, end_ns

    def written(self, origin_ns: int) -> list[dict]:
        """The events with times in microseconds from `origin_ns` (three decimals: exact ns)."""
        out = []
        for event in self.items:
            event = dict(event)
            if event["ph"] == "X":
                event["ts"] = round((event["ts"] - origin_ns) / 1000, 3)
                event["dur"] = round(event["dur"] / 1000, 3)
            out.append(event)
        return out


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _lanes(spans: list[tuple[int, int]]) -> list[int]:
    """A lane per span such that spans in one lane never overlap (greedy, in start order)."""
    ends: list[int] = []
    lanes = [0] * len(spans)
    for index in sorted(range(len(spans)), key=lambda i: spans[i]):
        start, end = spans[index]
        lane = next((k for k, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        ends[lane] = end
        lanes[index] = lane
    return lanes


def _layer_slices(events: Events, pid: int, tid: int, backward: tuple[int, int],
                  ready: list[list] | None, source: str) -> None:
    """One slice per layer inside `backward`, from the layers' ready times scaled to it."""
    if not ready or ready[-1][1] <= 0:
        return
    scale = (backward[1] - backward[0]) / _ns(ready[-1][1])
    previous = backward[0]
    for layer, seconds in ready:
        end = backward[0] + int(_ns(seconds) * scale)
        events.slice(pid, tid, layer, previous, end, "layer", {"source": source}, within=backward)
        previous = max(previous, end)


def _message_slices(events: Events, pid: int, messages: list[list], shift_ns: int,
                    named_threads: set[int], title: str = "messages") -> None:
    spans = [(_ns(start) - shift_ns, _ns(end) - shift_ns) for _, start, end, _ in messages]
    for (name, _, _, nbytes), span, lane in zip(messages, spans, _lanes(spans)):
        tid = MESSAGE_THREAD + lane
        if tid not in named_threads:
            events.meta(pid, "thread_name", title if lane == 0 else f"{title} {lane + 1}", tid)
            named_threads.add(tid)
        events.slice(pid, tid, name, *span, "message", {"bytes": int(nbytes)})


def _of_kind(rank: Mapping, kind: str) -> list[Mapping]:
    """A rank's profile iterations of `kind`, in the order it ran them."""
    return [it for it in rank.get("iterations") or [] if it["kind"] == kind]


def chosen_iterations(ranks: list[Mapping]) -> dict[str, int]:
    """Of each kind, the index of the profile iteration to show: the j-th iteration of a kind
    is the same synchronous iteration on every rank, so the one whose slowest rank took the
    median time (the iteration as the run typically went, on every rank at once)."""
    chosen = {}
    for kind in KIND_TITLES:
        per_rank = [[sum(it["laps"].values()) for it in _of_kind(rank, kind)] for rank in ranks]
        count = min((len(times) for times in per_rank), default=0)
        if count:
            slowest = [max(times[j] for times in per_rank) for j in range(count)]
            chosen[kind] = sorted(range(count), key=slowest.__getitem__)[(count - 1) // 2]
    return chosen


def _rank_events(events: Events, rank: Mapping, shift_ns: int, chosen: Mapping[str, int]) -> int | None:
    """A rank's chosen iterations and their messages; returns its overlapped iteration's
    start (ns)."""
    pid = int(rank["rank"]) + 1
    events.meta(pid, "process_name", f"rank {rank['rank']} · {rank.get('host', '?')}")
    events.meta(pid, "process_sort_index", pid)
    events.meta(pid, "thread_name", "compute", COMPUTE_THREAD)
    named, overlapped_start = {COMPUTE_THREAD}, None
    for kind, index in chosen.items():
        iteration = _of_kind(rank, kind)[index]
        start = _ns(iteration["start_s"]) - shift_ns
        laps = iteration["laps"]
        span = (start, start + sum(_ns(t) for t in laps.values()))
        events.slice(pid, COMPUTE_THREAD, KIND_TITLES[iteration["kind"]], *span, "iteration",
                     {"kind": iteration["kind"], "ms": round(sum(laps.values()) * 1e3, 3)})
        at = start
        for phase, seconds in laps.items():
            phase_span = events.slice(pid, COMPUTE_THREAD, phase, at, at + _ns(seconds), "phase", within=span)
            if phase == "backward":
                _layer_slices(events, pid, COMPUTE_THREAD, phase_span, rank.get("layer_ready"), "hooks")
            at = phase_span[1]
        if iteration["kind"] == "overlapped":
            overlapped_start = start
        if iteration.get("messages"):
            _message_slices(events, pid, iteration["messages"], shift_ns, named)
    return overlapped_start


def _shifts(ranks: list[Mapping]) -> list[int]:
    """Each rank's clock offset from rank 0's (ns).  Ranks on rank 0's host share its clock:
    no shift (a barrier's exit skew on a busy host is milliseconds, the clock's error none).
    A rank of another host is shifted by its host's median reading after the barrier against
    rank 0's; without readings, by nothing (wall clock)."""
    clocks = [rank.get("clock_s") for rank in ranks]
    if not ranks or any(clock is None for clock in clocks):
        return [0] * len(ranks)
    host_of = [rank.get("host") for rank in ranks]
    offsets = {host: statistics.median(_ns(c) - _ns(clocks[0]) for c, h in zip(clocks, host_of) if h == host)
               for host in set(host_of)}
    offsets[host_of[0]] = 0
    return [int(offsets[host]) for host in host_of]


def measured(record: Mapping, ranks: list[Mapping]) -> dict:
    """The trace of a finished run's ranks (without the model; `with_model` adds it)."""
    events = Events()
    ranks = sorted(ranks, key=lambda rank: int(rank["rank"]))
    chosen = chosen_iterations(ranks)
    starts = [_rank_events(events, rank, shift, chosen) for rank, shift in zip(ranks, _shifts(ranks))]
    spans = [e["ts"] for e in events.items if e["ph"] == "X"]
    origin = min(spans) if spans else 0
    return {"traceEvents": events.written(origin), "displayTimeUnit": "ms",
            "otherData": {"run_id": record.get("run_id"), "scheme": record.get("framework_label"),
                          "mode": record.get("mode"), "model": record.get("model"),
                          "world_size": record.get("world_size"), "batch_per_worker": record.get("batch_per_worker"),
                          "profile_iterations": {kind: index + 1 for kind, index in chosen.items()},
                          "clock": "barrier" if all(r.get("clock_s") is not None for r in ranks) else "wall clock",
                          "model_start_us": round(((starts[0] if starts and starts[0] is not None else origin)
                                                   - origin) / 1000, 3)}}


def model_events(prediction: Mapping, pid: int, start_us: float) -> list[dict]:
    """The model's schedule of the iteration (a prediction's ``timeline`` and ``phases``) as
    the process `pid`, starting at `start_us`."""
    timeline, phases = prediction.get("timeline") or {}, prediction.get("phases") or {}
    events, origin = Events(), _ns(start_us / 1e6)
    events.meta(pid, "process_name", MODEL_PROCESS)
    events.meta(pid, "process_sort_index", pid)
    events.meta(pid, "thread_name", "compute", COMPUTE_THREAD)
    backward = (origin + _ns(timeline.get("backward_start", 0.0)), origin + _ns(timeline.get("backward_end", 0.0)))
    end = origin + _ns(timeline.get("iteration_end", 0.0))
    span = events.slice(pid, COMPUTE_THREAD, "iteration (predicted)", origin, max(end, backward[1]), "iteration",
                        {"ms": round((max(end, backward[1]) - origin) / 1e6, 3)})
    at = origin
    for phase in ("io", "h2d", "forward"):
        at = events.slice(pid, COMPUTE_THREAD, phase, at, at + _ns(phases.get(phase) or 0.0), "phase", within=span)[1]
    backward = events.slice(pid, COMPUTE_THREAD, "backward", backward[0], backward[1], "phase", within=span)
    for layer, first, last in timeline.get("layers") or []:
        events.slice(pid, COMPUTE_THREAD, layer, origin + _ns(first), origin + _ns(last), "layer",
                     {"source": prediction.get("layer_source")}, within=backward)
    update_start = span[1] - _ns(phases.get("update") or 0.0)
    if update_start > backward[1]:
        events.slice(pid, COMPUTE_THREAD, "exposed communication", backward[1], update_start, "phase", within=span)
    events.slice(pid, COMPUTE_THREAD, "update", max(update_start, backward[1]), span[1], "phase", within=span)
    transfers = [[label, (origin + _ns(first)) / 1e9, (origin + _ns(last)) / 1e9, nbytes]
                 for first, last, nbytes, label in timeline.get("transfers") or []]
    _message_slices(events, pid, transfers, 0, set(), "transfers")
    return events.written(0)


def with_model(trace: dict, prediction: Mapping | None) -> dict:
    """`trace` with its model process replaced by `prediction`'s schedule (removed for None)."""
    pids = {e["pid"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name" and e["args"]["name"] == MODEL_PROCESS}
    kept = [e for e in trace["traceEvents"] if e["pid"] not in pids]
    if prediction is not None and (prediction.get("timeline") or {}).get("layers") is not None:
        pid = max((e["pid"] for e in kept), default=0) + 1
        kept += model_events(prediction, pid, float(trace.get("otherData", {}).get("model_start_us") or 0.0))
    return {**trace, "traceEvents": kept}


# --------------------------------------------------------------------------- files

def write(path: str | Path, trace: dict) -> Path:
    write_json_atomic(Path(path), trace)
    return Path(path)


def read(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def update_model_process(out_dir: str | Path, predictions: Iterable[Mapping]) -> list[str]:
    """Write each prediction's schedule into its run's trace (`runs/<id>/trace.json`, where
    the run wrote one).  Returns what could not be written (a full disk, a damaged trace), one
    line each: a trace is never worth a measurement or a report."""
    problems_found = []
    for item in predictions:
        path = Path(out_dir) / "runs" / str(item["run_id"]) / TRACE_FILE
        if not path.exists():
            continue
        prediction = item.get("prediction")
        prediction = None if prediction is None else {**prediction, "phases": item.get("phases") or {}}
        try:
            write(path, with_model(read(path), prediction))
        except (OSError, ValueError, KeyError) as error:
            problems_found.append(f"{path}: the model's schedule not written: {type(error).__name__}: {error}")
    return problems_found


# --------------------------------------------------------------------------- checking

def problems(trace: Mapping) -> list[str]:
    """What a Trace Event Format consumer would reject or misdraw: events without the keys
    their phase needs, negative or non-finite times, slices on one thread that overlap without
    nesting, a process without a name."""
    found, named = [], set()
    threads: dict[tuple, list[tuple[float, float, str]]] = {}
    for event in trace.get("traceEvents", []):
        ph = event.get("ph")
        if ph == "M":
            if event.get("name") == "process_name":
                named.add(event.get("pid"))
            continue
        if ph != "X" or not {"name", "pid", "tid", "ts", "dur"} <= set(event):
            found.append(f"event without ph X and name, pid, tid, ts, dur: {event}")
            continue
        if not (math.isfinite(event["ts"]) and math.isfinite(event["dur"])) or event["dur"] < 0:
            found.append(f"{event['name']}: ts {event['ts']} dur {event['dur']}")
            continue
        threads.setdefault((event["pid"], event["tid"]), []).append(
            (event["ts"], event["ts"] + event["dur"], event["name"]))
    for (pid, tid), spans in threads.items():
        if pid not in named:
            found.append(f"process {pid} has no process_name")
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + 1e-3:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-3:
                found.append(f"pid {pid} tid {tid}: {name} [{start}, {end}] overlaps "
                             f"{stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] without nesting")
            stack.append((start, end, name))
    return found


# --------------------------------------------------------------------------- dlcompare trace

VIEWER_HINT = "open https://ui.perfetto.dev and drop the file on it (or chrome://tracing, Load)"


def traces_in(folder: Path) -> list[Path]:
    """The traces of a campaign folder's runs, or the one of a run folder."""
    if (folder / TRACE_FILE).exists():
        return [folder / TRACE_FILE]
    return sorted((folder / "runs").glob(f"*/{TRACE_FILE}"))


def find_run(paths: list[Path], run: str) -> Path:
    """The trace of the run whose id is `run`, else the one whose id contains it; ValueError
    naming what is there when none or several do."""
    exact = [p for p in paths if p.parent.name == run]
    found = exact or [p for p in paths if run in p.parent.name]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ValueError(f"no run with a trace matches {run!r} (runs with one: "
                         f"{listed([p.parent.name for p in paths]) or 'none'})")
    raise ValueError(f"{run!r} matches {len(found)} runs: {listed([p.parent.name for p in found])}; "
                     "give more of the run id")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="dlcompare trace", description=(
        "The path of a run's trace (runs/<id>/trace.json: every rank's profile iterations and "
        "messages, and the model's schedule of the same iteration, in the Trace Event Format that "
        "Perfetto and chrome://tracing open); without RUN, every run's."))
    parser.add_argument("folder", metavar="DIR", help="a campaign's --out folder, or one run's folder")
    parser.add_argument("run", nargs="?", metavar="RUN", help="a run id, or a part of one that names one run")
    parser.add_argument("--open", action="store_true", help="also print how to open it in a trace viewer")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a trace breaks the format's rules (`problems`: keys, times, nesting)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        return fail(f"{folder}: no such folder")
    paths = traces_in(folder)
    if not paths:
        return fail(f"{folder}: no run here has a trace ({TRACE_FILE} in runs/<id>/; "
                    "each successful run writes one)")
    try:
        paths = [find_run(paths, args.run)] if args.run else paths
    except ValueError as error:
        return fail(error)
    broken = 0
    for path in paths:
        print(path)
        if args.check:
            try:
                found = problems(read(path))
            except (OSError, ValueError) as error:
                found = [f"unreadable: {error}"]
            for problem in found[:5]:
                print(f"  {problem}")
            broken += bool(found)
    if args.open:
        print(VIEWER_HINT)
    return fail(f"{broken} of {len(paths)} traces break the format's rules", EXIT_FAILED) if broken else 0


if __name__ == "__main__":
    sys.exit(main())
