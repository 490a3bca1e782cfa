"""The performance model applied: a prediction beside every stored run, and what-if questions.

Per stored run (`predict_record`, `refresh_predictions`)
---------------------------------------------------------
Inputs, all from the campaign:

- compute: the run's own profile phases (io, h2d, forward, backward, update; measured with
  communication separated from backward) and when each layer's gradient is final
  (``extra["layer_backward_s"]``: hooks where the framework allows, else the measured backward
  split by FLOPs, `perfmodel.split_backward_by_flops`);
- gradient bytes per tensor from `models/` (send order: reverse of parameter order);
- the scheme: ``extra["comm_scheme"]`` as the adapter describes it (`Trainer.comm_scheme`),
  else assumed (whole gradient after backward; push/pull when the run had servers);
- the communication cost: the campaign's calibration for the run's framework (or transport)
  and world size (`analysis.calibration.lookup`); without one, the run's own measured
  communication phase spread over the bytes (alpha = 0), which still predicts how the scheme
  overlaps it but not what it costs ("measured comm" basis).

The model then predicts the iteration (`perfmodel.predict`), the communication phase as the
separated profile runs it, the exposed communication and the schedule of transfers (kept in
``extra["prediction"]["timeline"]`` for the report's overlap timeline).  The measured I/O phase
is the main loop's wait for a batch, i.e. already the exposed I/O, so it is added as it is.
The error is (predicted - measured) / measured, measured = the median iteration time of the
throughput mode (not the profile).

Also, where the campaign has the one-worker run of the same framework, model and batch,
``from_single_worker_s``: the prediction from that profile instead of the run's own, i.e. what
the what-if CLI would have said.  On a CPU its compute is scaled by the ratio of intra-op
threads (N processes share the cores), an assumption stated in the record.

What-if (`python -m analysis.predict`)
--------------------------------------
::

    python -m analysis.predict --from DIR --model resnet50 --nodes 2,4,8,16 \\
        --bandwidth 10Gbit,56Gbit,100Gbit --latency 5us,50us

For every framework with a stored one-worker run of the model, its own scheme on its own
profile, and a catalogue of schemes (no overlap, WFBP, MG-WFBP-style merging, buckets, fusion,
parameter server) on a reference profile, at every node count x bandwidth x latency: iteration
time, exposed communication, speedup S(N) = N t(1) / t(N) and efficiency E = S / N, with
N = nodes x workers per node, alpha = latency, beta = 1 / bandwidth, gamma from the
calibration.  Prints a table, writes CSV, Markdown and an SVG plot.  Run from any Python 3: the
command moves itself into the launcher's environment first, like `analysis.report`.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.cli import OneLineParser, fail
from core.envs import reexec_in_host_env

if __name__ == "__main__":  # `python3 -m analysis.predict` from any Python: the store reads into pandas
    reexec_in_host_env("analysis.predict", sys.argv[1:])

from analysis import perfmodel as pm  # noqa: E402
from analysis.calibration import CalibrationFit, lookup  # noqa: E402
from analysis.store import ResultStore, StoreError  # noqa: E402
from analysis.units import (UnitError, format_bandwidth, format_latency, items,  # noqa: E402
                            parse_bandwidth, parse_counts, parse_latency)
from models import UnknownModel, get_model  # noqa: E402

BASIS_SINGLE = "single worker"
BASIS_MEASURED = "measured comm (no calibration)"


class PredictError(ValueError):
    """Bad input for the what-if CLI; the message is one line."""


# --------------------------------------------------------------------------- inputs

@lru_cache(maxsize=32)
def _model_tensors(model: str) -> tuple[tuple[str, str, int], ...] | None:
    """(tensor, layer, bytes) in send order (reverse parameter order); None if unknown."""
    try:
        spec = get_model(model)
    except UnknownModel:  # an unknown model gets no prediction, not a crash
        return None
    out = []
    for name, shape in reversed(list(spec.parameter_shapes().items())):
        out.append((name, name.rsplit(".", 1)[0], 4 * math.prod(shape)))
    return tuple(out)


@lru_cache(maxsize=32)
def _model_layer_rows(model: str) -> tuple[tuple[str, int, bool], ...]:
    return tuple((row.name, row.flops, row.params > 0) for row in get_model(model).layer_table())


def measured_phases(record: dict) -> dict[str, float]:
    return {p["phase"]: float(p["measured_s"]) for p in record.get("phases") or []
            if p.get("measured_s") is not None and not math.isnan(float(p["measured_s"]))}


COMPUTE_PHASES = ("h2d", "forward", "backward", "update")


def compute_phases(record: dict) -> dict[str, float]:
    """The compute phases the model starts from: the slowest rank's own profile where the
    worker kept each rank's (``extra["rank_phases_s"]``; a synchronous iteration waits for the
    rank with the most compute, and per-phase maxima over ranks would add up the slow
    phases of different ranks), else the record's phases.  `profile_from_record` then
    stretches forward and backward to ``extra["sync_compute_s"]`` where the worker measured
    it: per profile iteration the slowest rank's compute, the mean over iterations (which
    rank is slowest changes from round to round on a busy machine, and every round waits for
    it)."""
    phases = measured_phases(record)
    ranks = (record.get("extra") or {}).get("rank_phases_s")
    if isinstance(ranks, list) and ranks and all(isinstance(r, dict) for r in ranks):
        usable = [r for r in ranks if all(isinstance(r.get(p), (int, float)) for p in ("forward", "backward"))]
        if usable:
            slowest = max(usable, key=lambda r: sum(float(r.get(p) or 0.0) for p in COMPUTE_PHASES))
            phases.update({p: float(v) for p, v in slowest.items() if isinstance(v, (int, float))})
    return phases


def layer_backward(record: dict, backward: float) -> tuple[list[tuple[str, float]], str] | None:
    """The run's per-layer backward times (backward order) summing to `backward`, and their
    source; the FLOP split when the record has none usable."""
    tensors = _model_tensors(record.get("model") or "")
    if tensors is None:
        return None
    layers = {layer for _, layer, _ in tensors}
    extra = record.get("extra") or {}
    stored = extra.get("layer_backward_s")
    if isinstance(stored, list) and stored and {str(item[0]) for item in stored} == layers:
        total = sum(float(t) for _, t in stored)
        scale = backward / total if total > 0 else 0.0
        return [(str(name), float(t) * scale) for name, t in stored], str(extra.get("layer_backward_source", "hooks"))
    rows = _model_layer_rows(record["model"])
    return pm.split_backward_by_flops(backward, rows), "flop-share (analysis)"


def profile_from_record(record: dict) -> tuple[pm.Profile, str] | None:
    """The model's Profile of one run (compute phases, gradients with ready times), and the
    per-layer source; None when the run lacks forward/backward or its model is unknown."""
    phases = compute_phases(record)
    if "forward" not in phases or "backward" not in phases:
        return None
    split = layer_backward(record, phases["backward"])
    tensors = _model_tensors(record.get("model") or "")
    if split is None or tensors is None:
        return None
    layer_times, source = split
    forward, backward, update = phases["forward"], phases["backward"], phases.get("update", 0.0)
    io, h2d = phases.get("io", 0.0), phases.get("h2d", 0.0)
    scale = 1.0
    synchronous = (record.get("extra") or {}).get("sync_compute_s")
    if isinstance(synchronous, dict) and isinstance(synchronous.get("before_comm"), (int, float)) \
            and forward + backward > 0:
        # the round's slowest rank: compute stretched to the per-iteration maximum over ranks
        scale = max(0.0, float(synchronous["before_comm"]) - io - h2d) / (forward + backward)
        forward, backward = forward * scale, backward * scale
        update = float(synchronous.get("update", update))
    ready, total = {}, 0.0
    for name, t in layer_times:
        total += t * scale
        ready[name] = total
    grads = tuple(pm.Grad(name, layer, nbytes, ready.get(layer, backward)) for name, layer, nbytes in tensors)
    profile = pm.Profile(io, h2d, forward, backward, update, grads, prefetch=False)
    return profile, source


def scheme_of(record: dict) -> tuple[pm.Scheme, bool]:
    """The run's scheme (from the adapter) and whether it had to be assumed."""
    servers = int(record.get("servers") or 0)
    described = (record.get("extra") or {}).get("comm_scheme")
    if isinstance(described, dict):
        try:
            scheme = pm.Scheme.from_dict(described)
            if scheme.algorithm == "ps" and servers and not described.get("servers"):
                scheme = pm.Scheme.from_dict({**described, "servers": servers})
            return scheme, False
        except (TypeError, ValueError):
            pass
    if servers > 0:
        return pm.Scheme("assumed: push/pull after backward", algorithm="ps", servers=servers), True
    return pm.Scheme("assumed: whole gradient after backward"), True


def _transport(record: dict) -> str | None:
    described = (record.get("extra") or {}).get("comm_scheme") or {}
    return described.get("transport") if isinstance(described, dict) else None


# --------------------------------------------------------------------------- one run

def comm_cost(record: dict, scheme: pm.Scheme, profile: pm.Profile, fits: list[CalibrationFit]):
    """(n -> seconds, basis, calibration facts) for the run's communication."""
    p = int(record.get("world_size") or 1)
    servers = max(1, scheme.servers)
    if p == 1 and scheme.algorithm != "ps":
        return (lambda n: 0.0), BASIS_SINGLE, None
    found = lookup(fits, framework=record.get("framework"), mode=record.get("mode"),
                   transport=_transport(record), world_size=p,
                   nodes=int(record.get("nodes") or 1), device_kind=record.get("device_kind"),
                   bandwidth=record.get("bandwidth"), latency=record.get("latency"))
    if found is not None:
        fit, how = found
        facts = {"framework": fit.framework, "transport": fit.transport, "world_size": fit.world_size,
                 "algorithm": scheme.algorithm, "alpha_s": fit.alpha_s, "beta_s_per_byte": fit.beta_s_per_byte,
                 "gamma_s_per_byte": fit.gamma_s_per_byte, "contention": fit.contention or 0.0,
                 "transfer_contention": fit.transfer_contention or 0.0}
        return pm.comm_time_function(scheme.algorithm, p, fit.cost, servers), how, facts
    measured = _measured_comm(record)
    sent = sum(m.nbytes for m in scheme.messages(list(profile.grads), lambda n: 0.0, separate=True))
    if measured is None or sent <= 0:
        return (lambda n: 0.0), "no communication data", None
    per_byte = measured / sent
    return (lambda n: n * per_byte if n > 0 else 0.0), BASIS_MEASURED, {"beta_eff_s_per_byte": per_byte}


def _measured_comm(record: dict) -> float | None:
    """The exchange without waiting for other ranks: timed from the last rank's arrival
    (``sync_compute_s["comm"]``, the same statistic as the compute), else for older records
    the per-rank minimum (a faster rank's comm includes its wait for the slowest), else the
    record's phase."""
    extra = record.get("extra") or {}
    exchange = (extra.get("sync_compute_s") or {}).get("comm")
    if exchange is not None:
        return float(exchange)
    per_rank = extra.get("rank_comm_s")
    if isinstance(per_rank, list) and per_rank:
        return float(min(per_rank))
    return measured_phases(record).get("comm")


def _timeline(profile: pm.Profile, prediction: pm.Prediction, layer_times) -> dict:
    """Backward per layer and the transfers beneath it, times from the iteration's start."""
    t0 = prediction.phases["io"] + profile.h2d + profile.forward
    layers, start = [], 0.0
    for name, t in layer_times:
        layers.append([name, t0 + start, t0 + start + t])
        start += t
    transfers = []
    for tr in prediction.transfers:
        first = tr.members[0].rsplit(".", 1)[0] if tr.members else ""
        layer_names = list(dict.fromkeys(m.rsplit(".", 1)[0] for m in tr.members))
        label = first if len(layer_names) == 1 else f"{first}+{len(layer_names) - 1}"
        transfers.append([t0 + tr.start, t0 + tr.end, tr.nbytes, label])
    return {"backward_start": t0, "backward_end": t0 + profile.backward,
            "iteration_end": prediction.iter_time, "layers": layers, "transfers": transfers}


def predict_record(record: dict, fits: list[CalibrationFit], baseline: dict | None = None) -> dict | None:
    """The model's prediction for one stored record (see the module docstring), as the item
    `ResultStore.set_predictions` takes; None when the run cannot be predicted (failed, no
    profile phases, unknown model)."""
    if record.get("status") != "ok":
        return None
    built = profile_from_record(record)
    if built is None:
        return None
    profile, layer_source = built
    scheme, assumed = scheme_of(record)
    comm_time, basis, facts = comm_cost(record, scheme, profile, fits)
    shares = ((facts or {}).get("contention", 0.0), (facts or {}).get("transfer_contention", 0.0))
    prediction = pm.predict(profile, scheme, comm_time, *shares)
    measured = record.get("iter_time_median")
    error = None if not measured else (prediction.iter_time - measured) / measured
    layer_times = layer_backward(record, profile.backward)[0]  # rescaled to the profile's backward
    info = {"basis": basis, "scheme": {**scheme.as_dict(), "assumed": assumed}, "calibration": facts,
            "layer_source": layer_source, "comm_total_s": prediction.comm_total,
            "comm_exposed_s": prediction.comm_exposed, "backward_comm_s": prediction.backward_comm,
            "hidden_fraction": prediction.hidden_fraction, "timeline": _timeline(profile, prediction, layer_times)}
    if baseline is not None and int(record.get("world_size") or 1) > 1:
        info.update(_from_single_worker(record, baseline, scheme, comm_time, shares))
    return {"run_id": record["run_id"], "predicted_iter_time": prediction.iter_time,
            "prediction_error": error, "phases": prediction.phases, "prediction": info}


def _from_single_worker(record: dict, baseline: dict, scheme: pm.Scheme, comm_time,
                        shares: tuple[float, float] = (0.0, 0.0)) -> dict:
    built = profile_from_record(baseline)
    if built is None:
        return {}
    profile = built[0]
    factor = 1.0
    if record.get("device_kind") == "cpu":
        threads_one, threads_n = baseline.get("threads_per_worker"), record.get("threads_per_worker")
        if threads_one and threads_n:
            factor = float(threads_one) / float(threads_n)
    t = pm.predict(profile.scaled(factor), scheme, comm_time, *shares).iter_time
    measured = record.get("iter_time_median")
    return {"from_single_worker_s": t, "from_single_worker_error": (t - measured) / measured if measured else None,
            "from_single_worker_compute_factor": factor, "from_single_worker_run": baseline["run_id"]}


def _baseline_key(record: dict) -> tuple:
    return (record.get("framework"), record.get("mode"), record.get("model"), record.get("batch_per_worker"),
            record.get("device_kind"))


def predict_records(records: list[dict], fits: list[CalibrationFit]) -> list[dict]:
    """Predictions for every predictable record (see `predict_record`)."""
    baselines = {}
    for record in records:
        if record.get("status") == "ok" and int(record.get("world_size") or 0) == 1:
            baselines.setdefault(_baseline_key(record), record)
    out = []
    for record in records:
        item = predict_record(record, fits, baselines.get(_baseline_key(record)))
        if item is not None:
            out.append(item)
    return out


def refresh_predictions(store, run_ids: set[str] | None = None) -> list[dict]:
    """Recompute the model's prediction of the stored runs (all, or `run_ids`) with the
    campaign's current calibration and write it back (`ResultStore.set_predictions`)."""
    records = store.records()
    fits = store.calibration_fits()
    predictions = predict_records(records, fits)
    if run_ids is not None:
        predictions = [p for p in predictions if p["run_id"] in run_ids]
    store.set_predictions(predictions)
    return predictions


def predict_stored(store, record: dict, console=None) -> dict | None:
    """After a run is stored: attach the model's prediction to it.  Never raises: a model
    failure is reported (console) and the campaign goes on; the report recomputes anyway."""
    if record.get("status") != "ok":
        return None
    try:
        found = refresh_predictions(store, {record["run_id"]})
    except Exception as error:  # noqa: BLE001 - the measurement matters more than its model
        if console is not None:
            console.print(f"[yellow]{record['run_id']}: no prediction: {type(error).__name__}: {error}[/yellow]")
        return None
    return found[0] if found else None


# --------------------------------------------------------------------------- what-if

CATALOGUE: dict[str, pm.Scheme] = {
    "no-overlap": pm.Scheme("no overlap: whole gradient after backward"),
    "wfbp": pm.Scheme("WFBP: per layer during backward", overlap=True, granularity="layer"),
    "mgwfbp": pm.Scheme("MG-WFBP-style merged layers", overlap=True, granularity="layer", merge="greedy"),
    "buckets": pm.Scheme("25 MB buckets (DDP-like)", overlap=True, granularity="bucket",
                         bucket_bytes=25 * 2 ** 20, first_bucket_bytes=2 ** 20),
    "fusion": pm.Scheme("Horovod-like fusion: 1 ms cycles, 128 MB buffer", overlap=True, granularity="tensor",
                        merge="cycle", cycle_s=1e-3, bucket_bytes=128 * 2 ** 20),
    "ps": pm.Scheme("parameter server, per layer", overlap=True, granularity="layer", algorithm="ps", servers=1),
}


@dataclass(frozen=True)
class Candidate:
    """One scheme of the what-if: its name, profile, where the compute came from, gamma."""

    name: str
    scheme: pm.Scheme
    profile: pm.Profile
    source: str
    fit: CalibrationFit | None


def candidates(records: list[dict], fits: list[CalibrationFit], model: str, batch: int | None,
               schemes: list[str], reference: str | None, servers: int | None,
               algorithm: str) -> list[Candidate]:
    """The schemes to evaluate, each with the one-worker profile it runs on."""
    singles = [r for r in records if r.get("status") == "ok" and r.get("model") == model
               and int(r.get("world_size") or 0) == 1 and (batch is None or r.get("batch_per_worker") == batch)]
    if not singles:
        models = sorted({r.get("model") for r in records if r.get("status") == "ok"
                         and int(r.get("world_size") or 0) == 1})
        where = f" with batch {batch}" if batch is not None else ""
        raise PredictError(f"no successful one-worker run of {model}{where} stored "
                           f"(one-worker runs stored for: {', '.join(models) or 'none'})")
    chosen: dict[tuple, dict] = {}
    for r in sorted(singles, key=lambda r: (-(r.get("batch_per_worker") or 0), r.get("started_at") or "")):
        chosen.setdefault((r.get("framework_label") or r.get("framework"), r.get("mode")), r)
    out = []
    by_label = {}
    for (label, mode), record in sorted(chosen.items(), key=lambda item: (str(item[0][0]), str(item[0][1]))):
        built = profile_from_record(record)
        if built is None:
            continue
        scheme, assumed = scheme_of(_with_scheme_from_campaign(record, records))
        if servers is not None and scheme.algorithm == "ps":
            scheme = pm.Scheme.from_dict({**scheme.as_dict(), "servers": servers})
        found = lookup(fits, framework=record.get("framework"), mode=record.get("mode"),
                       transport=_transport(record), world_size=2, nodes=1,
                       device_kind=record.get("device_kind"))
        name = f"{label}" + (f" ({mode})" if mode and str(mode).lower() not in str(label).lower() else "")
        if assumed:
            name += " [assumed scheme]"
        source = f"{label} b{record.get('batch_per_worker')}"
        candidate = Candidate(name, scheme, built[0], source, found[0] if found else None)
        by_label[str(label).lower()] = candidate
        if "stored" in schemes:
            out.append(candidate)
    if not by_label:
        raise PredictError(f"the one-worker runs of {model} have no forward/backward profile to predict from")
    if reference is not None:
        ref = by_label.get(reference.lower())
        if ref is None:
            raise PredictError(f"--profile {reference!r} is not among the stored one-worker runs "
                               f"({', '.join(sorted(by_label))})")
    else:
        ref = next(iter(by_label.values()))
    for key in schemes:
        if key == "stored":
            continue
        scheme = CATALOGUE[key]
        if algorithm != "ring" and scheme.algorithm != "ps":
            scheme = pm.Scheme.from_dict({**scheme.as_dict(), "algorithm": algorithm,
                                          "name": f"{scheme.name}, {algorithm}"})
        if key == "ps" and servers is not None:
            scheme = pm.Scheme.from_dict({**scheme.as_dict(), "servers": servers,
                                          "name": f"parameter server x{servers}, per layer"})
        out.append(Candidate(scheme.name, scheme, ref.profile, ref.source, ref.fit))
    return out


def _with_scheme_from_campaign(record: dict, records: list[dict]) -> dict:
    """A one-worker record without a scheme borrows it from a multi-worker run of the same
    framework and mode (older records)."""
    if (record.get("extra") or {}).get("comm_scheme"):
        return record
    for other in records:
        if (other.get("framework"), other.get("mode")) == (record.get("framework"), record.get("mode")) \
                and (other.get("extra") or {}).get("comm_scheme"):
            return {**record, "extra": {**(record.get("extra") or {}), "comm_scheme": other["extra"]["comm_scheme"]}}
    return record


def whatif_grid(candidates_: list[Candidate], nodes: list[int], bandwidths: list[float | None],
                latencies: list[float | None], workers_per_node: int = 1) -> list[dict]:
    """Rows: scheme x nodes x bandwidth x latency with t(N), speedup and efficiency.

    alpha = latency, beta = 1 / bandwidth; None takes the candidate's calibrated value;
    gamma and the contention shares kappa, kappa_c are the calibration's (0 without one).
    """
    rows = []
    for cand in candidates_:
        t_one = pm.single_worker_prediction(cand.profile).iter_time
        calibrated = cand.fit.cost if cand.fit is not None else None
        for bandwidth in bandwidths:
            for latency in latencies:
                if calibrated is None and (bandwidth is None or latency is None):
                    raise PredictError(f"no calibration stored for {cand.source.rsplit(' ', 1)[0]}: "
                                       "give --bandwidth and --latency (or run python -m launchers.calibrate)")
                cost = pm.LinkCost(alpha=latency if latency is not None else calibrated.alpha,
                                   beta=1.0 / bandwidth if bandwidth is not None else calibrated.beta,
                                   gamma=calibrated.gamma if calibrated is not None else 0.0)
                for n in nodes:
                    p = n * workers_per_node
                    comm = pm.comm_time_function(cand.scheme.algorithm, p, cost, max(1, cand.scheme.servers))
                    shares = cand.fit.shares if cand.fit is not None else (0.0, 0.0)
                    prediction = pm.predict(cand.profile, cand.scheme, comm, *shares) if p > 1 else \
                        pm.single_worker_prediction(cand.profile)
                    s = pm.speedup(t_one, prediction.iter_time, p)
                    rows.append({"scheme": cand.name, "profile": cand.source, "nodes": n, "workers": p,
                                 "bandwidth": format_bandwidth(1 / cost.beta) if cost.beta > 0 else "inf",
                                 "latency": format_latency(cost.alpha) if cost.alpha > 0 else "0",
                                 "iter_ms": prediction.iter_time * 1e3, "t1_ms": t_one * 1e3,
                                 "comm_exposed_ms": prediction.comm_exposed * 1e3,
                                 "speedup": s, "efficiency": pm.efficiency(s, p)})
    return rows


COLUMNS = ("scheme", "profile", "nodes", "workers", "bandwidth", "latency", "iter_ms", "t1_ms",
           "comm_exposed_ms", "speedup", "efficiency")
FORMATS = {"iter_ms": ".2f", "t1_ms": ".2f", "comm_exposed_ms": ".2f", "speedup": ".2f", "efficiency": ".3f"}


def _cells(row: dict) -> list[str]:
    return [format(row[c], FORMATS[c]) if c in FORMATS else str(row[c]) for c in COLUMNS]


def text_table(rows: list[dict]) -> str:
    cells = [list(COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    numeric = {"nodes", "workers", *FORMATS}
    lines = []
    for k, line in enumerate(cells):
        lines.append("  ".join(cell.rjust(w) if COLUMNS[i] in numeric else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row[k] for k in COLUMNS})
    return buffer.getvalue()


PALETTE = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494",
           "#ece133", "#56b4e9")


def svg_plot(rows: list[dict], title: str) -> str:
    """Efficiency against workers, one panel per bandwidth x latency, a line per scheme (a
    hand-written SVG: no plotting library, so the CLI stays fast)."""
    bandwidths = list(dict.fromkeys(r["bandwidth"] for r in rows))
    latencies = list(dict.fromkeys(r["latency"] for r in rows))
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    workers = sorted({r["workers"] for r in rows})
    pw, ph, ml, mt, gap = 300, 210, 52, 34, 56
    legend_h = 18 * len(schemes) + 16
    width = ml + len(latencies) * (pw + gap) + 10
    height = mt + 20 + len(bandwidths) * (ph + gap + 24) + legend_h
    top = max(1.0, max((r["efficiency"] for r in rows), default=1.0))
    low = min((r["efficiency"] for r in rows), default=0.0)
    low = 0.0 if low < 0.5 else math.floor((low - 0.005) * 20) / 20  # zoom in when all scale well
    span = max(top - low, 1e-9)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>']

    def x_of(w, x0):
        if len(workers) == 1:
            return x0 + pw / 2
        return x0 + pw * (math.log2(w) - math.log2(workers[0])) / (math.log2(workers[-1]) - math.log2(workers[0]))

    for i, bandwidth in enumerate(bandwidths):
        for j, latency in enumerate(latencies):
            x0, y0 = ml + j * (pw + gap), mt + 20 + i * (ph + gap + 24)
            out.append(f'<text x="{x0 + pw / 2}" y="{y0 - 6}" text-anchor="middle">'
                       f'{html.escape(bandwidth)}, latency {html.escape(latency)}</text>')
            out.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
            for k in range(5):
                value = low + span * k / 4
                y = y0 + ph - ph * (value - low) / span
                out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="#eee"/>')
                out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{value:.2f}</text>')
            for w in workers:
                out.append(f'<text x="{x_of(w, x0):.1f}" y="{y0 + ph + 14}" text-anchor="middle">{w}</text>')
            for s, scheme in enumerate(schemes):
                points = sorted((r["workers"], r["efficiency"]) for r in rows
                                if r["scheme"] == scheme and r["bandwidth"] == bandwidth and r["latency"] == latency)
                coords = " ".join(f"{x_of(w, x0):.1f},{y0 + ph - ph * (min(e, top) - low) / span:.1f}"
                                  for w, e in points)
                color = PALETTE[s % len(PALETTE)]
                out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
                for w, e in points:
                    out.append(f'<circle cx="{x_of(w, x0):.1f}" cy="{y0 + ph - ph * (min(e, top) - low) / span:.1f}" '
                               f'r="2.5" fill="{color}"/>')
            if j == 0:
                out.append(f'<text x="{x0 - 40}" y="{y0 + ph / 2}" transform="rotate(-90 {x0 - 40} {y0 + ph / 2})" '
                           f'text-anchor="middle">efficiency E = S/N</text>')
            out.append(f'<text x="{x0 + pw / 2}" y="{y0 + ph + 27}" text-anchor="middle">workers N</text>')
    ly = height - legend_h + 8
    for s, scheme in enumerate(schemes):
        color = PALETTE[s % len(PALETTE)]
        out.append(f'<line x1="{ml}" y1="{ly + 18 * s}" x2="{ml + 24}" y2="{ly + 18 * s}" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{ml + 30}" y="{ly + 18 * s + 4}">{html.escape(scheme)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"



def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m analysis.predict",
        description="Predict iteration time, speedup and efficiency of each aggregation scheme at node "
                    "counts, bandwidths and latencies you do not have, from a campaign's one-worker "
                    "profile and calibration.")
    parser.add_argument("--from", dest="source", required=True, metavar="DIR",
                        help="campaign folder holding results.sqlite")
    parser.add_argument("--model", required=True, help="model whose one-worker profile to use")
    parser.add_argument("--nodes", default="2,4,8,16", help="node counts (default: %(default)s)")
    parser.add_argument("--workers-per-node", default="1", help="workers per node (default: %(default)s)")
    parser.add_argument("--bandwidth", default=None,
                        help="link bandwidths, e.g. 10Gbit,56Gbit,100Gbit or 1.25GB/s (default: calibrated)")
    parser.add_argument("--latency", default=None, help="link latencies, e.g. 5us,50us (default: calibrated)")
    parser.add_argument("--batch", default=None, help="per-worker batch of the profile (default: the largest stored)")
    parser.add_argument("--schemes", default="all",
                        help="'stored' (each framework's own), 'all' (stored and catalogue), or a comma list of "
                             f"stored,{','.join(CATALOGUE)} (default: %(default)s)")
    parser.add_argument("--profile", default=None,
                        help="framework label whose profile the catalogue schemes use (default: the first)")
    parser.add_argument("--ps", default=None, help="parameter servers for the ps schemes (default: as stored, or 1)")
    parser.add_argument("--algorithm", default="ring", choices=[a for a in pm.ALGORITHMS if a not in ("ps", "p2p")],
                        help="all-reduce algorithm of the catalogue schemes (default: %(default)s)")
    parser.add_argument("--out", default=None, help="folder for the CSV, Markdown and SVG (default: DIR/whatif)")
    parser.add_argument("--no-files", action="store_true", help="print the table only")
    return parser


def run(args) -> tuple[list[dict], dict[str, Path]]:
    nodes = parse_counts(args.nodes, "--nodes")
    workers_per_node = parse_counts(args.workers_per_node, "--workers-per-node")
    if len(workers_per_node) != 1:
        raise PredictError("--workers-per-node takes one number")
    bandwidths = [parse_bandwidth(b) for b in items(args.bandwidth, "--bandwidth")] if args.bandwidth else [None]
    latencies = [parse_latency(lat) for lat in items(args.latency, "--latency")] if args.latency else [None]
    batch = parse_counts(args.batch, "--batch")[0] if args.batch else None
    servers = parse_counts(args.ps, "--ps")[0] if args.ps else None
    names = items(args.schemes, "--schemes")
    if names == ["all"]:
        names = ["stored", *CATALOGUE]
    unknown = [n for n in names if n != "stored" and n not in CATALOGUE]
    if unknown:
        raise PredictError(f"unknown scheme {unknown[0]!r} (known: all, stored, {', '.join(CATALOGUE)})")
    folder = Path(args.source)
    try:
        with ResultStore.for_campaign(folder, create=False) as store:
            records = store.records()
            fits = store.calibration_fits()
    except StoreError as exc:
        raise PredictError(str(exc)) from None
    chosen = candidates(records, fits, args.model, batch, names, args.profile, servers, args.algorithm)
    rows = whatif_grid(chosen, nodes, bandwidths, latencies, workers_per_node[0])
    written = {}
    if not args.no_files:
        out = Path(args.out) if args.out else folder / "whatif"
        try:
            out.mkdir(parents=True, exist_ok=True)
            stem = f"whatif_{args.model}"
            written["csv"] = out / f"{stem}.csv"
            written["csv"].write_text(csv_text(rows), encoding="utf-8")
            written["md"] = out / f"{stem}.md"
            written["md"].write_text(f"# What-if: {args.model}\n\n{markdown_table(rows)}", encoding="utf-8")
            written["svg"] = out / f"{stem}.svg"
            written["svg"].write_text(svg_plot(rows, f"Predicted weak-scaling efficiency, {args.model}"),
                                      encoding="utf-8")
        except OSError as exc:
            raise PredictError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return rows, written


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.predict``: the what-if table (exit 2 with one line on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        rows, written = run(args)
    except (PredictError, UnitError) as exc:
        return fail(exc)
    print(text_table(rows))
    for kind, path in written.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
