"""Calibration of the communication model: fit alpha, beta (and gamma) from micro-benchmarks.

`launchers.calibrate` times a collective (all-reduce, or push+pull for parameter servers)
through each framework's own communication stack for message sizes from 1 KB to 64 MB, and a
local elementwise sum for the reduction cost.  This module (standard library only) turns those
timings into the model's parameters:

1. per size, the median over repeats (of the slowest rank per repeat);
2. a weighted least-squares fit of T(n) = a + b n minimising the *relative* residuals
   sum_i ((a + b n_i - T_i) / T_i)^2, so that the latency-bound small messages weigh as much
   as the bandwidth-bound large ones (ordinary least squares on 1 KB .. 64 MB would let the
   largest sizes decide alone and leave a to noise), made robust with Huber weights (IRLS)
   so that one size a busy machine slowed down does not bend the line;
3. gamma = the slope of the same fit on the local reduction timings (seconds per byte summed);
4. the link-level parameters by inverting the algorithm's coefficients
   (`perfmodel.invert_fit`): alpha = a / k_a, beta = (b - k_g gamma) / k_b; for a ring
   all-reduce k_a = 2(p-1), k_b = 2(p-1)/p, k_g = (p-1)/p.

Bandwidths follow nccl-tests' conventions: algbw = S / t (bytes of the buffer over time);
busbw = algbw * 2(p-1)/p for all-reduce (the bytes each link must carry, so it is comparable
with the link's speed whatever p), (p-1)/p for all-gather / reduce-scatter, 1 for broadcast,
reduce and point to point.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Iterable, Mapping, Sequence

from analysis import perfmodel as pm
from analysis.perfmodel import LinkCost, invert_fit
from analysis.units import parse_bandwidth, parse_latency

KIB = 1024
DEFAULT_MIN_BYTES = 1 * KIB
DEFAULT_MAX_BYTES = 64 * KIB * KIB


def default_sizes(min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
                  factor: int = 2) -> list[int]:
    """Message sizes min, min*factor, ... up to max (nccl-tests' -b/-e/-f), multiples of 4."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError("need 4 <= min_bytes <= max_bytes and factor >= 2")
    sizes, n = [], min_bytes
    while n <= max_bytes:
        sizes.append(int(n) // 4 * 4)
        n *= factor
    return sizes


# --------------------------------------------------------------------------- bandwidths

BUS_FACTORS = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "reducescatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "p2p": lambda p: 1.0,
    "pushpull": lambda p: 1.0,
}


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: buffer bytes / time (bytes per second)."""
    return nbytes / seconds if seconds > 0 else math.nan


def busbw(nbytes: float, seconds: float, collective: str, p: int) -> float:
    """nccl-tests' bus bandwidth: algbw times the collective's factor (2(p-1)/p for
    all-reduce), the rate each link runs at."""
    try:
        factor = BUS_FACTORS[collective](p)
    except KeyError:
        raise ValueError(f"unknown collective {collective!r} (known: {', '.join(BUS_FACTORS)})") from None
    return algbw(nbytes, seconds) * factor


# --------------------------------------------------------------------------- fitting

@dataclass(frozen=True)
class PointSummary:
    nbytes: int
    median: float
    p10: float
    p90: float
    repeats: int


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (NumPy's default), q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(points: Mapping[int, Sequence[float]]) -> list[PointSummary]:
    """Median, p10, p90 per size, sizes ascending; sizes without timings are dropped."""
    out = []
    for nbytes in sorted(points, key=int):
        values = [float(v) for v in points[nbytes] if v is not None and v > 0]
        if values:
            out.append(PointSummary(int(nbytes), statistics.median(values), _percentile(values, 10),
                                    _percentile(values, 90), len(values)))
    return out


def _weighted_fit(sizes, times, weights) -> tuple[float, float]:
    """Minimise sum_i weights_i ((a + b n_i - T_i) / T_i)^2 (2x2 normal equations)."""
    w = [wi / (t * t) for wi, t in zip(weights, times)]
    sw = sum(w)
    swn = sum(wi * n for wi, n in zip(w, sizes))
    swnn = sum(wi * n * n for wi, n in zip(w, sizes))
    swt = sum(wi * t for wi, t in zip(w, times))
    swnt = sum(wi * n * t for wi, n, t in zip(w, sizes, times))
    det = sw * swnn - swn * swn
    if det <= 0:
        raise ValueError("a fit needs at least two different sizes")
    a = (swt * swnn - swn * swnt) / det
    b = (sw * swnt - swn * swt) / det
    if a < 0:  # through the origin: b = sum w n t / sum w n^2
        a, b = 0.0, swnt / swnn
    if b < 0:  # constant: a = sum w t / sum w
        a, b = swt / sw, 0.0
    return a, b


HUBER_K = 1.345


def fit_linear(sizes: Sequence[float], times: Sequence[float], robust: bool = True) -> tuple[float, float, float]:
    """(a, b, rel_rmse) of T = a + b n by least squares on relative residuals.

    Minimises sum_i w_i ((a + b n_i - T_i) / T_i)^2: relative residuals, so 1 KB and 64 MB
    weigh alike.  With `robust`, w_i are Huber weights by iteratively reweighted least squares
    (k = 1.345 times the residuals' scale 1.4826 * median |r|): a size that a busy machine
    slowed down tenfold is down-weighted instead of bending the line.  A negative intercept
    or slope is not physical: the fit is then redone with it fixed at 0.  rel_rmse is the
    root mean square of (fit - T) / T over all points.
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("a fit needs at least two (size, time) points")
    if any(t <= 0 for t in times):
        raise ValueError("times must be positive")
    weights = [1.0] * len(sizes)
    a, b = _weighted_fit(sizes, times, weights)
    for _ in range(20 if robust and len(sizes) > 3 else 0):
        residuals = [((a + b * n) - t) / t for n, t in zip(sizes, times)]
        scale = 1.4826 * statistics.median(abs(r) for r in residuals)
        if scale <= 1e-12:
            break
        weights = [1.0 if abs(r) <= HUBER_K * scale else HUBER_K * scale / abs(r) for r in residuals]
        new = _weighted_fit(sizes, times, weights)
        if abs(new[0] - a) <= 1e-9 * max(abs(a), 1e-12) and abs(new[1] - b) <= 1e-9 * max(abs(b), 1e-18):
            a, b = new
            break
        a, b = new
    residuals = [((a + b * n) - t) / t for n, t in zip(sizes, times)]
    return a, b, math.sqrt(sum(r * r for r in residuals) / len(residuals))


@dataclass(frozen=True)
class CalibrationFit:
    """One transport's fitted parameters on one topology, as the store keeps them."""

    framework: str
    mode: str
    transport: str
    collective: str  # allreduce or pushpull
    algorithm: str  # the perfmodel algorithm used to invert the fit
    device_kind: str
    nodes: int
    workers_per_node: int
    world_size: int
    servers: int
    fit_a_s: float  # T(n) = a + b n, the whole collective
    fit_b_s_per_byte: float
    rel_rmse: float
    alpha_s: float  # link level
    beta_s_per_byte: float
    gamma_s_per_byte: float
    n_sizes: int
    repeats: int
    bandwidth: str = ""  # the emulated link it was measured on ("" unshaped / a real network)
    latency: str = ""
    contention: float = 0.0  # kappa: the share of its pace backward loses while a transfer runs
    transfer_contention: float = 0.0  # kappa_c: the share of its pace a transfer loses beside backward

    @property
    def cost(self) -> LinkCost:
        return LinkCost(self.alpha_s, self.beta_s_per_byte, self.gamma_s_per_byte)

    @property
    def shares(self) -> tuple[float, float]:
        """(kappa, kappa_c), `perfmodel.predict`'s contention arguments."""
        return self.contention or 0.0, self.transfer_contention or 0.0

    def as_row(self) -> dict:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Mapping) -> "CalibrationFit":
        names = cls.__dataclass_fields__
        keys = set(row.keys())
        defaults = {"bandwidth": "", "latency": "", "contention": 0.0,  # columns added later
                    "transfer_contention": 0.0}
        return cls(**{k: defaults[k] if k in defaults and row[k] is None else row[k]
                      for k in names if k in keys})

    def predicted(self, nbytes: float) -> float:
        """The fitted whole-collective time T(n) = a + b n."""
        return self.fit_a_s + self.fit_b_s_per_byte * nbytes


def fit_gamma(reduction_points: Mapping[int, Sequence[float]] | None) -> float:
    """Seconds per byte of a local elementwise sum: the slope of `fit_linear` (0 without data)."""
    if not reduction_points:
        return 0.0
    summary = summarize(reduction_points)
    if len(summary) < 2:
        return 0.0
    _, b, _ = fit_linear([s.nbytes for s in summary], [s.median for s in summary])
    return b


def fit_calibration(points: Mapping[int, Sequence[float]], *, framework: str, mode: str,
                    transport: str, collective: str, algorithm: str, device_kind: str,
                    nodes: int, workers_per_node: int, servers: int = 0,
                    reduction_points: Mapping[int, Sequence[float]] | None = None,
                    bandwidth: str = "", latency: str = "") -> CalibrationFit:
    """Fit T(n) = a + b n to the medians, gamma to the reduction timings, and invert to
    link-level alpha, beta for `algorithm` on p = nodes * workers_per_node workers."""
    summary = summarize(points)
    a, b, rel = fit_linear([s.nbytes for s in summary], [s.median for s in summary])
    gamma = fit_gamma(reduction_points)
    p = nodes * workers_per_node
    link = invert_fit(a, b, algorithm, p, max(servers, 1), gamma)
    if link.beta == 0.0 and gamma > 0:  # the reduction alone explains the slope: fold it in
        link = invert_fit(a, b, algorithm, p, max(servers, 1), 0.0)
    return CalibrationFit(framework, mode, transport, collective, algorithm, device_kind, nodes,
                          workers_per_node, p, servers, a, b, rel, link.alpha, link.beta, link.gamma,
                          len(summary), max((s.repeats for s in summary), default=0),
                          bandwidth or "", latency or "")


# --------------------------------------------------------------------------- bracketing

def pool_samples(*samples: Mapping[int, Sequence[float]] | None) -> dict[int, list[float]]:
    """Each size's timings from several calibrations of one transport, concatenated.

    `compare --calibrate` calibrates each scheme before its runs and again after them and fits
    the pooled timings: on a shared machine a whole calibration (30-60 s) can fall in a slow
    stretch (one MXNet calibration fitted a = 740 us per key where eleven others fitted
    445-561 us, and the predictions of its runs missed by 21%); a second one minutes later
    halves such a bias, and the pooled fit describes the span the runs were measured in, not
    only its first minute."""
    pooled: dict[int, list[float]] = {}
    for points in samples:
        for nbytes, values in (points or {}).items():
            pooled.setdefault(int(nbytes), []).extend(float(v) for v in values)
    return pooled


def pool_probes(*probes: Mapping | None) -> dict | None:
    """Contention probes of the same network taken at different times, as one probe: the
    rounds concatenated (each round's alone, sending and exchange times stay together, as
    `fit_contention` pairs them; the exchange and replay times only where every probe has
    them), the ready times the element-wise mean.  None unless every probe is there and they
    timed the same gradients."""
    if not probes or any(not p for p in probes) or len({tuple(p["bytes"]) for p in probes}) != 1:
        return None
    ready = [p.get("ready_s") or [] for p in probes]
    exchange = {key: [t for p in probes for t in p[key]] for key in ("done_s", "replay_s")
                if all(len(p.get(key) or []) == len(p["with_s"]) for p in probes)}
    return {"bytes": list(probes[0]["bytes"]),
            "alone_s": [t for p in probes for t in p["alone_s"]],
            "with_s": [t for p in probes for t in p["with_s"]], **exchange,
            "ready_s": ([statistics.fmean(times) for times in zip(*ready)]
                        if all(len(r) == len(ready[0]) for r in ready) else ready[0])}


def drift_line(before: CalibrationFit, after: CalibrationFit) -> str:
    """How a transport moved between two calibrations: the fitted per-message cost a and
    per-byte cost b, before -> after and the change in percent."""
    def change(old: float, new: float) -> str:
        return f"{(new / old - 1) * 100:+.0f}%" if old > 0 else "n/a"

    return (f"a {before.fit_a_s * 1e6:.1f} -> {after.fit_a_s * 1e6:.1f} us "
            f"({change(before.fit_a_s, after.fit_a_s)}), b {before.fit_b_s_per_byte * 1e9:.3f} -> "
            f"{after.fit_b_s_per_byte * 1e9:.3f} ns/B ({change(before.fit_b_s_per_byte, after.fit_b_s_per_byte)})")


KAPPA_C_STEPS = 50  # kappa_c searched on a grid of 1/50 (the probe's noise is coarser)


def fit_contention(probe: Mapping | None, scheme: Mapping | None,
                   fit: CalibrationFit) -> tuple[float, float]:
    """(kappa, kappa_c) from a contention probe: backward alone, and with each gradient
    (`bytes`, in send order) sent at its ready time, in alternating rounds, with when
    backward ended (`with_s`) and when the exchange was back (`done_s`).  The shares at
    which the model's own schedule (`perfmodel.contended_schedule`) of those messages, as
    the scheme sends per-tensor messages (its merge, e.g. Horovod's cycles) at the fitted
    cost, ends backward and the exchange when the probe's did::

        W(t_b) = t_a (1 + slowdown_backward),   max(W(t_b), e_last) = t_a (1 + slowdown_done)

    kappa by bisection for each kappa_c on a grid (backward's end grows with both); kappa_c
    the least on the grid whose two ends are within two standard errors of the probe's
    (pairs along a curve end both alike, and the probe cannot tell them apart), else the
    pair nearest in those units; so the shares mean in the prediction what they meant in the
    probe.  Each slowdown is the median over rounds of that round's ratio to its own alone
    run: a shared 2-core VM drifts by tens of percent between seconds, and the halves of a
    round see the same machine (four Horovod-gloo calibrations: 8-48% as a ratio of medians,
    8-30% paired).  t_a: median alone.  Where the probe also replayed the exchange without
    backward (`replay_s`), the exchange end is first moved by how much later (or sooner)
    the replay ended than the model's uncontended schedule of it: that part is the
    exchange's own (Horovod over MPI ended its replay 3.5 ms after the model's schedule, gloo
    2 ms; without the replay the fit read kappa_c 0.72 and 0.2 from that probe, with it 0 and
    0).  (0, 0) without a probe or communication;
    kappa_c = 0 for a probe without exchange ends; kappa 1 when even a backward stalled by
    every transfer would end sooner than the probe's."""
    if not probe or not probe.get("alone_s") or not probe.get("with_s"):
        return 0.0, 0.0
    t_a = statistics.median(probe["alone_s"])
    described = {**(scheme or {}), "granularity": "tensor", "overlap": True, "servers": 0,
                 "algorithm": fit.algorithm if fit.algorithm != "ps" else "ring"}
    if fit.algorithm == "ps":
        described.update(algorithm="ps", servers=max(fit.servers, 1))
    probe_scheme = pm.Scheme.from_dict(described)
    comm_time = pm.comm_time_function(probe_scheme.algorithm, fit.world_size, fit.cost,
                                      max(1, probe_scheme.servers))
    grads = [pm.Grad(f"probe{i}", f"probe{i}", int(n), r)
             for i, (n, r) in enumerate(zip(probe["bytes"], probe.get("ready_s") or []))]
    if t_a <= 0 or not any(comm_time(g.nbytes) > 0 for g in grads):
        return 0.0, 0.0

    def ratios(key: str) -> list[float]:
        return [t / a for a, t in zip(probe["alone_s"], probe[key]) if a > 0]

    def target(key: str) -> float:
        return t_a * statistics.median(ratios(key))

    def ends(kappa: float, kappa_c: float) -> tuple[float, float]:
        transfers, backward_end = pm.contended_schedule(grads, probe_scheme, comm_time, t_a, kappa, kappa_c)
        return backward_end, max([backward_end] + [t.end for t in transfers])

    def kappa_for(kappa_c: float, backward_end: float) -> float:
        if ends(0.0, kappa_c)[0] >= backward_end:
            return 0.0
        if ends(1.0, kappa_c)[0] <= backward_end:
            return 1.0
        low, high = 0.0, 1.0
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (middle, high) if ends(middle, kappa_c)[0] < backward_end else (low, middle)
        return (low + high) / 2

    backward_end = target("with_s")
    if len(probe.get("done_s") or []) != len(probe["with_s"]):
        return kappa_for(0.0, backward_end), 0.0
    exchange_end = target("done_s")
    tolerances = [2 * t_a * max(median_standard_error(ratios(key)), 1e-3) for key in ("with_s", "done_s")]
    replayed = probe.get("replay_s") or []
    if len(replayed) == len(probe["with_s"]):
        # The exchange alone ends `offset` later than the model's schedule of it: not
        # contention, so the sending rounds' exchange end is compared without it.
        alone_transfers, _ = pm.contended_schedule(grads, probe_scheme, comm_time, t_a, 0.0, 0.0)
        offset = statistics.median(replayed) - max([0.0] + [t.end for t in alone_transfers])
        exchange_end -= offset
        tolerances[1] = math.hypot(tolerances[1], 2 * max(median_standard_error(replayed), 1e-3 * t_a))
    candidates = []
    for step in range(KAPPA_C_STEPS):  # kappa_c < 1, so the pair is never (1, 1)
        kappa_c = step / KAPPA_C_STEPS
        kappa = kappa_for(kappa_c, backward_end)
        misses = [abs(end - aim) / tolerance for end, aim, tolerance
                  in zip(ends(kappa, kappa_c), (backward_end, exchange_end), tolerances)]
        if max(misses) <= 1.0:
            return kappa, kappa_c  # the least transfer contention the probe cannot tell from its own
        candidates.append((max(misses), kappa_c, kappa))
    _, kappa_c, kappa = min(candidates)
    return kappa, kappa_c


def median_standard_error(values: Sequence[float]) -> float:
    """Standard error of the median of `values`: 1.2533 sigma / sqrt(n), sigma from the
    median absolute deviation (1.4826 MAD), robust to the odd slow round; 0 for fewer than
    two values."""
    if len(values) < 2:
        return 0.0
    centre = statistics.median(values)
    sigma = 1.4826 * statistics.median(abs(v - centre) for v in values)
    return 1.2533 * sigma / math.sqrt(len(values))


# --------------------------------------------------------------------------- lookup

def lookup(fits: Iterable[CalibrationFit], *, framework: str, transport: str | None,
           world_size: int, nodes: int, device_kind: str | None, bandwidth: str | None = None,
           latency: str | None = None, mode: str | None = None) -> tuple[CalibrationFit, str] | None:
    """The calibration to use for a run, and how it matched; None when nothing fits.

    Preference: the same scheme (framework and, when given, mode) on the same topology and
    links (emulated bandwidth and latency); the same transport (another scheme sharing it,
    e.g. two schemes over gloo) there; the same scheme or transport on the same topology at
    other links, rescaled to the run's (`relink`); then the same scheme, then the same
    transport, at another world size (link-level alpha, beta re-used with this p's
    coefficients; rescaled too).  Always the same device kind.  Another mode of the same
    framework is not the same scheme: tf:ps priced with tf:collective's ring over gRPC
    predicted 14 ms of push/pull against 84 ms measured.
    """
    fits = [f for f in fits if device_kind is None or f.device_kind == device_kind]
    links = (bandwidth or "", latency or "")

    def same_scheme(f: CalibrationFit) -> bool:
        return f.framework == framework and (mode is None or f.mode == mode)

    def same_links(f: CalibrationFit) -> bool:
        return (f.bandwidth or "", f.latency or "") == links

    def topology(f: CalibrationFit) -> bool:
        return f.world_size == world_size and f.nodes == nodes

    tiers = [
        ("calibrated", lambda f: same_scheme(f) and topology(f) and same_links(f)),
        ("calibrated (same transport)", lambda f: transport is not None and f.transport == transport
         and topology(f) and same_links(f)),
        ("calibrated (other links)", lambda f: same_scheme(f) and topology(f)),
        ("calibrated (same transport, other links)", lambda f: transport is not None
         and f.transport == transport and topology(f)),
        ("calibrated (other world size)", same_scheme),
        ("calibrated (same transport, other world size)", lambda f: transport is not None and f.transport == transport),
    ]
    for how, accept in tiers:
        found = [f for f in fits if accept(f)]
        if found:
            found.sort(key=lambda f: (abs(f.world_size - world_size), not same_links(f),
                                      not same_scheme(f)))
            fit = found[0]
            return (fit, how) if same_links(fit) else (relink(fit, *links), how)
    return None


# Payload bytes per byte on the wire for TCP/IPv4 over 1500-byte-MTU Ethernet: 1448 of every
# 1514 (Ethernet 14, IP 20, TCP with timestamps 32 bytes of headers). A link's bandwidth is
# its wire rate (what tc shapes, what a NIC is sold at); messages see this share of it.
PAYLOAD_EFFICIENCY = 1448 / 1514


def relink(fit: CalibrationFit, bandwidth: str, latency: str) -> CalibrationFit:
    """The fit moved to other emulated links: the link's share of beta (1 / its payload
    rate, none when unshaped) is replaced by the new link's, and its one-way latency in alpha
    too; what the software stack costs per byte and per message stays.  This is what lets a
    calibration at one bandwidth predict another, e.g. the report's prediction line across a
    bandwidth sweep."""
    def per_byte(text: str) -> float:
        return 1.0 / (parse_bandwidth(text) * PAYLOAD_EFFICIENCY) if text else 0.0

    def seconds(text: str) -> float:
        return parse_latency(text) if text else 0.0

    beta = max(fit.beta_s_per_byte - per_byte(fit.bandwidth), 0.0) + per_byte(bandwidth)
    alpha = max(fit.alpha_s - seconds(fit.latency), 0.0) + seconds(latency)
    return replace(fit, alpha_s=alpha, beta_s_per_byte=beta, bandwidth=bandwidth, latency=latency)


# --------------------------------------------------------------------------- output

def _human_bytes(n: int) -> str:
    for unit, size in (("G", KIB ** 3), ("M", KIB ** 2), ("K", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def format_points(fit: CalibrationFit, points: Mapping[int, Sequence[float]]) -> str:
    """An nccl-tests-like table: size, count (float32), time, algbw, busbw, and the fit."""
    collective = fit.collective
    lines = [f"# {fit.framework}:{fit.mode}  transport {fit.transport}  {collective}  "
             f"p = {fit.world_size} ({fit.nodes} node(s) x {fit.workers_per_node})",
             f"# {'size':>8} {'count':>10} {'type':>7} {'time(us)':>11} {'p10-p90(us)':>17} "
             f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'fit(us)':>10}"]
    for s in summarize(points):
        algo = algbw(s.nbytes, s.median) / 1e9
        bus = busbw(s.nbytes, s.median, collective, fit.world_size) / 1e9
        lines.append(f"  {_human_bytes(s.nbytes):>8} {s.nbytes // 4:>10} {'float':>7} {s.median * 1e6:>11.1f} "
                     f"{f'{s.p10 * 1e6:.0f}-{s.p90 * 1e6:.0f}':>17} {algo:>11.3f} {bus:>11.3f} "
                     f"{fit.predicted(s.nbytes) * 1e6:>10.1f}")
    lines.append(f"# fit T(n) = a + b n: a = {fit.fit_a_s * 1e6:.1f} us, b = {fit.fit_b_s_per_byte * 1e9:.4f} ns/B "
                 f"(1/b = {1 / fit.fit_b_s_per_byte / 1e9 if fit.fit_b_s_per_byte else math.inf:.3f} GB/s), "
                 f"relative rms error {fit.rel_rmse * 100:.1f} %")
    lines.append(f"# {fit.algorithm}: alpha = {fit.alpha_s * 1e6:.2f} us, beta = {fit.beta_s_per_byte * 1e9:.4f} ns/B "
                 f"({link_gbps(fit.beta_s_per_byte)}), gamma = {fit.gamma_s_per_byte * 1e9:.4f} ns/B")
    lines.append(f"# contention: kappa = {fit.contention:.2f}, kappa_c = {fit.transfer_contention:.2f} (the "
                 "shares of their pace backward and a transfer lose while both run)")
    return "\n".join(lines)


def link_gbps(beta: float) -> str:
    """1/beta as a link speed in Gbit/s."""
    return "inf Gbit/s" if beta <= 0 else f"{8 / beta / 1e9:.2f} Gbit/s"
