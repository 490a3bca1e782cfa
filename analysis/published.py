"""Published multi-GPU measurements (validation/published.toml) and the model's prediction
of each, for `python -m bench.published_validation`.

Each case's cluster is a cluster-file table (`analysis.cluster.parse_cluster`), the case's
``workload`` keys (precision, gradient precision, synthetic data) merged into it, whose
device efficiency is set so that the FLOP model's one-worker iteration takes as long as the
case's one-worker throughput (`cluster.efficiency_for_throughput`: the source's own 1-GPU
figure where it has one), and which gets the file's one software cost per transport
(``[transports]``: alpha, and where stated coordination and pipelining).  Nothing is fitted
to a multi-GPU answer.  Per topology (nodes x GPUs per node) the case's scheme is priced
three ways:

- ``predicted``: the model, on the cluster's hierarchy with its node effects
  (`perfmodel.predict_on`: the slowest of p workers, the shared host link), the transports'
  coordination and pipelining and servers where the cluster places them;
- ``without``: the same hierarchy without those terms (no node effects, no coordination,
  no pipelining, parameter servers on the devices instead of the host CPU);
- ``flat``: every rank on one flat link of the NIC's bandwidth and latency, no software
  cost (the flat formulas of `perfmodel.coefficients`).

Published efficiency E = X(p) / (p X(1)) from throughputs X (images/s over all workers), or
speedup / p; the error is in points of efficiency, (predicted - published) x 100.
"""

from __future__ import annotations

import copy
import math
import statistics
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from analysis import perfmodel as pm
from analysis.cluster import ClusterError, ClusterSpec, efficiency_for_throughput, parse_cluster
from analysis.units import UnitError, parse_flops
from analysis.whatif import WhatIfError, gpu_scheme, priced_scheme
from analysis.workload import BYTES_PER_FLOAT, UPDATE_BYTES_PER_PARAM, flops_per_sample, flops_profile
from models import get_model

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "validation" / "published.toml"
# [transports] keys that reach the cluster file's [transport.<name>] tables
TRANSPORT_KEYS = ("alpha", "coordination", "pipelined")


class PublishedError(ValueError):
    """A validation file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Case:
    """One published series (the file's [[cases]] entry, checked)."""

    source: str
    cluster_name: str
    cluster: ClusterSpec
    model: str
    scheme: str
    changes: dict
    transport: str
    batch: int
    topologies: tuple[tuple[int, int], ...]
    servers: tuple[int | None, ...]
    published_efficiency: tuple[float, ...]
    assumed: str


def _cluster(data: dict, case: dict, transports: dict, path: Path) -> ClusterSpec:
    """The case's cluster table as a ClusterSpec: the case's workload and parameter_servers
    keys merged in,
    efficiency 1 until the one-worker throughput sets it, the file's transports added."""
    name = case["cluster"]
    table = copy.deepcopy(data.get("clusters", {}).get(name))
    if table is None:
        raise PublishedError(f"{path}: no [clusters.{name}]")
    table.setdefault("device", {})["efficiency"] = 1.0
    table.setdefault("workload", {}).update(case.get("workload", {}))
    if "parameter_servers" in case:
        table.setdefault("parameter_servers", {}).update(case["parameter_servers"])
    table["transport"] = {kind: {key: value[key] for key in TRANSPORT_KEYS if key in value}
                          for kind, value in transports.items()}
    return parse_cluster(table, path)


def _calibrated(spec: ClusterSpec, model: str, one_worker: dict) -> ClusterSpec:
    """The cluster with the device efficiency at which the model's one-worker iteration
    matches `one_worker`'s throughput (its batch, on a device of its peak: the one-worker
    entry's own peak_flops where the measurement ran on another device, else the cluster's
    at the run's precision)."""
    batch = int(one_worker["batch"])
    network = get_model(model)
    copy_s = 0.0 if spec.data == "synthetic" else \
        batch * BYTES_PER_FLOAT * math.prod(network.input_shape) / spec.device.host_to_device
    other = copy_s + UPDATE_BYTES_PER_PARAM * network.total_params / spec.device.memory_bandwidth
    peak = parse_flops(one_worker["peak_flops"]) if "peak_flops" in one_worker else spec.device.peak
    efficiency = efficiency_for_throughput(float(one_worker["images_per_s"]), batch, flops_per_sample(model),
                                           peak, other)
    return spec.with_device(efficiency=efficiency)


def _topologies(case: dict) -> tuple[tuple[int, int], ...]:
    """``topology = ["1x2", "2x8"]`` (nodes x GPUs per node), or ``nodes`` with one
    ``workers_per_node``."""
    if "topology" in case:
        out = []
        for text in case["topology"]:
            nodes, _, per_node = str(text).partition("x")
            out.append((int(nodes), int(per_node)))
        return tuple(out)
    return tuple((int(n), int(case["workers_per_node"])) for n in case["nodes"])


def _published(case: dict, topologies: tuple[tuple[int, int], ...], where: str) -> tuple[float, ...]:
    if "published_speedup" in case:
        return tuple(float(s) / (n * g) for s, (n, g) in zip(case["published_speedup"], topologies))
    one = case["one_worker"]
    if int(one["batch"]) != int(case["batch_per_worker"]):
        raise PublishedError(f"{where}: published_images_per_s needs the one-worker throughput at the same batch")
    return tuple(float(x) / (n * g * float(one["images_per_s"]))
                 for x, (n, g) in zip(case["published_images_per_s"], topologies))


def _transports(data: dict, path: Path) -> dict:
    transports = data.get("transports", {})
    for kind, value in transports.items():
        if "from" not in value:
            raise PublishedError(f"{path}: [transports] {kind} needs 'from': where its cost comes from")
    return transports


def load_cases(path: Path = DEFAULT_PATH) -> tuple[dict, list[Case]]:
    """(sources, cases) of a validation file; PublishedError on anything wrong."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PublishedError(f"cannot read {path}: {str(error).splitlines()[0]}") from None
    sources, transports = data.get("sources", {}), _transports(data, Path(path))
    cases = []
    for index, case in enumerate(data.get("cases", [])):
        where = f"{path}: cases[{index}]"
        try:
            if case["source"] not in sources:
                raise PublishedError(f"{where}: unknown source {case['source']!r}")
            scheme_name = priced_scheme(case["scheme"]).name
            topologies = _topologies(case)
            servers = tuple(case.get("servers") or [None] * len(topologies))
            published = _published(case, topologies, where)
            if not len(published) == len(servers) == len(topologies):
                raise PublishedError(f"{where}: topologies, servers and the published values differ in length")
            spec = _calibrated(_cluster(data, case, transports, Path(path)), case["model"], case["one_worker"])
            cases.append(Case(case["source"], case["cluster"], spec, case["model"], scheme_name, case.get("scheme_changes", {}),
                              case["transport"], int(case["batch_per_worker"]), topologies, servers, published,
                              case.get("assumed", "")))
        except KeyError as missing:
            raise PublishedError(f"{where}: missing {missing}") from None
        except (WhatIfError, ClusterError, UnitError, ValueError) as error:
            if isinstance(error, PublishedError):
                raise
            raise PublishedError(f"{where}: {error}") from None
    return sources, cases


def _flat(scheme: pm.Scheme, spec: ClusterSpec, topology: pm.Topology, servers: int) -> pm.CommCost:
    """Every rank on one link of the NIC's bandwidth and latency, no software cost."""
    link = pm.LinkCost(spec.inter.latency, 1.0 / spec.inter.bandwidth, spec.device.gamma)
    return pm.comm_time_function(scheme.algorithm, topology.world_size, link, servers)


def case_scheme(case: Case) -> pm.Scheme:
    """The case's scheme as the catalogue describes it on GPUs, the case's changes applied."""
    return pm.Scheme.from_dict({**gpu_scheme(priced_scheme(case.scheme)).scheme.as_dict(), **case.changes})


def predict_case(case: Case) -> list[dict]:
    """Per topology: published and predicted efficiency (the model, the model without the
    node, coordination, pipelining and host-placement terms, and the flat link), their errors
    in points, and the predicted bottleneck."""
    scheme = case_scheme(case)
    spec = case.cluster
    device = spec.device
    profile = flops_profile(case.model, case.batch, device.sustained_flops, device.host_to_device,
                            device.memory_bandwidth, spec.gradient_bytes, spec.data == "synthetic")
    t_one = pm.single_worker_prediction(profile).iter_time
    fabric = spec.fabric(case.transport)
    plain_fabric = replace(fabric, coordination=0.0, pipelined=False)
    plain_placement = "colocated" if spec.placement == "host" else spec.placement
    effects = spec.node_effects()
    rows = []
    for (nodes, per_node), servers, published in zip(case.topologies, case.servers, case.published_efficiency):
        topology = pm.Topology(nodes, per_node)
        count = servers or nodes
        comm = pm.topology_cost(scheme, topology, fabric, count, spec.placement)
        prediction = pm.predict_on(profile, scheme, comm, topology, effects)
        without = pm.predict(profile, scheme, pm.topology_cost(scheme, topology, plain_fabric, count, plain_placement))
        flat = pm.predict(profile, scheme, _flat(scheme, spec, topology, count))
        efficiency, without_efficiency, flat_efficiency = (t_one / p.iter_time for p in (prediction, without, flat))
        rows.append({"source": case.source, "cluster": case.cluster_name, "model": case.model,
                     "scheme": case.scheme + "".join(f" {key}={value}" for key, value in case.changes.items()),
                     "precision": device.precision, "topology": f"{nodes}x{per_node}",
                     "batch_per_worker": case.batch, "device_efficiency": device.efficiency,
                     "published": published, "predicted": efficiency, "error_points": (efficiency - published) * 100,
                     "without": without_efficiency, "without_error_points": (without_efficiency - published) * 100,
                     "flat": flat_efficiency, "flat_error_points": (flat_efficiency - published) * 100,
                     "bottleneck": pm.bottleneck(prediction, comm)})
    return rows


def validation_rows(path: Path = DEFAULT_PATH) -> list[dict]:
    """Every case's rows."""
    _, cases = load_cases(path)
    return [row for case in cases for row in predict_case(case)]


def median_abs_points(rows: list[dict], key: str) -> float:
    return statistics.median(abs(row[key]) for row in rows)


def max_abs_points(rows: list[dict], key: str) -> float:
    return max(abs(row[key]) for row in rows)


ERROR_KEYS = ("error_points", "without_error_points", "flat_error_points")


def summary(rows: list[dict]) -> list[dict]:
    """Per source, cluster and scheme, then over all: points, and the median and largest
    |error| of the model, the model without the new terms, and the flat link."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["source"], row["cluster"], row["scheme"]), []).append(row)
    groups[("all sources", "", "")] = rows
    out = []
    for (source, cluster, scheme), members in groups.items():
        entry = {"source": source, "cluster": cluster, "scheme": scheme, "points": len(members)}
        for key in ERROR_KEYS:
            name = key.removesuffix("error_points").rstrip("_") or "model"
            entry[f"{name} median"] = median_abs_points(members, key)
            entry[f"{name} max"] = max_abs_points(members, key)
        out.append(entry)
    return out

