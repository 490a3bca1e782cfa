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
    python -m analysis.predict --cluster-file examples/cluster.toml --model resnet50 \\
        --batch-size 32 --nodes 1,2,4,8 [--json]

``--from DIR``: for every framework with a stored one-worker run of the model, its own
scheme on its own profile, and a catalogue of schemes (no overlap, WFBP, MG-WFBP-style
merging, buckets, fusion, parameter server) on a reference profile, all N = nodes x workers
per node ranks on one link: alpha = latency, beta = 1 / bandwidth (the calibration's where
not given), gamma and the contention shares from the calibration.

``--cluster-file FILE``: a described GPU cluster (`analysis.cluster`; docs/prediction.md): the
study's schemes by their CLI names and the catalogue's, each priced on the topology its
framework uses (`perfmodel.topology_cost`: intra-node links, NICs shared by a node's
workers, per-message software cost per transport), compute from the model's FLOPs on the
device (`analysis.workload`) or from the one-worker run of the campaign its
``device.profile`` names; no CPU contention unless the file gives it.

Both print a table (or ``--json``: one JSON object per line) of iteration time, speedup
S(N) = N t(1) / t(N) and efficiency E = S / N against one worker of the same device
(weak scaling), exposed communication and the bottleneck, and write CSV, Markdown and a
PNG plot of efficiency against nodes (`analysis.whatif`).  Run from any Python 3: the
command moves itself into the launcher's environment first, like `analysis.report`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from core.cli import OneLineParser, fail
from core.envs import reexec_in_host_env

if __name__ == "__main__":  # `python3 -m analysis.predict` from any Python: the store reads into pandas
    reexec_in_host_env("analysis.predict", sys.argv[1:])

from analysis import perfmodel as pm  # noqa: E402
from analysis import whatif  # noqa: E402
from analysis.calibration import CalibrationFit, lookup  # noqa: E402
from analysis.cluster import ClusterError, ClusterSpec, load_cluster  # noqa: E402
from analysis.store import ResultStore, StoreError  # noqa: E402
from analysis.units import UnitError, items, parse_bandwidth, parse_counts, parse_latency  # noqa: E402
from analysis.whatif import CATALOGUE, Candidate, WhatIfError  # noqa: E402
from analysis.workload import flops_profile, gradients, model_layer_rows, model_tensors  # noqa: E402
from models import UnknownModel  # noqa: E402

BASIS_SINGLE = "single worker"
BASIS_MEASURED = "measured comm (no calibration)"


class PredictError(ValueError):
    """Bad input for the what-if CLI; the message is one line."""


# --------------------------------------------------------------------------- inputs

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
    tensors = model_tensors(record.get("model") or "")
    if tensors is None:
        return None
    layers = {layer for _, layer, _ in tensors}
    extra = record.get("extra") or {}
    stored = extra.get("layer_backward_s")
    if isinstance(stored, list) and stored and {str(item[0]) for item in stored} == layers:
        total = sum(float(t) for _, t in stored)
        scale = backward / total if total > 0 else 0.0
        return [(str(name), float(t) * scale) for name, t in stored], str(extra.get("layer_backward_source", "hooks"))
    rows = model_layer_rows(record["model"])
    return pm.split_backward_by_flops(backward, rows), "flop-share (analysis)"


def profile_from_record(record: dict) -> tuple[pm.Profile, str] | None:
    """The model's Profile of one run (compute phases, gradients with ready times), and the
    per-layer source; None when the run lacks forward/backward or its model is unknown."""
    phases = compute_phases(record)
    if "forward" not in phases or "backward" not in phases:
        return None
    split = layer_backward(record, phases["backward"])
    tensors = model_tensors(record.get("model") or "")
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
    grads = gradients(record["model"], [(name, t * scale) for name, t in layer_times], backward)
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

def _one_worker_runs(records: list[dict], model: str, batch: int | None) -> list[dict]:
    """Successful one-worker runs of `model` (at `batch` when given), largest batch first;
    PredictError naming what is stored when there is none."""
    singles = [r for r in records if r.get("status") == "ok" and r.get("model") == model
               and int(r.get("world_size") or 0) == 1 and (batch is None or r.get("batch_per_worker") == batch)]
    if not singles:
        models = sorted({r.get("model") for r in records if r.get("status") == "ok"
                         and int(r.get("world_size") or 0) == 1})
        where = f" with batch {batch}" if batch is not None else ""
        raise PredictError(f"no successful one-worker run of {model}{where} stored "
                           f"(one-worker runs stored for: {', '.join(models) or 'none'})")
    return sorted(singles, key=lambda r: (-(r.get("batch_per_worker") or 0), r.get("started_at") or ""))


def _stored_profiles(records: list[dict], model: str, batch: int | None) -> dict[tuple, tuple[dict, pm.Profile]]:
    """(label, mode) -> (one-worker record, its profile), one per framework and mode."""
    chosen: dict[tuple, dict] = {}
    for r in _one_worker_runs(records, model, batch):
        chosen.setdefault((r.get("framework_label") or r.get("framework"), r.get("mode")), r)
    out = {}
    for key, record in sorted(chosen.items(), key=lambda item: (str(item[0][0]), str(item[0][1]))):
        built = profile_from_record(record)
        if built is not None:
            out[key] = (record, built[0])
    if not out:
        raise PredictError(f"the one-worker runs of {model} have no forward/backward profile to predict from")
    return out


def _reference(profiles: dict[tuple, tuple[dict, pm.Profile]], reference: str | None) -> tuple[dict, pm.Profile]:
    """The profile the catalogue runs on: --profile's framework label, else the first."""
    by_label = {str(label).lower(): value for (label, _), value in profiles.items()}
    if reference is None:
        return next(iter(profiles.values()))
    if reference.lower() not in by_label:
        raise PredictError(f"--profile {reference!r} is not among the stored one-worker runs ({', '.join(by_label)})")
    return by_label[reference.lower()]


def _source(record: dict) -> str:
    return f"{record.get('framework_label') or record.get('framework')} b{record.get('batch_per_worker')}"


def candidates(records: list[dict], fits: list[CalibrationFit], model: str, batch: int | None,
               schemes: list[str], reference: str | None, servers: int | None,
               algorithm: str) -> list[Candidate]:
    """A campaign's schemes ('stored': each framework's own on its own profile; or
    'FRAMEWORK' / 'FRAMEWORK:MODE' for some of them) and the catalogue's on the reference
    profile, each on its calibrated flat link."""
    profiles = _stored_profiles(records, model, batch)
    stored = {f"{record.get('framework')}:{mode}": (record.get("framework"), mode)
              for (_, mode), (record, _) in profiles.items()}
    unknown = [name for name in schemes if name != "stored" and name not in CATALOGUE
               and not any(name in (key, framework) for key, (framework, _) in stored.items())]
    if unknown:
        raise PredictError(f"unknown scheme {unknown[0]!r} (known: all, stored, {', '.join(stored)}, "
                           f"{', '.join(CATALOGUE)})")
    out, fit_of = [], {}
    for (label, mode), (record, profile) in profiles.items():
        scheme, assumed = scheme_of(_with_scheme_from_campaign(record, records))
        if servers is not None and scheme.algorithm == "ps":
            scheme = pm.Scheme.from_dict({**scheme.as_dict(), "servers": servers})
        found = lookup(fits, framework=record.get("framework"), mode=record.get("mode"),
                       transport=_transport(record), world_size=2, nodes=1,
                       device_kind=record.get("device_kind"))
        fit_of[id(record)] = found[0] if found else None
        key = f"{record.get('framework')}:{mode}"
        if not {"stored", key, str(record.get("framework"))} & set(schemes):
            continue
        name = f"{label}" + (f" ({mode})" if mode and str(mode).lower() not in str(label).lower() else "")
        if assumed:
            name += " [assumed scheme]"
        out.append(_campaign_candidate(key, name, scheme, record, profile, fit_of[id(record)]))
    ref_record, ref_profile = _reference(profiles, reference)
    for key in schemes:
        if key in CATALOGUE:
            scheme = whatif.catalogue_scheme(key, algorithm, servers)
            out.append(_campaign_candidate(key, scheme.name, scheme, ref_record, ref_profile, fit_of[id(ref_record)]))
    return out


def _campaign_candidate(name: str, label: str, scheme: pm.Scheme, record: dict, profile: pm.Profile,
                        fit: CalibrationFit | None) -> Candidate:
    source = _source(record)
    cost = whatif.flat_link_cost(fit.cost if fit is not None else None, scheme.algorithm, max(1, scheme.servers),
                                 source.rsplit(" ", 1)[0])
    link = (1.0 / fit.cost.beta if fit is not None and fit.cost.beta > 0 else math.inf,
            fit.cost.alpha if fit is not None else 0.0)
    return Candidate(name, label, scheme, profile, source, cost, link,
                     fit.shares if fit is not None else (0.0, 0.0), record.get("batch_per_worker"))


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


def measured_jitter(record: dict) -> float | None:
    """A one-worker run's per-step jitter from the spread of its repeats
    (`perfmodel.step_jitter`: iter_time_std over the repeats' medians, of `iterations`
    steps each); None where the record lacks them or gives no valid jitter."""
    std, mean, steps = record.get("iter_time_std"), record.get("iter_time_median"), record.get("iterations")
    try:
        jitter = pm.step_jitter(float(std), float(mean), int(steps))
    except (TypeError, ValueError):
        return None
    return jitter if 0 <= jitter < 1 else None


def cluster_profile(spec: ClusterSpec, model: str, batch: int | None,
                    reference: str | None) -> tuple[pm.Profile, str, int, float | None]:
    """One worker's compute on the described device: from the campaign its device.profile
    names (the one-worker run of `model`, at `batch` when given), else from FLOPs; with the
    source, the batch it is for and the run's measured step jitter (None from FLOPs)."""
    if spec.device.profile is not None:
        try:
            with ResultStore.for_campaign(spec.device.profile, create=False) as store:
                records = store.records()
        except StoreError as exc:
            raise PredictError(f"{spec.source}: device.profile: {exc}") from None
        record, profile = _reference(_stored_profiles(records, model, batch), reference)
        return (profile, f"profile {_source(record)}", int(record.get("batch_per_worker") or 0) or batch,
                measured_jitter(record))
    if batch is None:
        raise PredictError(f"give --batch-size (per worker) or [workload] batch_per_worker in {spec.source}")
    device = spec.device
    try:
        profile = flops_profile(model, batch, device.sustained_flops, device.host_to_device, device.memory_bandwidth,
                                spec.gradient_bytes, spec.data == "synthetic")
    except UnknownModel as exc:
        raise PredictError(str(exc)) from None
    return profile, f"{device.name} {device.precision} FLOPs b{batch}", batch, None


# --------------------------------------------------------------------------- the CLI

def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m analysis.predict", renamed={"--cluster": "--cluster-file"},
        description="Predict iteration time, speedup and efficiency of each aggregation scheme at node "
                    "counts, bandwidths and latencies you do not have: from a campaign's one-worker profile "
                    "and calibration (--from), or on a GPU cluster described in a TOML file (--cluster-file).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="source", metavar="DIR", help="campaign folder holding results.sqlite")
    source.add_argument("--cluster-file", metavar="FILE",
                        help="cluster description (TOML; see examples/cluster.toml)")
    parser.add_argument("--model", default=None, help="model (--cluster-file: default the file's [workload] model)")
    parser.add_argument("--batch-size", default=None,
                        help="per-worker batch (--from: of the stored profile, default the largest)")
    parser.add_argument("--nodes", default=None,
                        help="node counts (default: --from 2,4,8,16; --cluster-file the file's)")
    parser.add_argument("--workers", default=None,
                        help="workers per node, comma list (default: --from 1; --cluster-file the file's)")
    parser.add_argument("--bandwidth", default=None,
                        help="link (--cluster-file: the NIC's) bandwidths, e.g. 10Gbit,56Gbit,100Gbit or "
                             "1.25GB/s (default: calibrated, or the file's)")
    parser.add_argument("--latency", default=None, help="link (--cluster-file: the NIC's) latencies, e.g. "
                                                        "5us,50us (default: calibrated, or the file's)")
    parser.add_argument("--frameworks", default=None,
                        help="comma list of study schemes by CLI name (" + ", ".join(whatif.STUDY_SCHEMES)
                             + "), catalogue schemes (" + ", ".join(CATALOGUE) + "), 'study', 'all', and with "
                             "--from 'stored' (each framework's own) (default: --from all; --cluster-file study)")
    parser.add_argument("--profile", default=None,
                        help="framework label whose one-worker profile the catalogue (or the cluster file's "
                             "device.profile) uses (default: the first)")
    parser.add_argument("--servers", default=None,
                        help="parameter servers of the ps schemes (default: as stored; --cluster-file the "
                             "file's, else one per node)")
    parser.add_argument("--algorithm", default="ring", choices=[a for a in pm.ALGORITHMS if a not in ("ps", "p2p")],
                        help="all-reduce algorithm of the catalogue schemes (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per row instead of the table (no files unless --out)")
    parser.add_argument("--out", default=None,
                        help="folder for the CSV, Markdown and PNG (default: DIR/whatif, or results/whatif)")
    parser.add_argument("--no-files", action="store_true", help="print only")
    return parser


def _sweep(text: str | None, parse, what: str) -> list:
    return [parse(item) for item in items(text, what)] if text else [None]


def _counts(text: str | None, default: list[int], what: str) -> list[int]:
    return parse_counts(text, what) if text else default


def run(args) -> tuple[list[dict], dict[str, Path]]:
    """The what-if of the parsed command line: rows (`whatif.ROW_KEYS`) and the files written."""
    bandwidths = _sweep(args.bandwidth, parse_bandwidth, "--bandwidth")
    latencies = _sweep(args.latency, parse_latency, "--latency")
    batch = parse_counts(args.batch_size, "--batch-size")[0] if args.batch_size else None
    servers = parse_counts(args.servers, "--servers")[0] if args.servers else None
    if args.cluster_file is not None:
        spec = load_cluster(args.cluster_file)
        model = args.model or spec.model
        if not model:
            raise PredictError(f"give --model or [workload] model in {args.cluster_file}")
        names = whatif.scheme_names(items(args.frameworks or "study", "--frameworks"))
        profile, source, batch, jitter = cluster_profile(spec, model, batch or spec.batch_per_worker, args.profile)
        chosen = whatif.cluster_candidates(spec, names, profile, source, batch, args.algorithm, servers, jitter,
                                            model)
        nodes = _counts(args.nodes, [spec.nodes], "--nodes")
        per_node = _counts(args.workers, [spec.workers_per_node], "--workers")
        folder, title = Path("results") / "whatif", f"Predicted efficiency on {spec.device.name} nodes, {model}"
    else:
        if not args.model:
            raise PredictError("--from needs --model")
        model = args.model
        names = [name.strip().lower() for name in items(args.frameworks or "all", "--frameworks")]
        names = [n for name in names for n in (["stored", *CATALOGUE] if name == "all" else [name])]
        try:
            with ResultStore.for_campaign(Path(args.source), create=False) as store:
                records, fits = store.records(), store.calibration_fits()
        except StoreError as exc:
            raise PredictError(str(exc)) from None
        chosen = candidates(records, fits, model, batch, list(dict.fromkeys(names)), args.profile, servers,
                            args.algorithm)
        nodes = _counts(args.nodes, [2, 4, 8, 16], "--nodes")
        per_node = _counts(args.workers, [1], "--workers")
        folder, title = Path(args.source) / "whatif", f"Predicted weak-scaling efficiency, {model}"
    rows = whatif.evaluate(chosen, nodes, per_node, bandwidths, latencies, model)
    written = {}
    if not args.no_files and not (args.json and args.out is None):
        out = Path(args.out) if args.out else folder
        try:
            written = whatif.write_outputs(rows, out, f"whatif_{model}", title)
        except OSError as exc:
            raise PredictError(f"cannot write to {out}: {exc.strerror or exc}") from None
    return rows, written


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.predict``: the what-if table (exit 2 with one line on bad input)."""
    parser = build_parser()
    args = parser.parse_args(parser.current_spelling(sys.argv[1:] if argv is None else argv))
    try:
        rows, written = run(args)
    except (PredictError, UnitError, ClusterError, WhatIfError) as exc:
        return fail(exc)
    if args.json:
        sys.stdout.write(whatif.json_lines(rows))
    else:
        print(whatif.markdown(rows), end="")
    for kind, path in written.items():
        print(f"{kind}: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
