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
the threshold; ready when its last member is), `merge_greedy` (MG-WFBP, Shi, Chu, Li,
INFOCOM 2019: the next gradient b joins the pending message a when it is ready strictly less
than the startup cost a_T = T(n) - n T'(n) (k_a alpha) after a could start,
r_b < max(r_a, e_prev) + a_T; with an affine T exactly when sending them together ends
strictly sooner than apart; on a tie they end together either way, and apart a ends sooner)
and `merge_by_cycle` (Horovod's background thread: at each cycle start everything ready goes
as one message; t_{k+1} = t_k + max(cycle, T(n_k))).

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
    recursive doubling             L (alpha + n beta + n gamma)
    halving-doubling (Rabenseifner) 2 L alpha + 2(q-1)/q n beta + (q-1)/q n gamma
    parameter server, S servers    2 alpha + 2 max(p/S, 1) n beta + (p-1)/S n gamma

  with q = 2^floor(log2 p) and L = log2 q.  When p is not a power of two (r = p - q > 0)
  recursive doubling and halving-doubling first fold: r ranks send their whole vector to a
  partner among the q (alpha + n beta, summed: n gamma), the q run the algorithm, and the
  partners send the result back (alpha + n beta): + 2 alpha + 2 n beta + n gamma (Thakur,
  Rabenseifner, Gropp 2005, as MPICH does it).  Parameter server: each of S servers holds n/S
  of the parameters on its own link; a push brings p * n/S bytes over every server link
  while each worker link carries n, so the busier of the two bounds each direction (push,
  then pull); each server sums p slices of n/S bytes.

A cluster with a hierarchy (`Topology`, `Fabric`, `topology_cost`): N nodes of G workers,
p = N G; a worker reaches the others of its node over the intra-node link (alpha_i, beta_i:
PCIe, NVLink, shared memory), a node reaches the switch through its NIC (alpha_e, beta_e),
which everything its workers and servers send shares; the transport (gRPC, ps-lite, NCCL,
MPI, gloo) adds alpha_s per message and beta_s per byte and reaches `efficiency` e of a
link's bandwidth (b_i = beta_i / e, b_e = beta_e / e).  Each scheme is priced on the
topology its framework uses::

    scheme                        topology                          T(n)
    torch:ddp, cntk-style,        flat ring over all p ranks in     2(p-1) (a_hop + alpha_s)
    tf:collective,                node order: every step moves n/p  + 2(p-1)/p n (b_hop + beta_s)
    caffe-mpi-style, horovod      on every hop, one hop per node    + (p-1)/p n gamma
                                  leaves by the NIC, so the slowest a_hop = max(alpha_i, alpha_e)
                                  hop sets the pace                 b_hop = max(b_i, b_e)
                                                                    (a kind of hop counts only
                                                                    where it exists: G>1, N>1)
    horovod:hierarchical          two-level: ring reduce-scatter    2(G-1) (alpha_i + alpha_s)
                                  in the node, ring all-reduce of   + 2(G-1)/G n (b_i + beta_s)
                                  each 1/G shard across nodes (the  + 2(N-1) (alpha_e + alpha_s)
                                  G shards share the NIC), ring     + 2(N-1)/N n (b_e + beta_s / G)
                                  all-gather in the node            + ((G-1)/G + (N-1)/(N G)) n gamma
    tf:ps, mxnet:dist_sync        every worker pushes and pulls its 2 (a + alpha_s)
                                  whole gradient, n/S to each of S  + 2 n (max(L_i b_i, L_e b_e)
                                  servers spread over the nodes     + beta_s)
                                  (round robin) or on S machines of + (P-1)/S n gamma_server
                                  their own ('dedicated')
    mxnet:dist_device_sync        reduce over the node's G devices, the reduce-scatter and all-gather
                                  one push/pull per node (P = N),   terms of the two-level row (G,
                                  broadcast back                    no alpha_s, beta_s: in-process)
                                                                    + the ps row with W = 1

  Parameter servers, W pushing workers per node (G, or 1 after a local reduce), P = N W,
  s_j servers on node j: node j's NIC sends W n (S - s_j)/S (its workers' slices bound
  elsewhere) and receives s_j (P - W) n/S (its servers' slices from elsewhere), at once
  (full duplex); L_e = the largest of these over nodes and directions, in units of n
  ('dedicated': max(W, P/S)).  L_i = max(1, W/S) on a node holding a server (each worker's
  own link carries n, a server takes W n/S from its node's workers), else 1; a = alpha_e
  across nodes, alpha_i on one node.  With one node and the server links taken as the
  intra-node links this is the flat parameter-server formula above; the NIC term is named
  'parameter server' when the servers' side (fan-in) is the busier one.

  Servers on the host CPU ('host'): every slice leaves its worker over the worker's own link
  to the host (n at b_d), the node's shared host link carries L_h = W s_j / S (b_h), the NIC
  as for colocated servers; the busiest of the three bounds each direction and the s_j
  servers of a node sum in one host memory: max_j s_j (P-1)/S n gamma_server.

  Per message the transport adds a control exchange (`Fabric.control`): ceil(log2 p) hops of
  its `coordination` plus the slowest hop's latency (Horovod's coordinator, a collective's
  launch).  A pipelining transport (`Fabric.pipelined`: asynchronous sends) keeps several
  messages in flight, so a message queued behind the previous one skips its link latency
  (`CommCost.queued`, `queued_cost`): a queue of back-to-back messages pays the start-up once.

Node effects (`NodeEffects`, `predict_on`), what p workers cost besides the gradients::

    slowest worker   t_f, t_b (and ready times) x (1 + c e_p),  e_p = E[max of p N(0,1)]
                     (`expected_max_standard_normal`), c the per-step coefficient of
                     variation of one worker (`step_jitter` from a run's repeats)
    host link        t_h2d x max(1, G host_to_device / host_bandwidth): G workers copy over
                     one shared host link

  A described cluster has no CPU contention (kappa = kappa_c = 0) unless its file says so.
  `CommCost` keeps each term apart (link latency, per-message software cost, intra-node
  link, NIC, parameter server, reduction) so that `bottleneck` can name what an iteration
  waits for.

Scaling (weak, fixed per-worker batch): S(N) = N t(1) / t(N), E(N) = S(N) / N.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist
from typing import Callable, Iterable, Sequence

ALGORITHMS: tuple[str, ...] = ("ring", "tree", "recursive_doubling", "halving_doubling", "ps", "p2p")
GRANULARITIES: tuple[str, ...] = ("whole", "layer", "tensor", "bucket")
MERGES: tuple[str | None, ...] = (None, "greedy", "cycle")
# How a scheme spans a cluster's hierarchy (`topology_cost`): its algorithm over all ranks,
# the two-level all-reduce, or a reduce inside each node before the algorithm across nodes.
TOPOLOGIES: tuple[str, ...] = ("flat", "two_level", "local_reduce")
# Where parameter servers run (`ps_on`): on the worker nodes' devices, on machines of their own,
# or on the CPU of the worker nodes (reached over the host link, summing in host memory).
PLACEMENTS: tuple[str, ...] = ("colocated", "dedicated", "host")


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


def _power_of_two_below(p: int) -> int:
    """q = 2^floor(log2 p): the ranks recursive doubling and halving run on."""
    return 1 << (p.bit_length() - 1)


def _fold(n: float, p: int, cost: LinkCost) -> float:
    """The extra steps of recursive doubling / halving for p not a power of two: the
    r = p - q extra ranks hand their vector to a partner (alpha + n beta, summed there:
    n gamma) and get the result back (alpha + n beta); 0 when p is a power of two."""
    if p == _power_of_two_below(p):
        return 0.0
    return 2 * (cost.alpha + n * cost.beta) + n * cost.gamma


def recursive_doubling_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Recursive doubling: log2 q exchange-and-sum rounds of the whole message on
    q = 2^floor(log2 p) ranks, plus the fold of the p - q others (`_fold`):
    T = log2 q (alpha + n beta + n gamma) [+ 2 alpha + 2 n beta + n gamma]."""
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    q = _power_of_two_below(p)
    return _log2_ceil(q) * (cost.alpha + n * cost.beta + n * cost.gamma) + _fold(n, p, cost)


def halving_doubling_allreduce(n: float, p: int, cost: LinkCost) -> float:
    """Rabenseifner (recursive halving reduce-scatter, recursive doubling all-gather) on
    q = 2^floor(log2 p) ranks, plus the fold of the p - q others (`_fold`):
    T = 2 log2 q alpha + 2(q-1)/q n beta + (q-1)/q n gamma [+ 2 alpha + 2 n beta + n gamma]."""
    _check_p(p)
    if p == 1 or n <= 0:
        return 0.0
    q = _power_of_two_below(p)
    return (2 * _log2_ceil(q) * cost.alpha + 2 * (q - 1) / q * n * cost.beta + (q - 1) / q * n * cost.gamma
            + _fold(n, p, cost))


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
    q = _power_of_two_below(p)
    fold = (2.0, 2.0, 1.0) if q != p else (0.0, 0.0, 0.0)
    rounds = float(_log2_ceil(q))
    if algorithm == "recursive_doubling":
        return rounds + fold[0], rounds + fold[1], rounds + fold[2]
    if algorithm == "halving_doubling":
        return 2.0 * rounds + fold[0], 2 * (q - 1) / q + fold[1], (q - 1) / q + fold[2]
    raise ValueError(f"unknown collective algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def collective_time(algorithm: str, n: float, p: int, cost: LinkCost, servers: int = 1) -> float:
    """T(n) of `algorithm` for p workers: k_a alpha + n (k_b beta + k_g gamma); 0 for n <= 0."""
    if n <= 0:
        return 0.0
    k_a, k_b, k_g = coefficients(algorithm, p, servers)
    return k_a * cost.alpha + n * (k_b * cost.beta + k_g * cost.gamma)


@dataclass(frozen=True)
class CostTerm:
    """One part of a message's cost, named by what it waits for: `latency` seconds per
    message plus `per_byte` seconds per byte."""

    what: str
    latency: float = 0.0
    per_byte: float = 0.0


@dataclass(frozen=True)
class CommCost:
    """T(n) = sum of its terms' latency + n per_byte (0 for n <= 0): a callable n -> seconds
    that `predict` and the merges take, which keeps the terms apart for `bottleneck`."""

    terms: tuple[CostTerm, ...] = ()
    # seconds of `latency` a message queued behind the previous one does not pay: a
    # pipelining transport keeps several messages in flight, so their link latencies overlap
    # (`schedule`); 0 for a transport that runs one message after another
    queued: float = 0.0
    latency: float = field(init=False)
    per_byte: float = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "latency", sum(t.latency for t in self.terms))
        object.__setattr__(self, "per_byte", sum(t.per_byte for t in self.terms))
        if not 0.0 <= self.queued <= self.latency + 1e-15:
            raise ValueError(f"a queued message cannot save more than its latency, got {self.queued!r}")

    def __call__(self, n: float) -> float:
        return 0.0 if n <= 0 else self.latency + n * self.per_byte

    def breakdown(self, n: float) -> dict[str, float]:
        """Seconds of one n-byte message per term (terms of the same name added)."""
        out: dict[str, float] = {}
        if n > 0:
            for term in self.terms:
                out[term.what] = out.get(term.what, 0.0) + term.latency + n * term.per_byte
        return out


def _terms(*items: tuple[str, float, float]) -> CommCost:
    """A CommCost of (what, latency, per_byte) triples, zero ones left out."""
    return CommCost(tuple(CostTerm(what, a, b) for what, a, b in items if a > 0 or b > 0))


def comm_time_function(algorithm: str, p: int, cost: LinkCost, servers: int = 1) -> CommCost:
    """n -> T(n) of `algorithm` on p workers of one flat link, the coefficients computed once
    (the inner loop of the what-if grid): terms per-message cost (k_a alpha), link
    (k_b beta) and reduction (k_g gamma)."""
    if algorithm != "ps" and p == 1:
        return CommCost()
    k_a, k_b, k_g = coefficients(algorithm, p, servers)
    return _terms(("per-message cost", k_a * cost.alpha, 0.0), ("link", 0.0, k_b * cost.beta),
                  ("parameter server" if algorithm == "ps" else "reduction", 0.0, k_g * cost.gamma))


def startup_cost(comm_time: Callable[[float], float]) -> float:
    """The per-message part of an affine T(n) = a + b n: `latency` where the function keeps
    it (`CommCost`), else a = 2 T(1) - T(2)."""
    latency = getattr(comm_time, "latency", None)
    if latency is not None:
        return float(latency)
    return max(0.0, 2 * comm_time(1) - comm_time(2))


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
    """A scheduled message: its size, when it was ready, started and ended, and the link
    latency it did not pay because it was queued behind the previous one (`schedule`)."""

    nbytes: int
    ready: float
    start: float
    end: float
    members: tuple[str, ...]
    hidden: float = 0.0


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
    """MG-WFBP's merging (Shi, Chu, Li, INFOCOM 2019): walking the messages in send order,
    the next one, b, joins the pending message a when b is ready strictly less than the
    startup cost a_T (`startup_cost`, k_a alpha) after a could start:

        r_b < s_a + a_T,   s_a = max(r_a, e_prev)

    (and, with cap > 0, the merged message stays within cap bytes, like a fusion buffer).
    For T(n) = a_T + n b this is exactly "together ends strictly sooner than apart": apart
    e_a = s_a + T(n_a), e_b = max(r_b, e_a) + T(n_b); together
    e_ab = max(s_a, r_b) + T(n_a + n_b), which saves a_T when r_b <= s_a and
    s_a + a_T - r_b when s_a < r_b < s_a + a_T.  At r_b = s_a + a_T both end b at the same
    time, but apart a ends sooner: no merge.  (With a_T = 0 nothing is saved: the rule
    merges b only when it is ready before a could start, and b ends as it would apart.)
    """
    startup = startup_cost(comm_time)
    merged: list[Message] = []
    end_prev = 0.0
    pending: Message | None = None
    for msg in messages:
        if pending is None:
            pending = msg
            continue
        start_a = max(pending.ready, end_prev)
        if msg.ready < start_a + startup and (cap <= 0 or pending.nbytes + msg.nbytes <= cap):
            pending = Message(pending.nbytes + msg.nbytes, max(pending.ready, msg.ready),
                              pending.members + msg.members)
        else:
            merged.append(pending)
            end_prev = start_a + comm_time(pending.nbytes)
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
      merged messages stay within bucket_bytes (a fusion buffer);
    topology: how it spans nodes (`topology_cost`): ``flat`` (the algorithm over all ranks),
      ``two_level`` (ring inside the node, across nodes, inside again), ``local_reduce``
      (reduce inside the node, the algorithm across nodes, broadcast inside);
    wire_ratio: bytes on the wire per gradient byte, once messages are formed (DDP buckets by
      the gradient's own bytes, then its hook compresses each bucket): 0.5 for float16, the
      low-rank factors' share for PowerSGD.  The compression's own compute (casts, PowerSGD's
      matrix products) is not a term: on a GPU it is small beside the transfer it shrinks, and
      the separated profile's measured comm phase holds it;
    gather_params: after the update, the parameters are exchanged among the ranks that own
      their shards (ZeRO stage 1's broadcasts from the owners): an all-gather of the whole
      model, priced as half the ring all-reduce of its bytes (`gather_time`), after
      everything else and so never hidden;
    gather_forward: each layer's parameters are all-gathered before its forward (FSDP's full
      sharding), with ``overlap`` the gathers back to back on the link while forward computes
      the layers already gathered, without it each before its layer (`forward_gather_wait`).
      Its backward (the layer all-gathered again, then its gradient reduce-scattered) is
      priced as one all-reduce per layer, the same bytes and steps, sent when the layer's
      gradient is ready: granularity ``layer``.
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
    topology: str = "flat"
    wire_ratio: float = 1.0
    gather_params: bool = False
    gather_forward: bool = False

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
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.topology!r} (known: {', '.join(TOPOLOGIES)})")
        if self.topology == "two_level" and self.algorithm != "ring":
            raise ValueError("the two-level all-reduce is a ring in the node and across nodes: algorithm ring")
        if not 0 < self.wire_ratio <= 1:
            raise ValueError(f"wire_ratio must be in (0, 1], got {self.wire_ratio}")

    FIELDS = ("name", "overlap", "granularity", "bucket_bytes", "first_bucket_bytes", "merge",
              "algorithm", "servers", "profile_granularity", "cycle_s", "topology", "wire_ratio", "gather_params",
              "gather_forward")

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
        if self.wire_ratio != 1:
            messages = [Message(m.nbytes * self.wire_ratio, m.ready, m.members) for m in messages]
        if separate:
            return messages
        if self.merge == "cycle":
            return merge_by_cycle(messages, comm_time, self.cycle_s, self.bucket_bytes)
        if self.cycle_s > 0:
            messages = [Message(m.nbytes, m.ready + self.cycle_s / 2, m.members) for m in messages]
        if self.merge == "greedy":
            messages = merge_greedy(messages, comm_time, self.bucket_bytes)
        return messages


# --------------------------------------------------------------------------- hierarchy

@dataclass(frozen=True)
class Topology:
    """N nodes of G workers each, ranks in node order (ranks 0..G-1 on node 0, ...)."""

    nodes: int = 1
    workers_per_node: int = 1

    def __post_init__(self):
        _check_p(self.nodes)
        _check_p(self.workers_per_node)

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node


@dataclass(frozen=True)
class Fabric:
    """The links of a cluster with a hierarchy (module docstring, "A cluster with a
    hierarchy"): `intra` (alpha_i, beta_i) between the workers of a node, `inter`
    (alpha_e, beta_e) the node's NIC, `software` the transport's alpha_s, beta_s, the share
    `efficiency` of a link's bandwidth the transport reaches, `gamma` seconds per byte a
    worker sums and `server_gamma` a parameter server (default gamma).  Only the alpha and
    beta of the LinkCosts are used.

    `device_link` is one worker's own link to its host (PCIe), `host_link` the host link all
    workers of a node share (the CPU's lanes behind the PCIe switches; LinkCost(): unlimited):
    parameter servers placed on the host are reached over them.  `coordination` is the
    transport's software cost per hop of the control exchange that agrees, before each
    message, what the ranks send (Horovod's coordinator, a collective's launch across the
    ranks): a tree of ceil(log2 p) hops.  `pipelined`: the transport keeps several messages in
    flight (asynchronous sends), so a message queued behind another does not pay the link
    latency again."""

    intra: LinkCost = LinkCost()
    inter: LinkCost = LinkCost()
    software: LinkCost = LinkCost()
    efficiency: float = 1.0
    gamma: float = 0.0
    server_gamma: float | None = None
    device_link: LinkCost = LinkCost()
    host_link: LinkCost = LinkCost()
    coordination: float = 0.0
    pipelined: bool = False

    def __post_init__(self):
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency!r}")
        for name in ("gamma", "server_gamma", "coordination"):
            value = getattr(self, name)
            if value is not None and (math.isnan(value) or value < 0):
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    @classmethod
    def flat(cls, cost: LinkCost) -> "Fabric":
        """One link everywhere: the intra-node link and the NIC are the same `cost`."""
        return cls(intra=cost, inter=cost, gamma=cost.gamma)

    def b_intra(self) -> float:
        return self.intra.beta / self.efficiency

    def b_inter(self) -> float:
        return self.inter.beta / self.efficiency

    def control(self, p: int, hop_latency: float) -> tuple[str, float, float]:
        """The coordination term of one message among p ranks: ceil(log2 p) control hops,
        each the transport's `coordination` plus the slowest hop's link latency; nothing when
        the transport coordinates for free (coordination 0) or p = 1."""
        if self.coordination <= 0 or p <= 1:
            return ("coordination", 0.0, 0.0)
        return ("coordination", _log2_ceil(p) * (self.coordination + hop_latency), 0.0)

    def priced(self, cost: CommCost) -> CommCost:
        """`cost` with the link latency a queued message skips on a pipelining transport."""
        if not self.pipelined:
            return cost
        return replace(cost, queued=sum(t.latency for t in cost.terms if t.what == "link latency"))


def ring_on(topology: Topology, fabric: Fabric) -> CommCost:
    """Flat ring over all p ranks in node order (module docstring's first row): each of the
    2(p-1) steps moves n/p on every hop at once, so the slowest hop kind present sets both
    its latency and its pace; the node's one outgoing hop per step has the NIC to itself."""
    return _flat_on("ring", topology, fabric)


def _flat_on(algorithm: str, topology: Topology, fabric: Fabric) -> CommCost:
    """`algorithm`'s coefficients over all p ranks with every step at the slowest hop kind
    present.  Exact for the ring; for tree and recursive doubling / halving, whose steps
    across nodes send from every worker of a node at once, it leaves out that they share
    the NIC (an optimistic bound, for the catalogue's --algorithm only)."""
    p, nodes, per_node = topology.world_size, topology.nodes, topology.workers_per_node
    if p == 1:
        return CommCost()
    k_a, k_b, k_g = coefficients(algorithm, p)
    hops = ([("NIC", fabric.inter.alpha, fabric.b_inter())] if nodes > 1 else []) + \
           ([("intra-node link", fabric.intra.alpha, fabric.b_intra())] if per_node > 1 else [])
    link, _, pace = max(hops, key=lambda hop: hop[2])  # the NIC on a tie
    latency = max(hop[1] for hop in hops)
    return fabric.priced(_terms(
        ("link latency", k_a * latency, 0.0), ("per-message software cost", k_a * fabric.software.alpha, 0.0),
        fabric.control(p, latency), (link, 0.0, k_b * pace),
        ("transport per-byte cost", 0.0, k_b * fabric.software.beta), ("reduction", 0.0, k_g * fabric.gamma)))


def two_level_on(topology: Topology, fabric: Fabric) -> CommCost:
    """Two-level all-reduce (Horovod's hierarchical all-reduce, NCCL's ring in a node):
    ring reduce-scatter among the node's G workers, ring all-reduce of each worker's 1/G
    shard across the N nodes (the G shards cross the NIC at once: the whole gradient goes
    through it), ring all-gather in the node.  G = 1 or N = 1 is the flat ring."""
    nodes, per_node = topology.nodes, topology.workers_per_node
    inside, across = (per_node - 1) / per_node, (nodes - 1) / nodes
    alpha_s, beta_s = fabric.software.alpha, fabric.software.beta
    hop = fabric.inter.alpha if nodes > 1 else fabric.intra.alpha
    return fabric.priced(_terms(
        ("link latency", 2 * (per_node - 1) * fabric.intra.alpha + 2 * (nodes - 1) * fabric.inter.alpha, 0.0),
        ("per-message software cost", 2 * (per_node - 1 + nodes - 1) * alpha_s, 0.0),
        fabric.control(topology.world_size, hop),
        ("intra-node link", 0.0, 2 * inside * fabric.b_intra()),
        ("NIC", 0.0, 2 * across * fabric.b_inter()),
        ("transport per-byte cost", 0.0, 2 * inside * beta_s + 2 * across * beta_s / per_node),
        ("reduction", 0.0, (inside + across / per_node) * fabric.gamma)))


def _servers_on(node: int, nodes: int, servers: int) -> int:
    """Servers on `node` when `servers` are dealt round robin over `nodes`."""
    return servers // nodes + (1 if node < servers % nodes else 0)


def server_loads(nodes: int, pushing: int, servers: int, placement: str = "colocated") -> tuple[float, float, bool]:
    """(L_i, L_e, fan_in): the bytes, in units of one worker's gradient n, that the busiest
    intra-node link and the busiest NIC carry in one direction of a push (or pull) of
    `pushing` workers per node to `servers` servers, and whether the NIC's load is the
    servers' side (module docstring, "Parameter servers").  With servers on the host
    ('host') L_i is what the node's shared host link carries: its workers' slices for the
    node's own servers, W s_j / S."""
    if servers < 1:
        raise ValueError(f"a parameter-server scheme needs servers >= 1, got {servers!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})")
    total = nodes * pushing
    if placement == "dedicated":
        return 1.0, max(float(pushing), total / servers), total / servers > pushing
    fan_out = fan_in = host = 0.0
    hosts_server = False
    for node in range(nodes):
        local = _servers_on(node, nodes, servers)
        hosts_server = hosts_server or local > 0
        fan_out = max(fan_out, pushing * (servers - local) / servers if nodes > 1 else 0.0)
        fan_in = max(fan_in, local * (total - pushing) / servers)
        host = max(host, pushing * local / servers)
    if placement == "host":
        intra = host
    else:
        intra = max(1.0, pushing / servers) if hosts_server else 1.0
    return intra, max(fan_out, fan_in), fan_in > fan_out


def ps_on(topology: Topology, fabric: Fabric, servers: int, placement: str = "colocated",
          pushing: int | None = None) -> CommCost:
    """Push then pull of each pushing worker's whole gradient, n/S to each of S servers
    (module docstring's ps row): 2 (a + alpha_s) + 2 n (max(L_i b_i, L_e b_e) + beta_s)
    + (P-1)/S n gamma_server, P = N x `pushing` (default: every worker).

    Servers on the host CPU ('host'): every slice leaves its worker over the worker's own
    link to the host (n at b_d), the node's shared host link carries L_h = W s_j / S of
    them to the node's own servers (b_h), the NIC the slices bound elsewhere as for
    colocated servers; each direction is bound by the busiest of the three, and the s_j
    servers of a node sum in the same host memory: max_j s_j (P-1)/S n gamma_server."""
    nodes = topology.nodes
    pushing = topology.workers_per_node if pushing is None else pushing
    intra_load, nic_load, fan_in = server_loads(nodes, pushing, servers, placement)
    across = nodes > 1 or placement == "dedicated"
    latency = fabric.inter.alpha if across else (fabric.host_link.alpha if placement == "host" else fabric.intra.alpha)
    nic = nic_load * fabric.b_inter() if across else 0.0
    gamma = fabric.gamma if fabric.server_gamma is None else fabric.server_gamma
    sums = (nodes * pushing - 1) / servers * gamma
    if placement == "host":
        own, shared = fabric.device_link.beta, intra_load * fabric.host_link.beta
        inside, name = max(own, shared), "host link"
        sums *= max(_servers_on(node, nodes, servers) for node in range(nodes))
    else:
        inside, name = intra_load * fabric.b_intra(), "intra-node link"
    link = name if inside >= nic else ("parameter server" if fan_in else "NIC")
    return fabric.priced(_terms(
        ("link latency", 2 * latency, 0.0), ("per-message software cost", 2 * fabric.software.alpha, 0.0),
        fabric.control(nodes * pushing, latency), (link, 0.0, 2 * max(inside, nic)),
        ("transport per-byte cost", 0.0, 2 * fabric.software.beta), ("parameter server", 0.0, sums)))


def local_reduce_on(topology: Topology, fabric: Fabric) -> CommCost:
    """The node's part of a local reduce and broadcast (MXNet's device kvstore before a
    dist push): the reduce-scatter and all-gather terms of `two_level_on` inside one node,
    without the transport's software cost (one process copies between its own devices)."""
    return two_level_on(Topology(1, topology.workers_per_node),
                        replace(fabric, software=LinkCost(), coordination=0.0, pipelined=False))


def topology_cost(scheme: "Scheme", topology: Topology, fabric: Fabric, servers: int | None = None,
                  placement: str = "colocated") -> CommCost:
    """T(n) of one of `scheme`'s messages on the cluster (module docstring's table):
    ``flat`` the algorithm over all ranks (`ring_on`; a parameter server: `ps_on` with every
    worker pushing), ``two_level`` `two_level_on`, ``local_reduce`` the node's reduce and
    broadcast plus the algorithm across nodes with one pusher per node.  `servers`
    (default: the scheme's, else one per node) serve the ``ps`` algorithm."""
    servers = servers or scheme.servers or topology.nodes
    if scheme.topology == "two_level":
        return two_level_on(topology, fabric)
    if scheme.topology == "local_reduce":
        inside = local_reduce_on(topology, fabric)
        if scheme.algorithm == "ps":
            across = ps_on(topology, fabric, servers, placement, pushing=1)
        else:
            across = _flat_on(scheme.algorithm, Topology(topology.nodes, 1), fabric)
        return CommCost(inside.terms + across.terms, queued=across.queued)
    if scheme.algorithm == "ps":
        return ps_on(topology, fabric, servers, placement)
    if scheme.algorithm == "p2p":
        return fabric.priced(_terms(
            ("link latency", fabric.inter.alpha, 0.0), ("per-message software cost", fabric.software.alpha, 0.0),
            ("NIC", 0.0, fabric.b_inter()), ("transport per-byte cost", 0.0, fabric.software.beta)))
    return _flat_on(scheme.algorithm, topology, fabric)


def bottleneck(prediction: "Prediction", comm_time: Callable[[float], float], compute_share: float = 0.9) -> str:
    """What the predicted iteration waits for: ``compute`` when what it loses against one
    worker -- the exposed communication and the node effects of `NodeEffects`
    (`Prediction.losses`: ``slowest worker``, ``host link``) -- is at most
    1 - `compute_share` of the iteration; else the node effect that costs more than the
    exposed communication, or the term of `comm_time` (a `CommCost`) that the scheme's
    transfers spend most time on ("communication" when the cost keeps no terms)."""
    losses = prediction.losses
    if prediction.comm_exposed + sum(losses.values()) <= (1.0 - compute_share) * prediction.iter_time:
        return "compute"
    if losses and max(losses.values()) > prediction.comm_exposed:
        return max(losses, key=losses.get)
    totals: dict[str, float] = {}
    breakdown = getattr(comm_time, "breakdown", None)
    for transfer in prediction.transfers:
        for what, seconds in (breakdown(transfer.nbytes) if breakdown else {}).items():
            totals[what] = totals.get(what, 0.0) + seconds
        if transfer.hidden and "link latency" in totals:
            totals["link latency"] -= transfer.hidden
    return max(totals, key=totals.get) if totals else "communication"


def queued_cost(comm_time: Callable[[float], float], nbytes: float, queued: bool) -> tuple[float, float]:
    """(seconds, hidden): a message's cost, less the link latency a pipelining transport
    overlaps with the messages in flight when this one was queued behind the previous one
    (`CommCost.queued`: NCCL and MPI chunk and pipeline their sends; the start-up is paid
    once per queue of back-to-back messages, not once per message)."""
    cost = comm_time(nbytes)
    hidden = min(cost, getattr(comm_time, "queued", 0.0)) if queued and nbytes > 0 else 0.0
    return cost - hidden, hidden


def schedule(messages: Sequence[Message], comm_time: Callable[[float], float], overlap: bool,
             t_b: float) -> list[Transfer]:
    """Transfers of the messages in send order: WFBP (`wfbp_schedule`'s recurrence) with
    overlap, else every message ready when backward ends (t_b) and sent one after another.
    A message ready before the previous one ended is queued: on a pipelining transport it
    skips the link latency (`queued_cost`)."""
    transfers, end = [], 0.0
    for i, m in enumerate(messages):
        ready = m.ready if overlap else t_b
        cost, hidden = queued_cost(comm_time, m.nbytes, i > 0 and ready < end)
        start = max(ready, end)
        end = start + cost
        transfers.append(Transfer(m.nbytes, ready, start, end, m.members, hidden))
    return transfers


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
    # seconds the node effects add to the iteration (`NodeEffects.shape`), by bottleneck name
    losses: dict = field(default_factory=dict)

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
    for i, message in enumerate(messages):
        # ready after backward (a merge's later cycle): as long after backward's end
        ready = progress.wall_time(min(message.ready, t_b)) + max(0.0, message.ready - t_b)
        cost, hidden = queued_cost(comm_time, message.nbytes, i > 0 and ready < end)
        start = max(ready, end)
        end = progress.transfer(start, cost)
        transfers.append(Transfer(message.nbytes, ready, start, end, message.members, hidden))
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
    gather = gather_time(comm_time, sum(g.nbytes for g in grads)) if scheme.gather_params else 0.0
    update = profile.update + gather  # the measured update phase holds the exchange too
    forward_gathers, forward_wait = (forward_gather_wait(grads, comm_time, profile.forward, t_b, scheme.overlap)
                                     if scheme.gather_forward else (0.0, 0.0))
    rest = profile.h2d + profile.forward + forward_wait + end + update
    io = exposed_io(profile.io, rest, profile.prefetch)
    phases = {"io": io, "h2d": profile.h2d, "forward": profile.forward, "backward": t_b,
              "comm": comm_separate, "update": update}
    return Prediction(io + rest, phases, end, comm_total + gather + forward_gathers,
                      end - t_b + gather + forward_wait, tuple(transfers))


def forward_gather_wait(grads: Sequence[Grad], comm_time: Callable[[float], float], t_f: float,
                        t_b: float, overlap: bool = True) -> tuple[float, float]:
    """(seconds of all-gathers, seconds forward waits for them) when each layer's parameters
    are all-gathered before its forward, FSDP-style.  With `overlap` the gathers run back to
    back from the start of forward (each prefetched while an earlier layer computes) and
    layer i computes once its gather is done and layer i-1 has computed; forward's time is
    split over the layers as backward's is (each layer's share of t_b, from the gradients'
    ready times), for lack of a per-layer forward profile.  Without it each gather blocks
    before its layer and forward waits for all of them."""
    layers = group_by_layer(grads)  # backward order
    if not overlap:
        total = sum(gather_time(comm_time, m.nbytes) for m in layers)
        return total, total
    starts = [0.0] + [m.ready for m in layers[:-1]]
    shares = [max(0.0, m.ready - start) / t_b if t_b > 0 else 1 / len(layers)
              for m, start in zip(layers, starts)]
    link = computed = 0.0  # when the link and forward's compute are free again
    for message, share in zip(reversed(layers), reversed(shares)):  # forward order
        link += gather_time(comm_time, message.nbytes)
        computed = max(computed, link) + share * t_f
    return link, max(0.0, computed - t_f)


def gather_time(comm_time: Callable[[float], float], nbytes: float) -> float:
    """An all-gather of `nbytes` (every rank ends with all of them, each sending its share):
    half a ring all-reduce, which is a reduce-scatter and then this all-gather, each (p-1)
    steps of n/p bytes."""
    return comm_time(nbytes) / 2 if nbytes > 0 else 0.0


def single_worker_prediction(profile: Profile) -> Prediction:
    """No communication: `single_worker_time` of the profile."""
    t = single_worker_time(profile.io, profile.h2d, profile.forward, profile.backward, profile.update,
                           profile.prefetch)
    phases = {"io": t - (profile.h2d + profile.forward + profile.backward + profile.update),
              "h2d": profile.h2d, "forward": profile.forward, "backward": profile.backward,
              "comm": 0.0, "update": profile.update}
    return Prediction(t, phases, profile.backward, 0.0, 0.0, ())


# --------------------------------------------------------------------------- node effects

@lru_cache(maxsize=None)
def expected_max_standard_normal(p: int) -> float:
    """e_p = E[max of p independent standard normal variables], the expected largest of p
    order statistics (David and Nagaraja, *Order Statistics*, 3rd ed., Wiley 2003, eq. 4.2.5
    with the normal parent; Tippett's 1925 table: e_2 = 0.5642, e_4 = 1.0294, e_8 = 1.4236,
    e_16 = 1.7660, e_32 = 2.0697)::

        e_p = integral of x p phi(x) Phi(x)^(p-1) dx

    by Simpson's rule on [-9, 9] (the integrand is below 1e-17 outside); e_1 = 0."""
    _check_p(p)
    if p == 1:
        return 0.0
    normal = NormalDist()
    steps, low, high = 3600, -9.0, 9.0
    width = (high - low) / steps
    total = 0.0
    for i in range(steps + 1):
        x = low + i * width
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * x * p * normal.pdf(x) * normal.cdf(x) ** (p - 1)
    return total * width / 3


def straggler_factor(p: int, jitter: float) -> float:
    """How much longer the slowest of p workers computes than one worker on average: a
    synchronous step waits for every rank, and with step times t (1 + c Z), Z standard
    normal and independent across ranks and steps (c = `jitter`, the coefficient of
    variation of one worker's step), E[max] = t (1 + c e_p) (`expected_max_standard_normal`).
    1 for p = 1 or no jitter."""
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    return 1.0 + jitter * expected_max_standard_normal(p)


def step_jitter(std_of_means: float, mean: float, steps: int) -> float:
    """One worker's per-step coefficient of variation from the spread of repeated timings:
    a repeat's mean over `steps` independent steps varies as sigma / sqrt(steps), so
    c = (std of the repeats' means / their mean) x sqrt(steps)."""
    if mean <= 0 or steps < 1 or std_of_means < 0:
        raise ValueError("a step jitter needs a positive mean, steps >= 1 and a spread >= 0")
    return std_of_means / mean * math.sqrt(steps)


@dataclass(frozen=True)
class NodeEffects:
    """What p workers on nodes of G cost that one worker alone does not, besides moving
    gradients:

    - ``slowest worker``: every synchronous step waits for the slowest rank's compute,
      forward and backward stretched by `straggler_factor` (p, `jitter`);
    - ``host link``: the G workers of a node copy their batches over one shared host link
      (`host_bandwidth`, bytes/s; the CPU's PCIe lanes behind the switches), each over its
      own link of `host_to_device` bytes/s: the copy takes max(1, G host_to_device /
      host_bandwidth) times as long as one worker's alone.

    None of the parameters given: no effect (the model before these terms)."""

    jitter: float = 0.0
    host_to_device: float | None = None
    host_bandwidth: float | None = None

    def __post_init__(self):
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def host_share(self, workers_per_node: int) -> float:
        if not self.host_to_device or not self.host_bandwidth:
            return 1.0
        return max(1.0, workers_per_node * self.host_to_device / self.host_bandwidth)

    def shape(self, profile: Profile, topology: Topology) -> tuple[Profile, dict[str, float]]:
        """The profile every rank of `topology` effectively runs, and the seconds each
        effect adds to it (by bottleneck name, effects that add nothing left out)."""
        stretch = straggler_factor(topology.world_size, self.jitter)
        share = self.host_share(topology.workers_per_node)
        if stretch == 1.0 and share == 1.0:
            return profile, {}
        shaped = replace(profile, h2d=profile.h2d * share, forward=profile.forward * stretch,
                         backward=profile.backward * stretch,
                         grads=tuple(replace(g, ready=g.ready * stretch) for g in profile.grads))
        losses = {"slowest worker": (stretch - 1.0) * (profile.forward + profile.backward),
                  "host link": (share - 1.0) * profile.h2d}
        return shaped, {what: seconds for what, seconds in losses.items() if seconds > 0}


def predict_on(profile: Profile, scheme: Scheme, comm_time: Callable[[float], float], topology: Topology,
               effects: NodeEffects = NodeEffects(), contention: float = 0.0,
               transfer_contention: float = 0.0) -> Prediction:
    """`predict` of every rank of `topology` with the node effects of `effects`
    (`NodeEffects.shape`), the seconds they add kept in `Prediction.losses`."""
    shaped, losses = effects.shape(profile, topology)
    return replace(predict(shaped, scheme, comm_time, contention, transfer_contention), losses=losses)


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
