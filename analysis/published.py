"""Published multi-node measurements (validation/published.toml) and the model's prediction
of each, for `python -m bench.published_validation`.

Each case's cluster is a cluster-file table (`analysis.cluster.parse_cluster`) whose device
efficiency is set so that the FLOP model's one-worker iteration takes as long as the case's
one-worker throughput (`cluster.efficiency_for_throughput`: the source's own 1-GPU figure
where it has one), and which gets the file's one software cost per transport.  Nothing is
fitted to the multi-node answer.  Per node count the case's scheme is priced on the
cluster's hierarchy (`perfmodel.topology_cost`) and, beside it, the way the model priced a
described cluster before it had one: every rank on one flat link of the NIC's bandwidth and
latency, no software cost (the flat formulas of `perfmodel.coefficients`).

Published efficiency E = X(N) / (p X(1)) from throughputs X (images/s over all workers),
or speedup / p; the error is in points of efficiency, (predicted - published) x 100.
"""

from __future__ import annotations

import copy
import math
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path

from analysis import perfmodel as pm
from analysis.cluster import ClusterSpec, efficiency_for_throughput, parse_cluster
from analysis.units import parse_flops
from analysis.whatif import WhatIfError, gpu_scheme, priced_scheme
from analysis.workload import BYTES_PER_FLOAT, UPDATE_BYTES_PER_PARAM, flops_per_sample, flops_profile
from models import get_model

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "validation" / "published.toml"


class PublishedError(ValueError):
    """A validation file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Case:
    """One published series (the file's [[cases]] entry, checked)."""

    source: str
    cluster: ClusterSpec
    model: str
    scheme: str
    changes: dict
    transport: str
    batch: int
    workers_per_node: int
    nodes: tuple[int, ...]
    servers: tuple[int | None, ...]
    published_efficiency: tuple[float, ...]
    assumed: str


def _cluster(data: dict, name: str, transports: dict, path: Path) -> ClusterSpec:
    """The case's cluster table as a ClusterSpec: efficiency 1 until the one-worker
    throughput sets it, the file's transports' alpha added."""
    table = copy.deepcopy(data.get("clusters", {}).get(name))
    if table is None:
        raise PublishedError(f"{path}: no [clusters.{name}]")
    table.setdefault("device", {})["efficiency"] = 1.0
    table["transport"] = {kind: {"alpha": value["alpha"]} for kind, value in transports.items()}
    return parse_cluster(table, path)


def _calibrated(spec: ClusterSpec, model: str, one_worker: dict) -> ClusterSpec:
    """The cluster with the device efficiency at which the model's one-worker iteration
    matches `one_worker`'s throughput (its batch, on a device of its peak)."""
    batch = int(one_worker["batch"])
    shape = get_model(model).input_shape
    other = (batch * BYTES_PER_FLOAT * math.prod(shape) / spec.device.host_to_device
             + UPDATE_BYTES_PER_PARAM * get_model(model).total_params / spec.device.memory_bandwidth)
    efficiency = efficiency_for_throughput(float(one_worker["images_per_s"]), batch, flops_per_sample(model),
                                           parse_flops(one_worker["peak_flops"]), other)
    return spec.with_device(efficiency=efficiency)


def _published(case: dict, where: str) -> tuple[float, ...]:
    per_node = int(case["workers_per_node"])
    if "published_speedup" in case:
        return tuple(float(s) / (n * per_node) for s, n in zip(case["published_speedup"], case["nodes"]))
    one = case["one_worker"]
    if int(one["batch"]) != int(case["batch_per_worker"]):
        raise PublishedError(f"{where}: published_images_per_s needs the one-worker throughput at the same batch")
    return tuple(float(x) / (n * per_node * float(one["images_per_s"]))
                 for x, n in zip(case["published_images_per_s"], case["nodes"]))


def load_cases(path: Path = DEFAULT_PATH) -> tuple[dict, list[Case]]:
    """(sources, cases) of a validation file; PublishedError on anything wrong."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PublishedError(f"cannot read {path}: {str(error).splitlines()[0]}") from None
    sources, transports = data.get("sources", {}), data.get("transports", {})
    cases = []
    for index, case in enumerate(data.get("cases", [])):
        where = f"{path}: cases[{index}]"
        try:
            if case["source"] not in sources:
                raise PublishedError(f"{where}: unknown source {case['source']!r}")
            try:
                scheme_name = priced_scheme(case["scheme"]).name
            except WhatIfError as error:
                raise PublishedError(f"{where}: {error}") from None
            nodes = tuple(int(n) for n in case["nodes"])
            servers = tuple(case.get("servers") or [None] * len(nodes))
            published = _published(case, where)
            if not len(published) == len(servers) == len(nodes):
                raise PublishedError(f"{where}: nodes, servers and the published values differ in length")
            spec = _calibrated(_cluster(data, case["cluster"], transports, Path(path)), case["model"],
                               case["one_worker"])
            cases.append(Case(case["source"], spec, case["model"], scheme_name, case.get("scheme_changes", {}),
                              case["transport"],
                              int(case["batch_per_worker"]), int(case["workers_per_node"]), nodes, servers,
                              published, case.get("assumed", "")))
        except KeyError as missing:
            raise PublishedError(f"{where}: missing {missing}") from None
    return sources, cases


def _flat(scheme: pm.Scheme, spec: ClusterSpec, topology: pm.Topology, servers: int) -> pm.CommCost:
    """Every rank on one link of the NIC's bandwidth and latency, no software cost."""
    link = pm.LinkCost(spec.inter.latency, 1.0 / spec.inter.bandwidth, spec.device.gamma)
    return pm.comm_time_function(scheme.algorithm, topology.world_size, link, servers)


def predict_case(case: Case) -> list[dict]:
    """Per node count: published and predicted efficiency (hierarchical and flat), their
    errors in points, and the predicted bottleneck."""
    scheme = pm.Scheme.from_dict({**gpu_scheme(priced_scheme(case.scheme)).scheme.as_dict(), **case.changes})
    device = case.cluster.device
    profile = flops_profile(case.model, case.batch, device.sustained_flops, device.host_to_device,
                            device.memory_bandwidth)
    t_one = pm.single_worker_prediction(profile).iter_time
    rows = []
    for nodes, servers, published in zip(case.nodes, case.servers, case.published_efficiency):
        topology = pm.Topology(nodes, case.workers_per_node)
        count = servers or nodes
        comm = pm.topology_cost(scheme, topology, case.cluster.fabric(case.transport), count, case.cluster.placement)
        prediction = pm.predict(profile, scheme, comm)
        flat = pm.predict(profile, scheme, _flat(scheme, case.cluster, topology, count))
        efficiency = t_one / prediction.iter_time
        flat_efficiency = t_one / flat.iter_time
        rows.append({"source": case.source, "model": case.model,
                     "scheme": case.scheme + "".join(f" {key}={value}" for key, value in case.changes.items()),
                     "topology": f"{nodes}x{case.workers_per_node}", "batch_per_worker": case.batch,
                     "device_efficiency": device.efficiency, "published": published, "predicted": efficiency,
                     "error_points": (efficiency - published) * 100, "flat": flat_efficiency,
                     "flat_error_points": (flat_efficiency - published) * 100,
                     "bottleneck": pm.bottleneck(prediction, comm)})
    return rows


def validation_rows(path: Path = DEFAULT_PATH) -> list[dict]:
    """Every case's rows."""
    _, cases = load_cases(path)
    return [row for case in cases for row in predict_case(case)]


def median_abs_points(rows: list[dict], key: str) -> float:
    return statistics.median(abs(row[key]) for row in rows)
