"""A GPU cluster described in a TOML file (`python -m analysis.predict --cluster-file FILE`).

Read with the standard library's `tomllib`; every quantity carries its unit, as on the
command line (`analysis.units`): bandwidths '12 GB/s' or '56Gbit', latencies '2us', compute
rates '11.8 TFLOP/s', per-byte costs '0.2ns/B'.  Every key, its unit and its default is in
`SCHEMA` below and in docs/prediction.md; examples/cluster.toml is a commented example.  A
file that cannot be read, a section or key this module does not know, a missing required
key or a value it cannot read is a `ClusterError` whose message is one line naming the
file and the key.

Sections: ``[device]`` one worker's compute (peak FLOP/s x efficiency, memory and
host-to-device bandwidth, or ``profile`` = a campaign folder whose one-worker run gives the
compute; peaks per precision, the step jitter), ``[nodes]`` count, workers per node and the
host link they share, ``[intra_node]`` the link between the workers of a node,
``[inter_node]`` the NIC all workers of a node share, optional ``[transport.<name>]`` a
transport's software cost (grpc, ps-lite, nccl, mpi, gloo: per message, per byte, per
control hop, whether it pipelines), ``[parameter_servers]`` (count, placement: on the
devices, machines of their own or the host CPU), ``[contention]`` (none unless given: a
described cluster's communication runs beside its compute) and ``[workload]`` (model,
per-worker batch, precision, gradient precision, synthetic data; the command line may give
the first two instead).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from analysis import perfmodel as pm
from analysis.units import UnitError, parse_bandwidth, parse_flops, parse_latency, parse_per_byte

TRANSPORTS: tuple[str, ...] = ("grpc", "ps-lite", "nccl", "mpi", "gloo")
# a run's arithmetic ([workload] precision): the peak it runs at is device.peak_flops (fp32)
# or device.peak_flops_<precision>
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")
# bytes per gradient value a run all-reduces ([workload] gradient_precision)
GRADIENT_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2}
DATA_KINDS: tuple[str, ...] = ("host", "synthetic")
# gamma: summing two float32 buffers reads two bytes and writes one per byte of result
BYTES_MOVED_PER_BYTE_SUMMED = 3


class ClusterError(ValueError):
    """A cluster file that cannot be used; the message is one line."""


def _text(value, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ClusterError(f"{where} must be a non-empty string, got {value!r}")
    return value.strip()


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterError(f"{where} must be a whole number >= 1, got {value!r}")
    return value


def _fraction(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ClusterError(f"{where} must be a number in (0, 1], got {value!r}")
    return float(value)


def _share(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ClusterError(f"{where} must be a number in [0, 1], got {value!r}")
    return float(value)


def _unit(parse: Callable[[str], float]) -> Callable[[object, str], float]:
    def read(value, where: str) -> float:
        if not isinstance(value, str):
            raise ClusterError(f"{where} needs a unit, as a string (e.g. \"12 GB/s\", \"2us\"), got {value!r}")
        try:
            return parse(value)
        except UnitError as error:
            raise ClusterError(f"{where}: {error}") from None
    return read


def _choice(choices: tuple[str, ...]) -> Callable[[object, str], str]:
    def read(value, where: str) -> str:
        if value not in choices:
            raise ClusterError(f"{where} must be one of {', '.join(choices)}, got {value!r}")
        return value
    return read


def _jitter(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ClusterError(f"{where} must be a number in [0, 1), got {value!r}")
    return float(value)


def _flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterError(f"{where} must be true or false, got {value!r}")
    return value


# section -> key -> (reader, required, what it is).  The documentation of every key.
SCHEMA: dict[str, dict[str, tuple[Callable, bool, str]]] = {
    "device": {
        "name": (_text, True, "the worker's device, for the output"),
        "peak_flops": (_unit(parse_flops), False, "peak float32 rate, e.g. \"11.8 TFLOP/s\" (needed without profile)"),
        "peak_flops_tf32": (_unit(parse_flops), False, "peak rate at workload.precision = \"tf32\" (tensor cores)"),
        "peak_flops_fp16": (_unit(parse_flops), False, "peak rate at workload.precision = \"fp16\" (tensor cores)"),
        "peak_flops_bf16": (_unit(parse_flops), False, "peak rate at workload.precision = \"bf16\" (tensor cores)"),
        "efficiency": (_fraction, False, "sustained share of the precision's peak on conv nets, 0..1 (needed "
                                         "without profile)"),
        "jitter": (_jitter, False, "coefficient of variation of one worker's step time, in [0, 1): the slowest of "
                                   "p workers sets each step (default: a device.profile run's spread, else 0)"),
        "memory_bandwidth": (_unit(parse_bandwidth), False,
                             "device memory bandwidth: the update (20 bytes per parameter) and the "
                             "reduction cost gamma = 3 / memory_bandwidth (needed without profile)"),
        "host_to_device": (_unit(parse_bandwidth), False, "host-to-device copy of the batch (needed without profile)"),
        "profile": (_text, False, "a campaign folder (relative to this file) whose one-worker run of the model "
                                  "gives the compute instead of FLOPs"),
    },
    "nodes": {
        "count": (_count, True, "nodes"),
        "workers_per_node": (_count, True, "workers (devices) per node"),
        "host_bandwidth": (_unit(parse_bandwidth), False, "the host link all workers of a node share (the CPU's "
                                                          "PCIe lanes behind the switches; default: no sharing)"),
    },
    "intra_node": {
        "bandwidth": (_unit(parse_bandwidth), True, "one worker's link to the others of its node (PCIe, NVLink, "
                                                   "shared memory)"),
        "latency": (_unit(parse_latency), False, "its one-way latency (default 0us)"),
    },
    "inter_node": {
        "bandwidth": (_unit(parse_bandwidth), True, "the node's NIC, shared by all its workers and servers"),
        "latency": (_unit(parse_latency), False, "its one-way latency (default 0us)"),
    },
    "transport": {
        "alpha": (_unit(parse_latency), False, "software cost per message (default 0us)"),
        "beta": (_unit(parse_per_byte), False, "software cost per byte, e.g. \"0.1ns/B\" (default 0)"),
        "efficiency": (_fraction, False, "share of a link's bandwidth the transport reaches (default 1)"),
        "coordination": (_unit(parse_latency), False, "software cost per hop of the control exchange before each "
                                                      "message, ceil(log2 p) hops (default 0us)"),
        "pipelined": (_flag, False, "true: messages queued back to back pay the link latency once (asynchronous "
                                    "sends; default false)"),
    },
    "parameter_servers": {
        "count": (_count, False, "servers (default: one per node)"),
        "placement": (_choice(pm.PLACEMENTS), False, "colocated (on the worker nodes' devices, dealt round robin, "
                                                     "the default), dedicated (machines of their own, same NIC) or "
                                                     "host (on the worker nodes' CPUs, over the host link)"),
        "memory_bandwidth": (_unit(parse_bandwidth), False, "the servers' memory bandwidth for their sums "
                                                            "(default: the device's; needed with placement host)"),
    },
    "contention": {
        "kappa": (_share, False, "share of its pace backward loses beside a transfer (default 0)"),
        "kappa_c": (_share, False, "share of its pace a transfer loses beside backward (default 0)"),
    },
    "workload": {
        "model": (_text, False, "network (models/), unless --model gives it"),
        "batch_per_worker": (_count, False, "per-worker batch, unless --batch-size gives it"),
        "precision": (_choice(PRECISIONS), False, "the run's arithmetic: fp32 (default), tf32, fp16 or bf16, at "
                                                  "device.peak_flops or device.peak_flops_<precision>"),
        "gradient_precision": (_choice(tuple(GRADIENT_BYTES)), False, "the gradients' values as all-reduced: fp32 "
                                                                      "(default; mixed precision keeps them), fp16, "
                                                                      "bf16"),
        "data": (_choice(DATA_KINDS), False, "host (batches copied from the host, the default) or synthetic "
                                             "(generated on the device: no copy)"),
    },
}
REQUIRED_SECTIONS = ("device", "nodes", "intra_node", "inter_node")


@dataclass(frozen=True)
class Link:
    """A link's bandwidth (bytes/s) and one-way latency (s)."""

    bandwidth: float
    latency: float = 0.0

    @property
    def cost(self) -> pm.LinkCost:
        return pm.LinkCost(alpha=self.latency, beta=1.0 / self.bandwidth)


@dataclass(frozen=True)
class Device:
    """One worker's compute: peak x efficiency, memory and host-to-device bandwidth, or the
    campaign folder whose one-worker profile replaces them."""

    name: str
    peak_flops: float | None = None
    efficiency: float | None = None
    memory_bandwidth: float | None = None
    host_to_device: float | None = None
    profile: Path | None = None
    peak_flops_tf32: float | None = None
    peak_flops_fp16: float | None = None
    peak_flops_bf16: float | None = None
    jitter: float | None = None
    precision: str = "fp32"  # the workload's, whose peak `peak` is

    @property
    def peak(self) -> float | None:
        """The peak rate at the run's precision (fp32: peak_flops)."""
        return self.peak_flops if self.precision == "fp32" else getattr(self, f"peak_flops_{self.precision}")

    @property
    def sustained_flops(self) -> float:
        return self.peak * self.efficiency

    @property
    def gamma(self) -> float:
        """Seconds per byte summed: 3 bytes moved per byte of result at memory bandwidth."""
        return BYTES_MOVED_PER_BYTE_SUMMED / self.memory_bandwidth if self.memory_bandwidth else 0.0


@dataclass(frozen=True)
class Transport:
    """A transport's software: alpha_s per message, beta_s per byte, share of link bandwidth,
    the cost per hop of its control exchange, whether it pipelines queued messages."""

    alpha: float = 0.0
    beta: float = 0.0
    efficiency: float = 1.0
    coordination: float = 0.0
    pipelined: bool = False


@dataclass(frozen=True)
class ClusterSpec:
    """A described cluster (module docstring)."""

    source: Path
    device: Device
    nodes: int
    workers_per_node: int
    intra: Link
    inter: Link
    transports: dict[str, Transport] = field(default_factory=dict)
    servers: int | None = None
    placement: str = "colocated"
    server_memory_bandwidth: float | None = None
    contention: tuple[float, float] = (0.0, 0.0)
    model: str | None = None
    batch_per_worker: int | None = None
    host_bandwidth: float | None = None
    gradient_precision: str = "fp32"
    data: str = "host"

    @property
    def gradient_bytes(self) -> int:
        return GRADIENT_BYTES[self.gradient_precision]

    def node_effects(self, jitter: float | None = None) -> pm.NodeEffects:
        """The node effects of this cluster (`perfmodel.NodeEffects`): the device's jitter
        (`jitter` where the file gives none, e.g. a profile's measured spread) and the
        workers' batch copies over the node's shared host link."""
        chosen = self.device.jitter if self.device.jitter is not None else (jitter or 0.0)
        return pm.NodeEffects(chosen, self.device.host_to_device, self.host_bandwidth)

    def transport(self, name: str | None) -> Transport:
        """The file's software cost of transport `name` (none given: no extra cost)."""
        return self.transports.get(name or "", Transport())

    def fabric(self, transport: str | None, bandwidth: float | None = None, latency: float | None = None) -> pm.Fabric:
        """The model's links for a scheme over `transport`, the NIC's bandwidth and latency
        replaced where given (the command line's sweep)."""
        inter = Link(bandwidth or self.inter.bandwidth, self.inter.latency if latency is None else latency)
        software = self.transport(transport)
        server_gamma = (BYTES_MOVED_PER_BYTE_SUMMED / self.server_memory_bandwidth
                        if self.server_memory_bandwidth else None)
        return pm.Fabric(intra=self.intra.cost, inter=inter.cost,
                         software=pm.LinkCost(alpha=software.alpha, beta=software.beta),
                         efficiency=software.efficiency, gamma=self.device.gamma, server_gamma=server_gamma,
                         device_link=_per_byte(self.device.host_to_device), host_link=_per_byte(self.host_bandwidth),
                         coordination=software.coordination, pipelined=software.pipelined)

    def with_device(self, **changes) -> "ClusterSpec":
        return replace(self, device=replace(self.device, **changes))


def _per_byte(bandwidth: float | None) -> pm.LinkCost:
    """A link of `bandwidth` bytes/s without latency; none given: a link that costs nothing."""
    return pm.LinkCost(beta=1.0 / bandwidth) if bandwidth else pm.LinkCost()


def _read_section(data: dict, section: str, where: str) -> dict:
    schema = SCHEMA[section]
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: [{section}] must be a table")
    unknown = [key for key in data if key not in schema]
    if unknown:
        raise ClusterError(f"{where}: unknown key {section}.{unknown[0]} (known: {', '.join(schema)})")
    values = {}
    for key, (read, required, _) in schema.items():
        if key in data:
            values[key] = read(data[key], f"{where}: {section}.{key}")
        elif required:
            raise ClusterError(f"{where}: missing {section}.{key}")
    return values


def _sections(data: dict, where: str) -> dict[str, dict]:
    unknown = [key for key in data if key not in SCHEMA]
    if unknown:
        raise ClusterError(f"{where}: unknown section [{unknown[0]}] (known: {', '.join(SCHEMA)})")
    missing = [name for name in REQUIRED_SECTIONS if name not in data]
    if missing:
        raise ClusterError(f"{where}: missing section [{missing[0]}]")
    out = {name: _read_section(data[name], name, where) for name in SCHEMA if name in data and name != "transport"}
    transports = data.get("transport", {})
    if not isinstance(transports, dict):
        raise ClusterError(f"{where}: [transport.<name>] must be tables")
    for name, body in transports.items():
        if name not in TRANSPORTS:
            raise ClusterError(f"{where}: unknown transport [transport.{name}] (known: {', '.join(TRANSPORTS)})")
    out["transport"] = {name: _read_section(body, "transport", f"{where}: [transport.{name}]")
                        for name, body in transports.items()}
    return out


def parse_cluster(data: dict, source: Path) -> ClusterSpec:
    """A ClusterSpec from the TOML tables of `source` (ClusterError on anything wrong)."""
    where = str(source)
    sections = _sections(data, where)
    device = sections["device"]
    workload = sections.get("workload", {})
    device["precision"] = workload.get("precision", "fp32")
    profile = device.get("profile")
    if profile is None:
        missing = [key for key in ("peak_flops", "efficiency", "memory_bandwidth", "host_to_device") if key not in device]
        if missing:
            raise ClusterError(f"{where}: missing device.{missing[0]} (or give device.profile)")
        if device["precision"] != "fp32" and f"peak_flops_{device['precision']}" not in device:
            raise ClusterError(f"{where}: workload.precision = {device['precision']!r} needs "
                               f"device.peak_flops_{device['precision']} (the device's peak at that precision)")
    else:
        device["profile"] = (source.parent / profile).resolve()
    servers = sections.get("parameter_servers", {})
    if servers.get("placement") == "host" and "memory_bandwidth" not in servers:
        raise ClusterError(f"{where}: parameter_servers.placement = 'host' needs parameter_servers.memory_bandwidth "
                           "(the host's memory bandwidth for the sums)")
    contention = sections.get("contention", {})
    return ClusterSpec(
        source=source, device=Device(**device), nodes=sections["nodes"]["count"],
        workers_per_node=sections["nodes"]["workers_per_node"],
        host_bandwidth=sections["nodes"].get("host_bandwidth"),
        gradient_precision=workload.get("gradient_precision", "fp32"), data=workload.get("data", "host"),
        intra=Link(**sections["intra_node"]), inter=Link(**sections["inter_node"]),
        transports={name: Transport(**values) for name, values in sections["transport"].items()},
        servers=servers.get("count"), placement=servers.get("placement", "colocated"),
        server_memory_bandwidth=servers.get("memory_bandwidth"),
        contention=(contention.get("kappa", 0.0), contention.get("kappa_c", 0.0)),
        model=workload.get("model"), batch_per_worker=workload.get("batch_per_worker"))


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and check a cluster file (ClusterError with one line on anything wrong)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ClusterError(f"cannot read cluster file {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ClusterError(f"{path}: not valid TOML: {str(error).splitlines()[0]}") from None
    return parse_cluster(data, path)


def efficiency_for_throughput(images_per_s: float, batch: int, flops: tuple[float, float], peak_flops: float,
                              other_seconds: float = 0.0) -> float:
    """The device efficiency at which the FLOP model's one-worker iteration (forward and
    backward FLOPs per sample `flops`, plus `other_seconds` of h2d and update) takes as long
    as a measured one-worker throughput: B (F_f + F_b) / (peak e) = B / X - other."""
    compute = batch / images_per_s - other_seconds
    if compute <= 0:
        raise ValueError("the measured iteration is shorter than its copies and update alone")
    efficiency = batch * sum(flops) / (compute * peak_flops)
    if not math.isfinite(efficiency) or efficiency <= 0:
        raise ValueError(f"cannot derive an efficiency from {images_per_s} images/s")
    if efficiency > 1:
        raise ValueError(f"{images_per_s} images/s needs {efficiency:.2f} x the device's peak: the network's FLOPs "
                         "or the precision are not what the run used")
    return efficiency
