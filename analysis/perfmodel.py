"""The performance model of one synchronous SGD iteration (Shi, Wang, Chu; DataCom 2018).

Pure functions of numbers: no I/O, no framework, no NumPy or pandas (the worker imports this
module inside every framework's environment to split backward time by FLOPs).  Times are in
seconds, sizes in bytes.  Notation:

    t_io   read (and decode) one batch             t_f   forward
    t_h2d  copy the batch to the device            t_b   backward (all layers)
    t_u    apply the update                        t_c   aggregate the gradients
    b_l    backward time of layer l, layers numbered in backward order (l = 1 is the last
           layer of the network, whose gradient is produced first)
    tau_l  = b_1 + ... + b_l: when layer l's gradient is final, counted from backward's start
    n      message size in bytes; p workers; S parameter servers
    alpha  seconds per message (latency); beta seconds per byte on a link (1 / bandwidth);
    gamma  seconds per byte reduced (summing two buffers)

Iteration time
--------------
one worker (`single_worker_time`)::

    t_iter = t_io' + t_h2d + t_f + t_b + t_u
    t_io'  = max(0, t_io - (t_h2d + t_f + t_b + t_u))   with prefetching, else t_io

  a prefetching reader works while the rest of the iteration runs, so I/O costs only the part
  that outlasts it.

p synchronous workers without overlap (`no_overlap_time`)::

    t_iter = t_io' + t_h2d + t_f + t_b + t_c + t_u,   t_c = T_coll(n_total, p)

layer-wise overlap, wait-free backprop (`wfbp_schedule`, `overlap_time`): message i (one
layer's gradient, or a bucket of them) is ready at r_i; in send order::

    s_i = max(r_i, e_{i-1}),   e_i = s_i + c_i,   e_0 = 0
    t_iter = t_io' + t_h2d + t_f + max(tau_L, e_last) + t_u

  it starts once its gradient is final AND the previous transfer has finished; only
  max(0, e_last - tau_L), the communication that outlasts backward, is exposed.  Since
  e_last >= tau_L, overlap never makes an iteration shorter than forward plus backward.

merging small gradients: `merge_by_threshold` (Horovod's fusion buffer, PyTorch DDP's
buckets: consecutive gradients in send order fill a buffer that is sent when it holds at least
the threshold; ready when its last member is) and `merge_greedy` (MG-WFBP-style: merge the next
gradient into the pending message when that does not make both finish later, which saves one
alpha whenever the next gradient is ready before the pending message could start anyway) and
`merge_by_cycle` (Horovod's background thread: at each cycle start everything ready goes as
one message; t_{k+1} = t_k + max(cycle, T(n_k))).

contention (`contended_schedule`): on a CPU host whose cores the ranks' compute fills, the
communication stack is CPU work too.  Processor sharing with two calibrated shares: kappa,
the share of its pace backward loses while a transfer runs beside it, and kappa_c, the share
a transfer loses while backward runs.  Backward's progress P(t), counted in seconds of
uncontended backward, grows at rate 1 - kappa beside a transfer and 1 otherwise; a
transfer of cost c advances at 1 - kappa_c while backward runs and 1 after it; message i
starts once backward has made its gradient and the previous transfer has ended::

    s_i = max(W(r_i), e_{i-1}),   W(r) = the first t with P(t) = r
    e_i = the time transfer i has done c_i of its work
    t_b' = W(t_b),   t_iter = t_io' + t_h2d + t_f + max(t_b', e_last) + t_u

  kappa = kappa_c = 0 is plain WFBP (communication on its own engine: a GPU's copy engines,
  a NIC's DMA); kappa = 1, kappa_c = 0 stalls backward while anything is sent, so nothing
  hides: max(t_b', e_last) = t_b + sum c_i, the time without overlap.

Communication cost (`coefficients`, `collective_time`); every model is linear in n::

    T(n) = k_a * alpha + n * (k_b * beta + k_g * gamma)

    point to point                 alpha + n beta
    ring all-reduce                2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    binomial tree (reduce + bcast) 2 ceil(log2 p) (alpha + n beta) + ceil(log2 p) n gamma
    recursive doubling             ceil(log2 p) (alpha + n beta + n gamma)
    halving-doubling (Rabenseifner) 2 ceil(log2 p) alpha + 2(p-1)/p n beta + (p-1)/p n gamma
    parameter server, S servers    2 alpha + 2 max(p/S, 1) n beta + (p-1)/S n gamma

  Parameter server: each of S servers holds n/S of the parameters on its own link; a push
  brings p * n/S bytes over every server link while each worker link carries n, so the
  busier of the two bounds each direction (push, then pull); each server sums p slices of
  n/S bytes.

Scaling (weak, fixed per-worker batch): S(N) = N t(1) / t(N), E(N) = S(N) / N.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

ALGORITHMS: tuple[str, ...] = ("ring", "tree", "recursive_doubling", "halving_doubling", "ps", "p2p")
GRANULARITIES: tuple[str, ...] = ("whole", "layer", "tensor", "bucket")
MERGES: tuple[str | None, ...] = (None, "greedy", "cycle")


# --------------------------------------------------------------------------- costs

@dataclass(frozen=True)
class LinkCost:
    """The alpha-beta(-gamma) parameters of one transport.

    alpha: seconds per message; beta: seconds per byte on one link; gamma: seconds per byte
    reduced.  ``LinkCost()`` costs nothing (ideal network).
    """

    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def _check_p(p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"the number of workers must be an int >= 1, got {p!r}")


def point_to_point(n: float, cost: LinkCost) -> float:
    """One message of n bytes: T = alpha + n beta (0 for an empty message)."""
    return 0.0 if n <= 0 else cost.alpha + n * cost.beta


def ring_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Ring all-reduce: T = 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma.

    p-1 reduce-scatter steps then p-1 all-gather steps, each moving n/p bytes per worker; the
    reduce-scatter steps also sum n/p bytes.  0 for p = 1 or n = 0.
    """
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    return 2 * (p - 1) * cost.alpha + 2 * (p - 1) / p * n * cost.beta + (p - 1) / p * n * cost.gamma


def tree_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Binomial-tree reduce to a root, then broadcast: T = 2 ceil(log2 p)(alpha + n beta) +
    ceil(log2 p) n gamma (the whole message on every level)."""
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    levels = _log2_ceil(p)
    return 2 * levels * (cost.alpha + n * cost.beta) + levels * n * cost.gamma


def recursive_doubling_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Recursive doubling: ceil(log2 p) exchange-and-sum rounds of the whole message:
    T = ceil(log2 p)(alpha + n beta + n gamma)."""
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    return _log2_ceil(p) * (cost.alpha + n * cost.beta + n * cost.gamma)


def halving_doubling_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Rabenseifner (recursive halving reduce-scatter, recursive doubling all-gather):
    T = 2 ceil(log2 p) alpha + 2(p-1)/p n beta + (p-1)/p n gamma."""
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    return 2 * _log2_ceil(p) * cost.alpha + 2 * (p - 1) / p * n * cost.beta + (p - 1) / p * n * cost.gamma


def ps_pushpull(n: float, p: int, servers: int, cost: LinkCost) -> float:
    """Synchronous parameter server, push then pull:
    T = 2 alpha + 2 max(p/S, 1) n beta + (p-1)/S n gamma.

    Every server link carries p * n/S bytes each way (every worker's slice), every worker link
    n bytes; the busier link bounds each direction.  Unlike the all-reduces, one worker still
    pays the round trip (p = 1 gives 2 alpha + 2 n beta).
    """
    _check_p(p)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"a parameter-server scheme needs servers >= 1, got {servers!r}")
    if n <= 0:
        return 0.0
    return 2 * cost.alpha + 2 * max(p / servers, 1.0) * n * cost.beta + (p - 1) / servers * n * cost.gamma


def coefficients(algorithm: str, p: int, servers: int = 1) -> tuple[float, float, float]:
    """(k_a, k_b, k_g) with T(n) = k_a alpha + n (k_b beta + k_g gamma) for n > 0.

    Calibration fits T(n) = a + b n and inverts these: alpha = a / k_a,
    beta = (b - k_g gamma) / k_b.
    """
    _check_p(p)
    if algorithm == "p2p":
        return 1.0, 1.0, 0.0
    if algorithm == "ps":
        if servers < 1:
            raise ValueError(f"a parameter-server scheme needs servers >= 1, got {servers!r}")
        return 2.0, 2 * max(p / servers, 1.0), (p - 1) / servers
    if p == 1:
        return 0.0, 0.0, 0.0
    levels = _log2_ceil(p)
    if algorithm == "ring":
        return 2.0 * (p - 1), 2 * (p - 1) / p, (p - 1) / p
    if algorithm == "tree":
        return 2.0 * levels, 2.0 * levels, float(levels)
    if algorithm == "recursive_doubling":
        return float(levels), float(levels), float(levels)
    if algorithm == "halving_doubling":
        return 2.0 * levels, 2 * (p - 1) / p, (p - 1) / p
    raise ValueError(f"unknown collective algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def collective_time(algorithm: str, n: float, p: int, cost: LinkCost, servers: int = 1) -> float:
    """T(n) of `algorithm` for p workers: k_a alpha + n (k_b beta + k_g gamma); 0 for n <= 0."""
    if n <= 0:
        return 0.0
    k_a, k_b, k_g = coefficients(algorithm, p, servers)
    return k_a * cost.alpha + n * (k_b * cost.beta + k_g * cost.gamma)


def comm_time_function(algorithm: str, p: int, cost: LinkCost, servers: int = 1) -> Callable[[float], float]:
    """n -> T(n) with the coefficients computed once (the inner loop of the what-if grid)."""
    if algorithm != "ps" and p == 1:
        return lambda n: 0.0
    k_a, k_b, k_g = coefficients(algorithm, p, servers)
    latency, per_byte = k_a * cost.alpha, k_b * cost.beta + k_g * cost.gamma
    return lambda n: 0.0 if n <= 0 else latency + n * per_byte


def invert_fit(a: float, b: float, algorithm: str, p: int, servers: int = 1,
               gamma: float = 0.0) -> LinkCost:
    """The link-level alpha, beta from a fitted T(n) = a + b n and a known gamma.

    alpha = a / k_a, beta = (b - k_g gamma) / k_b (clipped at 0: noise can make the
    reduction share exceed the slope).
    """
    k_a, k_b, k_g = coefficients(algorithm, p, servers)
    if k_a <= 0 or k_b <= 0:
        raise ValueError(f"{algorithm} with p = {p} moves nothing: cannot calibrate from it")
    return LinkCost(alpha=max(0.0, a / k_a), beta=max(0.0, (b - k_g * gamma) / k_b), gamma=gamma)


# --------------------------------------------------------------------------- iteration

def exposed_io(t_io: float, t_rest: float, prefetch: bool = True) -> float:
    """t_io' = max(0, t_io - t_rest) with prefetching (reading overlaps the rest), else t_io."""
    return max(0.0, t_io - t_rest) if prefetch else t_io


def single_worker_time(t_io: float, t_h2d: float, t_f: float, t_b: float, t_u: float,
                       prefetch: bool = True) -> float:
    """t_iter = t_io' + t_h2d + t_f + t_b + t_u, t_io' = max(0, t_io - (t_h2d + t_f + t_b + t_u))
    with prefetching (else t_io' = t_io)."""
    rest = t_h2d + t_f + t_b + t_u
    return exposed_io(t_io, rest, prefetch) + rest


def no_overlap_time(t_io: float, t_h2d: float, t_f: float, t_b: float, t_c: float, t_u: float,
                    prefetch: bool = True) -> float:
    """Synchronous workers, communication after backward:
    t_iter = t_io' + t_h2d + t_f + t_b + t_c + t_u (t_io' hidden behind all of the rest)."""
    rest = t_h2d + t_f + t_b + t_c + t_u
    return exposed_io(t_io, rest, prefetch) + rest


def ready_times(layer_backward: Sequence[float]) -> list[float]:
    """tau_l = b_1 + ... + b_l: when each layer's gradient is final (backward order)."""
    out, total = [], 0.0
    for b in layer_backward:
        if b < 0:
            raise ValueError(f"a backward time cannot be negative, got {b}")
        total += b
        out.append(total)
    return out


def wfbp_schedule(ready: Sequence[float], comm: Sequence[float]) -> list[tuple[float, float]]:
    """Wait-free backprop: (start, end) of each message in send order.

    s_i = max(r_i, e_{i-1}), e_i = s_i + c_i, e_0 = 0: a transfer starts once its gradient is
    ready and the link is free (transfers are serialised, in send order).
    """
    if len(ready) != len(comm):
        raise ValueError(f"{len(ready)} ready times but {len(comm)} communication times")
    schedule, end = [], 0.0
    for r, c in zip(ready, comm):
        if c < 0:
            raise ValueError(f"a communication time cannot be negative, got {c}")
        start = max(r, end)
        end = start + c
        schedule.append((start, end))
    return schedule


def wfbp_backward_comm(layer_backward: Sequence[float], comm: Sequence[float]) -> float:
    """Backward plus the communication that outlasts it, one message per layer:
    max(tau_L, e_L) with the `wfbp_schedule` of ready times tau_l."""
    tau = ready_times(layer_backward)
    schedule = wfbp_schedule(tau, comm)
    return max(tau[-1] if tau else 0.0, schedule[-1][1] if schedule else 0.0)


def overlap_time(t_io: float, t_h2d: float, t_f: float, layer_backward: Sequence[float],
                 comm: Sequence[float], t_u: float, prefetch: bool = True) -> float:
    """Layer-wise overlap (WFBP), one message per layer:
    t_iter = t_io' + t_h2d + t_f + max(tau_L, e_L) + t_u."""
    rest = t_h2d + t_f + wfbp_backward_comm(layer_backward, comm) + t_u
    return exposed_io(t_io, rest, prefetch) + rest


def exposed_comm(layer_backward: Sequence[float], comm: Sequence[float]) -> float:
    """The communication not hidden behind backward: max(0, e_L - tau_L)."""
    tau = ready_times(layer_backward)
    return wfbp_backward_comm(layer_backward, comm) - (tau[-1] if tau else 0.0)


# --------------------------------------------------------------------------- messages

@dataclass(frozen=True)
class Grad:
    """One gradient tensor: its name, layer, size and when backward has made it final."""

    name: str
    layer: str
    nbytes: int
    ready: float


@dataclass(frozen=True)
class Message:
    """What is sent at once: one or more gradients, ready when the last of them is."""

    nbytes: int
    ready: float
    members: tuple[str, ...]


@dataclass(frozen=True)
class Transfer:
    """A scheduled message: its size, when it was ready, started and ended."""

    nbytes: int
    ready: float
    start: float
    end: float
    members: tuple[str, ...]


def _message(grads: Sequence[Grad]) -> Message:
    return Message(sum(g.nbytes for g in grads), max(g.ready for g in grads), tuple(g.name for g in grads))


def group_whole(grads: Sequence[Grad]) -> list[Message]:
    """The whole gradient as one message, ready when backward is done."""
    return [_message(grads)] if grads else []


def group_by_layer(grads: Sequence[Grad]) -> list[Message]:
    """One message per layer (its tensors together), in the order layers first appear."""
    layers: dict[str, list[Grad]] = {}
    for g in grads:
        layers.setdefault(g.layer, []).append(g)
    return [_message(members) for members in layers.values()]


def group_by_tensor(grads: Sequence[Grad]) -> list[Message]:
    """One message per gradient tensor, in the given send order."""
    return [_message([g]) for g in grads]


def merge_by_threshold(grads: Sequence[Grad], threshold: float,
                       first_threshold: float | None = None) -> list[Message]:
    """Fusion buffers / buckets: consecutive gradients (send order) join the current buffer,
    which is closed once it holds >= threshold bytes (the first one >= first_threshold, as
    PyTorch DDP's 1 MiB first bucket); a buffer is ready when its last member is.
    threshold <= 0 gives one message per tensor."""
    messages, current, size = [], [], 0
    cap = threshold if first_threshold is None else first_threshold
    for g in grads:
        current.append(g)
        size += g.nbytes
        if size >= cap:
            messages.append(_message(current))
            current, size, cap = [], 0, threshold
    if current:
        messages.append(_message(current))
    return messages


def merge_greedy(messages: Sequence[Message], comm_time: Callable[[float], float],
                 cap: float = 0) -> list[Message]:
    """MG-WFBP-style merging: walking the messages in send order, merge the next one into the
    pending message when sending them together ends no later than sending them apart (and,
    with cap > 0, the merged message stays within cap bytes, like a fusion buffer).

    Apart: e_a = max(r_a, e_prev) + T(n_a), e_b = max(r_b, e_a) + T(n_b); together:
    e_ab = max(r_a, r_b, e_prev) + T(n_a + n_b).  With T = alpha + n beta, merging saves one
    alpha whenever b is ready before a could start, the case MG-WFBP's rule targets.
    """
    merged: list[Message] = []
    end_prev = 0.0
    pending: Message | None = None
    for msg in messages:
        if pending is None:
            pending = msg
            continue
        end_a = max(pending.ready, end_prev) + comm_time(pending.nbytes)
        apart = max(msg.ready, end_a) + comm_time(msg.nbytes)
        together = max(pending.ready, msg.ready, end_prev) + comm_time(pending.nbytes + msg.nbytes)
        if together <= apart and (cap <= 0 or pending.nbytes + msg.nbytes <= cap):
            pending = Message(pending.nbytes + msg.nbytes, max(pending.ready, msg.ready),
                              pending.members + msg.members)
        else:
            merged.append(pending)
            end_prev = end_a
            pending = msg
    if pending is not None:
        merged.append(pending)
    return merged


def merge_by_cycle(messages: Sequence[Message], comm_time: Callable[[float], float],
                   cycle_s: float, cap: float = 0) -> list[Message]:
    """Horovod's background thread: it wakes at cycle starts and sends everything ready by
    then as one fused message (at most `cap` bytes when cap > 0); a cycle starts cycle_s after
    the previous one started or, when that cycle's transfer took longer, as soon as it ended:

        t_0 = 0,   t_{k+1} = t_k + max(cycle_s, T(n_k))   (n_k = 0 when nothing was ready)

    Each merged message is ready at its cycle start t_k, so `schedule` starts it there.  With
    T(n) >= cycle_s the thread never sleeps and this is "send what became ready while the
    previous transfer ran"; with tiny T it sends about once per cycle_s."""
    pending = list(messages)
    merged: list[Message] = []
    tick = 0.0
    while pending:
        if pending[0].ready > tick:  # nothing ready: sleep whole cycles until something is
            skipped = math.ceil((pending[0].ready - tick) / cycle_s) if cycle_s > 0 else 0
            tick = tick + skipped * cycle_s if cycle_s > 0 else pending[0].ready
        batch = []
        while pending and pending[0].ready <= tick and (
                not batch or cap <= 0 or sum(m.nbytes for m in batch) + pending[0].nbytes <= cap):
            batch.append(pending.pop(0))
        message = Message(sum(m.nbytes for m in batch), tick,
                          tuple(name for m in batch for name in m.members))
        merged.append(message)
        tick += max(cycle_s, comm_time(message.nbytes))
    return merged


# --------------------------------------------------------------------------- schemes

@dataclass(frozen=True)
class Scheme:
    """How a framework aggregates gradients, in the model's terms.

    overlap: messages start during backward (WFBP) instead of after it;
    granularity: what one message holds before merging: ``whole`` gradient, ``layer``,
      ``tensor``, or ``bucket`` (consecutive tensors up to bucket_bytes; the first bucket up
      to first_bucket_bytes when given);
    merge: None, ``greedy`` (MG-WFBP-style merging on top of the granularity), or ``cycle``
      (Horovod's background thread: what is ready at each cycle start goes as one message,
      `merge_by_cycle`);
    algorithm: the collective (see `coefficients`); servers: parameter servers for ``ps``;
    profile_granularity: how the framework's separated profile communicates (after backward),
      so a predicted comm phase is comparable with the measured one (default: granularity);
    cycle_s: a background thread that sends only at its cycle starts (Horovod): with merge
      ``cycle`` the cycles are simulated; otherwise each message waits half a cycle on
      average, r_i + cycle_s / 2.  With merge ``greedy`` or ``cycle`` and a bucket_bytes,
      merged messages stay within bucket_bytes (a fusion buffer).
    """

    name: str = "allreduce"
    overlap: bool = False
    granularity: str = "whole"
    bucket_bytes: int = 0
    first_bucket_bytes: int | None = None
    merge: str | None = None
    algorithm: str = "ring"
    servers: int = 0
    profile_granularity: str | None = None
    cycle_s: float = 0.0

    def __post_init__(self):
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"unknown granularity {self.granularity!r} (known: {', '.join(GRANULARITIES)})")
        if self.profile_granularity not in (None, *GRANULARITIES):
            raise ValueError(f"unknown profile granularity {self.profile_granularity!r}")
        if self.merge not in MERGES:
            raise ValueError(f"unknown merge {self.merge!r} (known: greedy)")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown collective algorithm {self.algorithm!r} (known: {', '.join(ALGORITHMS)})")
        if self.algorithm == "ps" and self.servers < 1:
            raise ValueError("a parameter-server scheme needs servers >= 1")
        if self.granularity == "bucket" and self.bucket_bytes <= 0:
            raise ValueError("a bucket scheme needs bucket_bytes > 0")
        if self.cycle_s < 0:
            raise ValueError("cycle_s cannot be negative")

    FIELDS = ("name", "overlap", "granularity", "bucket_bytes", "first_bucket_bytes", "merge",
              "algorithm", "servers", "profile_granularity", "cycle_s")

    @classmethod
    def from_dict(cls, data: dict) -> "Scheme":
        """From an adapter's ``comm_scheme()`` dict; keys the model does not use are ignored."""
        known = {k: data[k] for k in cls.FIELDS if k in data and data[k] is not None}
        if "cycle_s" not in known and data.get("cycle_ms") is not None:
            known["cycle_s"] = float(data["cycle_ms"]) / 1e3
        if "name" not in known and data.get("label"):
            known["name"] = str(data["label"])
        for key in ("bucket_bytes", "servers"):
            if key in known:
                known[key] = int(known[key])
        if "first_bucket_bytes" in known:
            known["first_bucket_bytes"] = int(known["first_bucket_bytes"])
        if "overlap" in known:
            known["overlap"] = bool(known["overlap"])
        return cls(**known)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def messages(self, grads: Sequence[Grad], comm_time: Callable[[float], float],
                 separate: bool = False) -> list[Message]:
        """The messages this scheme sends for `grads` (send order); `separate`: as its
        profile sends them after backward (`profile_granularity`, no merging)."""
        granularity = (self.profile_granularity or self.granularity) if separate else self.granularity
        if granularity == "whole":
            messages = group_whole(grads)
        elif granularity == "layer":
            messages = group_by_layer(grads)
        elif granularity == "tensor":
            messages = group_by_tensor(grads)
        else:
            messages = merge_by_threshold(grads, self.bucket_bytes, self.first_bucket_bytes)
        if separate:
            return messages
        if self.merge == "cycle":
            return merge_by_cycle(messages, comm_time, self.cycle_s, self.bucket_bytes)
        if self.cycle_s > 0:
            messages = [Message(m.nbytes, m.ready + self.cycle_s / 2, m.members) for m in messages]
        if self.merge == "greedy":
            messages = merge_greedy(messages, comm_time, self.bucket_bytes)
        return messages


def schedule(messages: Sequence[Message], comm_time: Callable[[float], float], overlap: bool,
             t_b: float) -> list[Transfer]:
    """Transfers of the messages in send order: WFBP (`wfbp_schedule`) with overlap, else
    every message ready when backward ends (t_b) and sent one after another."""
    ready = [m.ready if overlap else t_b for m in messages]
    times = wfbp_schedule(ready, [comm_time(m.nbytes) for m in messages])
    return [Transfer(m.nbytes, m.ready if overlap else t_b, s, e, m.members)
            for m, (s, e) in zip(messages, times)]


@dataclass(frozen=True)
class Profile:
    """One worker's measured compute: phase seconds and the gradients (send order) with their
    ready times counted from the start of backward (the last one at about t_backward)."""

    io: float
    h2d: float
    forward: float
    backward: float
    update: float
    grads: tuple[Grad, ...] = ()
    prefetch: bool = False  # True: `io` is the raw read time of a prefetching reader

    def scaled(self, compute_factor: float) -> "Profile":
        """The same profile with compute phases (not I/O) multiplied by compute_factor."""
        k = compute_factor
        return Profile(self.io, self.h2d * k, self.forward * k, self.backward * k, self.update * k,
                       tuple(Grad(g.name, g.layer, g.nbytes, g.ready * k) for g in self.grads), self.prefetch)


@dataclass(frozen=True)
class Prediction:
    """The model's iteration: total, phases, and the schedule of transfers."""

    iter_time: float
    phases: dict
    backward_comm: float  # backward plus the communication that outlasts it
    comm_total: float  # sum of transfer times in the scheme's normal (overlapped) run
    comm_exposed: float  # part of it not hidden behind backward
    transfers: tuple[Transfer, ...] = field(default_factory=tuple)

    @property
    def hidden_fraction(self) -> float | None:
        """Share of communication hidden behind backward, 0..1; None without communication."""
        if self.comm_total <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.comm_exposed / self.comm_total))


def contended_schedule(grads: Sequence[Grad], scheme: Scheme, comm_time: Callable[[float], float],
                       t_b: float, contention: float,
                       transfer_contention: float = 0.0) -> tuple[list[Transfer], float]:
    """Transfers and the end of backward when communication competes with backward for the
    same cores (a CPU host whose cores the ranks' compute already fills).

    kappa = `contention`: the share of its pace backward loses while a transfer runs;
    kappa_c = `transfer_contention`: the share of its pace a transfer loses while backward
    runs (module docstring; both calibrated by `analysis.calibration.fit_contention` from the
    probe of `launchers.calibrate`, which runs this same schedule).  Processor sharing,
    walked message by message in send order: between transfers backward runs alone; while
    both run, each goes at its own reduced pace; after backward the transfers go at full
    pace.  kappa = 1 with kappa_c = 0 stalls backward beside every transfer: t_b + sum c_i,
    the time without overlap, whenever transfers keep coming.  The messages (their merging,
    e.g. Horovod's cycles) are those of the uncontended ready times; without overlap nothing
    runs beside backward and the contention changes nothing.
    """
    for name, value in (("contention", contention), ("transfer contention", transfer_contention)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if contention == 1.0 and transfer_contention == 1.0:
        raise ValueError("contention and transfer contention cannot both be 1: neither would advance")
    messages = scheme.messages(grads, comm_time)
    if (contention == 0.0 and transfer_contention == 0.0) or not scheme.overlap or t_b <= 0:
        return schedule(messages, comm_time, scheme.overlap, t_b), t_b
    progress = _Progress(t_b, 1.0 - contention, 1.0 - transfer_contention)
    transfers, end = [], 0.0
    for message in messages:
        # ready after backward (a merge's later cycle): as long after backward's end
        ready = progress.wall_time(min(message.ready, t_b)) + max(0.0, message.ready - t_b)
        start = max(ready, end)
        end = progress.transfer(start, comm_time(message.nbytes))
        transfers.append(Transfer(message.nbytes, ready, start, end, message.members))
    return transfers, progress.wall_time(t_b)


class _Progress:
    """Backward's progress against wall time under `contended_schedule`: a piecewise-linear,
    non-decreasing P(t) kept as its breakpoints, rate 1 while backward runs alone and
    `backward_pace` beside a transfer; capped at t_b."""

    def __init__(self, t_b: float, backward_pace: float, transfer_pace: float):
        self.t_b, self.backward_pace, self.transfer_pace = t_b, backward_pace, transfer_pace
        self.walls, self.done, self.rates = [0.0], [0.0], [1.0]  # breakpoint, P there, rate after

    def wall_time(self, target: float) -> float:
        """W(target): the first time backward has done `target` seconds of work, given the
        transfers recorded so far (a later one starts after the last, too late to matter)."""
        i = bisect.bisect_left(self.done, target)
        if i == 0:
            return self.walls[0]
        return self.walls[i - 1] + (target - self.done[i - 1]) / self.rates[i - 1]

    def transfer(self, start: float, cost: float) -> float:
        """Record a transfer of `cost` seconds (alone) from `start` (never before the last
        one's end); returns its end."""
        done = min(self.t_b, self.done[-1] + (start - self.walls[-1]) * self.rates[-1])
        beside = (self.t_b - done) / self.backward_pace if self.backward_pace > 0 else math.inf
        alone = cost / self.transfer_pace if self.transfer_pace > 0 else math.inf
        if done >= self.t_b:
            end, points = start + cost, [(start, self.t_b, 1.0)]
        elif alone <= beside:  # the transfer ends first, backward still running
            end = start + alone
            points = [(start, done, self.backward_pace), (end, done + alone * self.backward_pace, 1.0)]
        else:  # backward ends first; the rest of the transfer at full pace
            end = start + beside + (cost - beside * self.transfer_pace)
            points = [(start, done, self.backward_pace), (start + beside, self.t_b, 1.0)]
        for wall, progress, rate in points:
            self.walls.append(wall)
            self.done.append(min(self.t_b, progress))
            self.rates.append(rate)
        return end


def predict(profile: Profile, scheme: Scheme, comm_time: Callable[[float], float],
            contention: float = 0.0, transfer_contention: float = 0.0) -> Prediction:
    """The model's iteration for one worker's profile under `scheme` with message cost
    `comm_time` (n -> seconds; `comm_time_function`), `contention` kappa (the share of its
    pace backward loses beside a transfer) and `transfer_contention` kappa_c (the share a
    transfer loses beside backward; `contended_schedule`).

    t_iter = t_io' + t_h2d + t_f + max(t_b', e_last) + t_u; e_last from `schedule` (overlap or
    not), t_b' backward's end beside the transfers (t_b without contention); t_io' hidden
    behind the rest when the profile's reader prefetches.  The predicted ``comm`` phase is
    the communication as the framework's separated profile runs it (after backward,
    `profile_granularity`), comparable with the measured one.
    """
    grads = list(profile.grads)
    t_b = profile.backward
    transfers, stretched = contended_schedule(grads, scheme, comm_time, t_b, contention, transfer_contention)
    comm_total = sum(t.end - t.start for t in transfers)
    end = max([stretched] + [t.end for t in transfers])
    comm_separate = sum(comm_time(m.nbytes) for m in scheme.messages(grads, comm_time, separate=True))
    rest = profile.h2d + profile.forward + end + profile.update
    io = exposed_io(profile.io, rest, profile.prefetch)
    phases = {"io": io, "h2d": profile.h2d, "forward": profile.forward, "backward": t_b,
              "comm": comm_separate, "update": profile.update}
    return Prediction(io + rest, phases, end, comm_total, end - t_b, tuple(transfers))


def single_worker_prediction(profile: Profile) -> Prediction:
    """No communication: `single_worker_time` of the profile."""
    t = single_worker_time(profile.io, profile.h2d, profile.forward, profile.backward, profile.update,
                           profile.prefetch)
    phases = {"io": t - (profile.h2d + profile.forward + profile.backward + profile.update),
              "h2d": profile.h2d, "forward": profile.forward, "backward": profile.backward,
              "comm": 0.0, "update": profile.update}
    return Prediction(t, phases, profile.backward, 0.0, 0.0, ())


# --------------------------------------------------------------------------- per-layer inputs

def backward_weights(rows: Iterable[tuple[str, int, bool]]) -> list[tuple[str, float, bool]]:
    """Relative backward cost of each layer, from (name, forward FLOPs, has parameters) in
    forward order: a layer with parameters computes the gradient of its input and of its
    weights (2 x its forward FLOPs), except the first one, which needs no input gradient
    (1 x); a layer without parameters 1 x its forward FLOPs."""
    out, first = [], True
    for name, flops, has_params in rows:
        weight = float(flops) * (2.0 if has_params and not first else 1.0)
        if has_params:
            first = False
        out.append((name, weight, has_params))
    return out


def split_backward_by_flops(t_b: float, rows: Iterable[tuple[str, int, bool]]) -> list[tuple[str, float]]:
    """Measured backward time t_b split over the layers with parameters, backward order.

    Layers are walked in backward order (reverse of `rows`, which is forward order); each
    layer's share of t_b is its `backward_weights` share; the time of layers without
    parameters goes to the next layer with parameters in backward order (its gradient is
    final only after them), trailing ones to the last.  The result sums to t_b.
    """
    weights = backward_weights(rows)
    total = sum(w for _, w, _ in weights)
    if total <= 0 or t_b <= 0:
        named = [name for name, _, has in weights if has]
        return [(name, t_b / len(named) if named else 0.0) for name in reversed(named)]
    out, pending = [], 0.0
    for name, w, has_params in reversed(weights):
        pending += w
        if has_params:
            out.append([name, t_b * pending / total])
            pending = 0.0
    if out and pending:
        out[-1][1] += t_b * pending / total
    return [(name, t) for name, t in out]


# --------------------------------------------------------------------------- scaling

def speedup(t_one: float, t_n: float, n: int) -> float:
    """Weak scaling: S(N) = N t(1) / t(N)."""
    if t_n <= 0:
        raise ValueError("t(N) must be positive")
    return n * t_one / t_n


def efficiency(speedup_n: float, n: int) -> float:
    """E(N) = S(N) / N (1 is ideal)."""
    if n < 1:
        raise ValueError("N must be at least 1")
    return speedup_n / n
