"""Composing a topology from the links of two others: a run of N nodes x G workers predicted
from a calibration inside one node (1 x G0: the intra-node link) and one across nodes
(N0 x 1: the NIC), never from a calibration of its own topology.

A campaign's per-run prediction (`analysis.predict.predict_record`) looks its calibration up
by topology (`calibration.lookup`); without a calibration of the run's own N x G it takes the
nearest world size and puts all p ranks on that one link: the flat model.  Here the two
link-level fits are composed instead (`composed_fabric`):

- the intra-node link alpha_i, beta_i is the 1 x G0 fit's: on one node every hierarchical
  form in `perfmodel`'s table reduces to its flat formula, so the stored inversion holds;
- the NIC alpha_e, beta_e are those at which `perfmodel.topology_cost` of the scheme on
  N0 x 1 (with that intra-node link) gives the fitted T(n) = a + b n: alpha_e from a (the
  latency is linear in it), beta_e by bisection on b (non-decreasing in it).  A ring on
  N0 x 1 has no intra-node hop, so this is the stored inversion; a parameter server's
  colocated server takes part of the traffic inside its node, so it is not;
- gamma is the intra fit's (a local sum on the same host), no software cost on top (the
  fits measured the transport's own stack), and the contention shares (kappa, kappa_c) are
  the NIC fit's, which `lookup` hands the flat model too: both predictions differ only in
  how the links are composed.  Except where the run's ranks outnumber the host's cores
  (`oversubscribed`): the shares were probed with one rank per core (2 ranks on 2 cores), and
  with more ranks than cores no core is free for a transfer beside backward, so both
  predictions hide nothing (kappa = 1, kappa_c = 0: the time without overlap).  On the
  emulated cluster (2026-12, 2-core VM, `bench.compose_emulated`) Horovod's 2 x 2 and 2 x 4
  runs read -32 % and -24 % with the probed shares and +16 % and +1 % with nothing hidden,
  MXNet dist_sync's -20 % and -19 % and -5 % and -11 %; DDP and CNTK-style send alexnet-tiny's
  gradient after backward either way.

`predict_composed` prices a stored run's scheme on its own topology over that fabric, on
the run's own measured compute (as the report's prediction does) and on the one-worker
profile of the same framework scaled by `compute_factor`; `composition_rows` and
`composition_report` set both beside the flat model's prediction and the measured time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import perfmodel as pm
from analysis.calibration import CalibrationFit, relink
from analysis.predict import comm_cost, profile_from_record, scheme_of
from analysis.rendering import to_markdown
from analysis.store import ResultStore

BISECTION_STEPS = 200


@dataclass(frozen=True)
class LinkFits:
    """The two calibrations a composition uses: inside a node and across nodes."""

    intra: CalibrationFit
    inter: CalibrationFit


def link_fits(fits: list[CalibrationFit], record: dict) -> LinkFits | None:
    """The run's scheme calibrated inside one node (1 x G0, G0 >= 2) and across nodes
    (N0 x 1, N0 >= 2; moved to the run's link with `calibration.relink` if measured at
    another), same device kind; None unless both are stored."""
    same = [f for f in fits if f.framework == record.get("framework") and f.mode == record.get("mode")
            and f.device_kind == record.get("device_kind")]
    intra = [f for f in same if f.nodes == 1 and f.workers_per_node >= 2]
    inter = [f for f in same if f.nodes >= 2 and f.workers_per_node == 1]
    if not intra or not inter:
        return None
    links = (record.get("bandwidth") or "", record.get("latency") or "")
    inter.sort(key=lambda f: ((f.bandwidth or "", f.latency or "") != links, f.nodes))
    chosen = inter[0]
    if (chosen.bandwidth or "", chosen.latency or "") != links:
        chosen = relink(chosen, *links)
    return LinkFits(min(intra, key=lambda f: f.workers_per_node), chosen)


def _fit_scheme(fit: CalibrationFit) -> pm.Scheme:
    """The collective a calibration timed, as a perfmodel scheme (ring or parameter server)."""
    if fit.algorithm == "ps":
        return pm.Scheme("calibration", algorithm="ps", servers=max(1, fit.servers))
    return pm.Scheme("calibration", algorithm=fit.algorithm)


def _cost(fit: CalibrationFit, fabric: pm.Fabric) -> pm.CommCost:
    return pm.topology_cost(_fit_scheme(fit), pm.Topology(fit.nodes, fit.workers_per_node), fabric,
                            max(1, fit.servers), "colocated")


def composed_fabric(fits: LinkFits) -> pm.Fabric:
    """The intra-node link of the 1 x G0 fit and the NIC that reproduces the N0 x 1 fit on
    its own topology (module docstring)."""
    intra = pm.LinkCost(fits.intra.alpha_s, fits.intra.beta_s_per_byte)
    gamma = fits.intra.gamma_s_per_byte

    def fabric(alpha: float, beta: float) -> pm.Fabric:
        return pm.Fabric(intra=intra, inter=pm.LinkCost(alpha, beta), gamma=gamma)

    target = fits.inter
    base = _cost(target, fabric(0.0, 0.0)).latency
    per_alpha = _cost(target, fabric(1.0, 0.0)).latency - base
    alpha = max(0.0, (target.fit_a_s - base) / per_alpha) if per_alpha > 0 else 0.0
    low, high = 0.0, max(target.fit_b_s_per_byte, 1e-12) * 16
    while _cost(target, fabric(alpha, high)).per_byte < target.fit_b_s_per_byte:
        high *= 2
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if _cost(target, fabric(alpha, middle)).per_byte < target.fit_b_s_per_byte \
            else (low, middle)
        if high - low <= 1e-6 * high:
            break
    return fabric(alpha, high)


def composed_cost(record: dict, scheme: pm.Scheme, fits: LinkFits) -> pm.CommCost:
    """T(n) of the run's messages on its own topology over the composed fabric."""
    topology = pm.Topology(int(record.get("nodes") or 1), int(record.get("workers_per_node") or 1))
    servers = int(record.get("servers") or 0) or scheme.servers or 1
    return pm.topology_cost(scheme, topology, composed_fabric(fits), servers, "colocated")


NOTHING_HIDES = (1.0, 0.0)


def _cores(record: dict, other: dict | None = None) -> float:
    """The cores a rank could run on: the record's, else its environment's count."""
    for source in (record, other or {}):
        cores = source.get("cpu_cores") or (source.get("env") or {}).get("cpu_count")
        if cores:
            return float(cores)
    return 1.0


def _ranks_on_host(record: dict) -> float:
    """Worker processes sharing the host: the record's count (emulated nodes share it), else
    its world size (every run of this module shares one host)."""
    return float(record.get("ranks_per_host") or record.get("world_size") or 1)


def oversubscribed(record: dict) -> bool:
    """More of the run's ranks (times their threads) on the host than it has cores."""
    flag = record.get("oversubscribed")
    if flag is not None:
        return bool(flag)
    return _ranks_on_host(record) * float(record.get("threads_per_worker") or 1) > _cores(record)


def compute_factor(record: dict, baseline: dict) -> float:
    """How much slower a rank of `record` computes than the one-worker `baseline`, when all
    ranks of the run share the host's C cores (every emulated node is this host) and compute
    at once: processor sharing, each rank's compute parallel over its threads,

        factor = min(T_1, C) / min(T_N, C / p)

    T_1, T_N the runs' threads per worker, p the ranks on the host.  (2 cores, one worker of
    2 threads, p = 4 of 1 thread: 4; p = 8: 8.)"""
    cores = _cores(record, baseline)
    threads_one = float(baseline.get("threads_per_worker") or cores)
    threads_n = float(record.get("threads_per_worker") or 1)
    return min(threads_one, cores) / min(threads_n, cores / _ranks_on_host(record))


@dataclass(frozen=True)
class Composition:
    """One run predicted three ways (seconds): flat, composed on its own compute, composed on
    the one-worker profile (None without one)."""

    flat: float
    flat_basis: str
    composed: float
    from_one_worker: float | None


def predict_composed(record: dict, fits: list[CalibrationFit], baseline: dict | None = None) -> Composition | None:
    """The run predicted by the flat model (`predict.comm_cost`, as the report does) and from
    the composed fabric; None when the run has no profile or the two link fits are missing."""
    built = profile_from_record(record)
    pair = link_fits(fits, record)
    if built is None or pair is None:
        return None
    profile = built[0]
    scheme, _ = scheme_of(record)
    flat_comm, basis, facts = comm_cost(record, scheme, profile, [pair.intra, pair.inter])
    shares = ((facts or {}).get("contention", 0.0), (facts or {}).get("transfer_contention", 0.0))
    if oversubscribed(record):
        shares = NOTHING_HIDES
    flat = pm.predict(profile, scheme, flat_comm, *shares).iter_time
    comm = composed_cost(record, scheme, pair)
    composed = pm.predict(profile, scheme, comm, *shares).iter_time
    one = None
    built_one = profile_from_record(baseline) if baseline is not None else None
    if built_one is not None:
        one = pm.predict(built_one[0].scaled(compute_factor(record, baseline)), scheme, comm, *shares).iter_time
    return Composition(flat, basis, composed, one)


def _key(record: dict) -> tuple:
    return (record.get("framework"), record.get("mode"), record.get("model"), record.get("batch_per_worker"))


def composition_rows(records: list[dict], fits: list[CalibrationFit]) -> list[dict]:
    """Per multi-node, multi-worker run (N >= 2, G >= 2): measured, flat, composed and
    composed-from-one-worker iteration times (ms) and the errors (pred - meas) / meas."""
    baselines = {}
    for record in records:
        if record.get("status") == "ok" and int(record.get("world_size") or 0) == 1:
            baselines.setdefault(_key(record), record)
    rows = []
    for record in sorted(records, key=lambda r: (r.get("framework") or "", r.get("mode") or "",
                                                 r.get("world_size") or 0)):
        if record.get("status") != "ok" or int(record.get("nodes") or 1) < 2 \
                or int(record.get("workers_per_node") or 1) < 2 or not record.get("iter_time_median"):
            continue
        found = predict_composed(record, fits, baselines.get(_key(record)))
        if found is None:
            continue
        measured = float(record["iter_time_median"])

        def error(t):
            return None if t is None else (t - measured) / measured

        rows.append({"scheme": f"{record.get('framework')}:{record.get('mode')}", "model": record.get("model"),
                     "topology": f"{record['nodes']}x{record['workers_per_node']}",
                     "bandwidth": record.get("bandwidth") or "", "measured_ms": measured * 1e3,
                     "flat_ms": found.flat * 1e3, "flat_error": error(found.flat), "flat_basis": found.flat_basis,
                     "composed_ms": found.composed * 1e3, "composed_error": error(found.composed),
                     "one_worker_ms": None if found.from_one_worker is None else found.from_one_worker * 1e3,
                     "one_worker_error": error(found.from_one_worker)})
    return rows


def median_abs(rows: list[dict], key: str) -> dict[str, float]:
    """Median |rows[key]| per scheme."""
    out: dict[str, list[float]] = {}
    for row in rows:
        if row.get(key) is not None:
            out.setdefault(row["scheme"], []).append(abs(row[key]))
    return {scheme: statistics.median(values) for scheme, values in out.items()}


def calibrated_rows(records: list[dict]) -> list[dict]:
    """The runs on the two calibrated topologies themselves (1 x G, N x 1), with the
    campaign's own prediction of each (its calibration, its compute): how well the model
    does where nothing is composed."""
    rows = []
    for record in records:
        nodes, per_node = int(record.get("nodes") or 1), int(record.get("workers_per_node") or 1)
        predicted, measured = record.get("predicted_iter_time"), record.get("iter_time_median")
        if record.get("status") != "ok" or not predicted or not measured or nodes * per_node < 2 \
                or (nodes > 1 and per_node > 1):
            continue
        rows.append({"scheme": f"{record.get('framework')}:{record.get('mode')}", "topology": f"{nodes}x{per_node}",
                     "bandwidth": record.get("bandwidth") or "", "measured_ms": measured * 1e3,
                     "predicted_ms": predicted * 1e3, "error_pct": (predicted - measured) / measured * 100})
    return sorted(rows, key=lambda row: (row["scheme"], row["topology"]))


def composition_report(folder: Path) -> str:
    """The comparison of a stored campaign as text: a table per run, then medians per scheme,
    then the runs on the calibrated topologies themselves."""
    with ResultStore.for_campaign(folder, create=False) as store:
        records = store.records()
        rows = composition_rows(records, store.calibration_fits())
    calibrated = calibrated_rows(records)
    tail = ("\nOn the calibrated topologies (their own calibration):\n" + to_markdown(pd.DataFrame(calibrated))
            if calibrated else "")
    if not rows:
        return "no run of 2+ nodes x 2+ workers with both link calibrations (1 x G and N x 1) stored"
    table = pd.DataFrame(rows)
    for key in ("flat_error", "composed_error", "one_worker_error"):
        table[key.replace("error", "error_pct")] = pd.to_numeric(table.pop(key), errors="coerce") * 100
    medians = pd.DataFrame([{"scheme": scheme, "runs": sum(r["scheme"] == scheme for r in rows),
                             "composed_median_abs_error_pct": 100 * composed,
                             "flat_median_abs_error_pct": 100 * median_abs(rows, "flat_error")[scheme],
                             "one_worker_median_abs_error_pct": 100 * median_abs(rows, "one_worker_error").get(
                                 scheme, float("nan"))}
                            for scheme, composed in median_abs(rows, "composed_error").items()])
    return to_markdown(table) + "\n" + to_markdown(medians) + tail
