"""The performance model's equations against hand-computed cases, and its limits."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from analysis import perfmodel as pm

US, MS = 1e-6, 1e-3
# alpha = 10 us, beta = 1 ns/B (8 Gbit/s), gamma = 0.5 ns/B; n = 1 MB (10^6 B), p = 4
COST = pm.LinkCost(alpha=10 * US, beta=1e-9, gamma=0.5e-9)
N = 1_000_000


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=1e-15)


# --------------------------------------------------------------------------- communication

def test_point_to_point():
    assert pm.point_to_point(N, COST) == approx(10 * US + 1 * MS)
    assert pm.point_to_point(0, COST) == 0.0


def test_ring_allreduce_by_hand():
    # 2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma = 60 us + 1.5 ms + 0.375 ms
    assert pm.ring_allreduce(N, 4, COST) == approx(60 * US + 1.5 * MS + 0.375 * MS)
    # p = 2: 2 alpha + n beta + n gamma / 2
    assert pm.ring_allreduce(N, 2, COST) == approx(20 * US + 1 * MS + 0.25 * MS)
    assert pm.ring_allreduce(N, 1, COST) == 0.0 and pm.ring_allreduce(0, 4, COST) == 0.0


def test_tree_and_recursive_doubling_by_hand():
    # binomial tree, p = 4: log2 p = 2 levels up and down: 2*2*(10 us + 1 ms) + 2 * 0.5 ms
    assert pm.tree_allreduce(N, 4, COST) == approx(4 * (10 * US + 1 * MS) + 1 * MS)
    # p = 3 needs ceil(log2 3) = 2 levels as well
    assert pm.tree_allreduce(N, 3, COST) == approx(pm.tree_allreduce(N, 4, COST))
    # recursive doubling, p = 4: 2 * (10 us + 1 ms + 0.5 ms)
    assert pm.recursive_doubling_allreduce(N, 4, COST) == approx(2 * (10 * US + 1.5 * MS))
    # Rabenseifner, p = 4: 2*2*10 us + 1.5 ms + 0.375 ms
    assert pm.halving_doubling_allreduce(N, 4, COST) == approx(40 * US + 1.875 * MS)


def test_recursive_doubling_and_halving_fold_the_ranks_beyond_a_power_of_two():
    """p = 6: q = 4 ranks run the algorithm, the r = 2 others first hand their vector to a
    partner (alpha + n beta, summed there: n gamma) and get the result back (alpha + n beta):
    the fold costs 2 (10 us + 1 ms) + 0.5 ms = 2.52 ms."""
    fold = 2 * (10 * US + 1 * MS) + 0.5 * MS
    # recursive doubling on q = 4: 2 rounds of (10 us + 1 ms + 0.5 ms) = 3.02 ms
    assert pm.recursive_doubling_allreduce(N, 6, COST) == approx(2 * (10 * US + 1.5 * MS) + fold)
    # Rabenseifner on q = 4: 40 us + 1.5 ms + 0.375 ms = 1.915 ms
    assert pm.halving_doubling_allreduce(N, 6, COST) == approx(40 * US + 1.875 * MS + fold)
    # p = 3: q = 2, one round (1.51 ms) plus the fold; 5 and 7 fold onto 4
    assert pm.recursive_doubling_allreduce(N, 3, COST) == approx(10 * US + 1.5 * MS + fold)
    assert pm.recursive_doubling_allreduce(N, 5, COST) == pm.recursive_doubling_allreduce(N, 7, COST)
    # a power of two needs no fold: 8 = 3 rounds
    assert pm.recursive_doubling_allreduce(N, 8, COST) == approx(3 * (10 * US + 1.5 * MS))


def test_parameter_server_by_hand():
    # p = 4 workers, S = 2 servers: each server link carries 4 * n/2 = 2n bytes each way
    # 2 alpha + 2 * 2 * n beta + (p-1)/S n gamma = 20 us + 4 ms + 0.75 ms
    assert pm.ps_pushpull(N, 4, 2, COST) == approx(20 * US + 4 * MS + 0.75 * MS)
    # S = 8 > p: the worker's own link (n each way) bounds it: 20 us + 2 ms + 3/8 * 0.5 ms
    assert pm.ps_pushpull(N, 4, 8, COST) == approx(20 * US + 2 * MS + 0.1875 * MS)
    # one worker still pays the round trip to its server
    assert pm.ps_pushpull(N, 1, 1, COST) == approx(20 * US + 2 * MS)
    # more servers share the load: never slower
    assert pm.ps_pushpull(N, 16, 4, COST) < pm.ps_pushpull(N, 16, 1, COST)
    with pytest.raises(ValueError):
        pm.ps_pushpull(N, 4, 0, COST)


@pytest.mark.parametrize("algorithm,function", [
    ("ring", pm.ring_allreduce), ("tree", pm.tree_allreduce),
    ("recursive_doubling", pm.recursive_doubling_allreduce), ("halving_doubling", pm.halving_doubling_allreduce)])
def test_coefficients_agree_with_the_explicit_formulas(algorithm, function):
    for p in (1, 2, 3, 4, 7, 8, 16, 64):
        for n in (4, 1000, 10 ** 7):
            assert pm.collective_time(algorithm, n, p, COST) == pytest.approx(function(n, p, COST), rel=1e-12)
            assert pm.comm_time_function(algorithm, p, COST)(n) == pytest.approx(function(n, p, COST), rel=1e-12)


def test_ps_coefficients_agree():
    for p in (1, 2, 5, 16):
        for servers in (1, 2, 4, 32):
            assert pm.collective_time("ps", N, p, COST, servers) == pytest.approx(pm.ps_pushpull(N, p, servers, COST))


def test_invert_fit_recovers_link_parameters():
    """T(n) = a + b n of a ring on p workers, inverted: alpha = a / 2(p-1),
    beta = (b - (p-1)/p gamma) / (2(p-1)/p)."""
    for p in (2, 4, 8):
        k_a, k_b, k_g = pm.coefficients("ring", p)
        a, b = k_a * COST.alpha, k_b * COST.beta + k_g * COST.gamma
        link = pm.invert_fit(a, b, "ring", p, gamma=COST.gamma)
        assert link.alpha == pytest.approx(COST.alpha) and link.beta == pytest.approx(COST.beta)
    with pytest.raises(ValueError):
        pm.invert_fit(1.0, 1.0, "ring", 1)


def test_link_cost_rejects_negative_values():
    for bad in ({"alpha": -1.0}, {"beta": math.nan}, {"gamma": "1"}):
        with pytest.raises(ValueError):
            pm.LinkCost(**bad)


# --------------------------------------------------------------------------- iteration

def test_single_worker_io_is_hidden_when_shorter_than_compute():
    # compute = h2d + f + b + u = 0.01 + 0.1 + 0.2 + 0.02 = 0.33
    assert pm.single_worker_time(0.03, 0.01, 0.1, 0.2, 0.02) == approx(0.33)
    # slower reader: t_io' = 0.5 - 0.33 = 0.17 exposed, the iteration takes as long as reading
    assert pm.single_worker_time(0.5, 0.01, 0.1, 0.2, 0.02) == approx(0.5)
    # no prefetching: everything adds up
    assert pm.single_worker_time(0.03, 0.01, 0.1, 0.2, 0.02, prefetch=False) == approx(0.36)


def test_no_overlap_adds_the_whole_communication():
    # t_io' + t_h2d + t_f + t_b + t_c + t_u, I/O hidden behind all of it
    assert pm.no_overlap_time(0.03, 0.01, 0.1, 0.2, 0.15, 0.02) == approx(0.48)
    assert pm.no_overlap_time(0.03, 0.01, 0.1, 0.2, 0.15, 0.02, prefetch=False) == approx(0.51)
    assert pm.no_overlap_time(0.6, 0.01, 0.1, 0.2, 0.15, 0.02) == approx(0.6)


def test_wfbp_recurrence_on_three_layers():
    """Three layers in backward order (layer 1 = the network's last layer):

        backward b   = [1, 2, 1]  ->  ready tau = [1, 3, 4]
        transfer c   = [3, 1, 2]

        layer 1: s1 = max(tau1, e0) = max(1, 0) = 1,  e1 = 1 + 3 = 4
        layer 2: s2 = max(tau2, e1) = max(3, 4) = 4,  e2 = 4 + 1 = 5   (waits for the link)
        layer 3: s3 = max(tau3, e2) = max(4, 5) = 5,  e3 = 5 + 2 = 7   (waits for the link)

    backward + communication = max(tau3, e3) = 7, exposed communication = 7 - 4 = 3 of the
    6 sent; with t_io = 0.1 (no prefetch), t_f = 2 and t_u = 0.5 the iteration takes
    0.1 + 2 + 7 + 0.5 = 9.6, against 0.1 + 2 + 4 + 6 + 0.5 = 12.6 without overlap.
    """
    b, c = [1.0, 2.0, 1.0], [3.0, 1.0, 2.0]
    assert pm.ready_times(b) == [1.0, 3.0, 4.0]
    assert pm.wfbp_schedule(pm.ready_times(b), c) == [(1.0, 4.0), (4.0, 5.0), (5.0, 7.0)]
    assert pm.wfbp_backward_comm(b, c) == 7.0
    assert pm.exposed_comm(b, c) == 3.0
    assert pm.overlap_time(0.1, 0.0, 2.0, b, c, 0.5, prefetch=False) == approx(9.6)
    assert pm.no_overlap_time(0.1, 0.0, 2.0, sum(b), sum(c), 0.5, prefetch=False) == approx(12.6)


def test_wfbp_hides_all_but_the_last_transfer_when_the_link_keeps_up():
    """b = [2, 2, 2], c = [1, 1, 1]: tau = [2, 4, 6]; each transfer starts when its layer is
    done (the link is free again), e = [3, 5, 7]: only the last layer's transfer, 1, is exposed."""
    assert pm.wfbp_schedule([2.0, 4.0, 6.0], [1.0, 1.0, 1.0]) == [(2.0, 3.0), (4.0, 5.0), (6.0, 7.0)]
    assert pm.exposed_comm([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == 1.0


def test_schedule_rejects_bad_input():
    with pytest.raises(ValueError):
        pm.wfbp_schedule([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        pm.ready_times([1.0, -1.0])


# --------------------------------------------------------------------------- messages

def grads(sizes, ready):
    return [pm.Grad(f"l{k}.weight", f"l{k}", n, r) for k, (n, r) in enumerate(zip(sizes, ready))]


def test_merge_by_threshold_like_buckets():
    g = grads([1, 2, 3, 4, 1], [1, 2, 3, 4, 5])
    # a buffer closes once it holds >= 3 bytes: [1+2], [3], [4], [1]
    messages = pm.merge_by_threshold(g, 3)
    assert [m.nbytes for m in messages] == [3, 3, 4, 1]
    assert [m.ready for m in messages] == [2, 3, 4, 5]  # ready when its last member is
    # DDP-style smaller first bucket: first closes at >= 1, then >= 5
    assert [m.nbytes for m in pm.merge_by_threshold(g, 5, first_threshold=1)] == [1, 5, 5]
    assert [m.nbytes for m in pm.merge_by_threshold(g, 100)] == [11]


def test_grouping_by_layer_and_whole():
    g = [pm.Grad("a.weight", "a", 10, 1.0), pm.Grad("a.bias", "a", 2, 1.0), pm.Grad("b.weight", "b", 5, 3.0)]
    assert [(m.nbytes, m.ready) for m in pm.group_by_layer(g)] == [(12, 1.0), (5, 3.0)]
    assert [(m.nbytes, m.ready) for m in pm.group_whole(g)] == [(17, 3.0)]
    assert len(pm.group_by_tensor(g)) == 3


def test_greedy_merging_saves_latency_only_when_it_does_not_delay():
    # latency-bound: three small gradients ready close together -> one message (saves 2 alpha)
    alpha_only = pm.comm_time_function("p2p", 2, pm.LinkCost(alpha=1.0))
    merged = pm.merge_greedy(pm.group_by_tensor(grads([1, 1, 1], [0.0, 0.1, 0.2])), alpha_only)
    assert [m.nbytes for m in merged] == [3]
    # bandwidth-bound and far apart: apart e = [1, 11]; together max(0, 10) + 2 = 12 > 11
    beta_only = pm.comm_time_function("p2p", 2, pm.LinkCost(beta=1.0))
    apart = pm.merge_greedy(pm.group_by_tensor(grads([1, 1], [0.0, 10.0])), beta_only)
    assert [m.nbytes for m in apart] == [1, 1]


def test_greedy_merging_follows_mgwfbps_rule_and_keeps_ties_apart():
    """T(n) = 1 + n (alpha = 1 s): a (1 byte) ready at 0 starts at s_a = 0; b joins it only
    when r_b < s_a + alpha = 1.  At r_b = 1 the two end b at the same time either way
    (apart: a 0..2, b 2..4; together 1..4) but apart a ends sooner: no merge."""
    cost = pm.comm_time_function("p2p", 2, pm.LinkCost(alpha=1.0, beta=1.0))
    assert pm.startup_cost(cost) == 1.0
    for ready_b, expected in ((0.0, [2]), (0.999, [2]), (1.0, [1, 1]), (1.5, [1, 1])):
        merged = pm.merge_greedy(pm.group_by_tensor(grads([1, 1], [0.0, ready_b])), cost)
        assert [m.nbytes for m in merged] == expected, ready_b
    # the rule counts from when the pending message could start, s = max(r, e_prev): a + b
    # (b ready 0.5 < 0 + 1) is ready at 0.5 and runs 0.5..3.5; c (ready 2.5) could start at
    # 3.5, so d joins it when ready before 4.5
    for ready_d, expected in ((4.4, [2, 2]), (4.5, [2, 1, 1])):
        messages = pm.group_by_tensor(grads([1, 1, 1, 1], [0.0, 0.5, 2.5, ready_d]))
        assert [m.nbytes for m in pm.merge_greedy(messages, cost)] == expected, ready_d


def test_greedy_rule_is_ending_strictly_sooner_for_an_affine_cost():
    """With T = a + n b, a > 0, the rule r_b < s_a + a is exactly "together ends strictly
    sooner" (with a = 0 merging saves nothing: b ends at the same time either way)."""
    rng = random.Random(3)
    for _ in range(500):
        alpha, beta = rng.choice([0.25, 0.5, 1.0]), rng.choice([0.0, 0.125, 1.0])  # exact in binary: ties are ties
        cost = pm.comm_time_function("p2p", 2, pm.LinkCost(alpha=alpha, beta=beta))
        n_a, n_b = rng.randint(1, 5), rng.randint(1, 5)
        r_a, r_b = rng.choice([0.0, 1.0]), rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])
        start_a = r_a
        apart_b = max(r_b, start_a + cost(n_a)) + cost(n_b)
        together = max(start_a, r_b) + cost(n_a + n_b)
        merged = pm.merge_greedy([pm.Message(n_a, r_a, ("a",)), pm.Message(n_b, r_b, ("b",))], cost)
        assert (len(merged) == 1) == (together < apart_b), (alpha, beta, n_a, n_b, r_a, r_b)


def test_greedy_merging_respects_a_fusion_cap_and_cycle():
    alpha_only = pm.comm_time_function("p2p", 2, pm.LinkCost(alpha=1.0))
    messages = pm.group_by_tensor(grads([2, 2, 2], [0.0, 0.1, 0.2]))
    assert [m.nbytes for m in pm.merge_greedy(messages, alpha_only, cap=4)] == [4, 2]
    # Horovod-like: 10 ms cycle -> every message waits 5 ms on average
    scheme = pm.Scheme.from_dict({"overlap": True, "granularity": "tensor", "cycle_ms": 10.0})
    assert scheme.cycle_s == pytest.approx(0.01)
    assert [m.ready for m in scheme.messages(grads([1, 1], [0.0, 1.0]), alpha_only)] == pytest.approx([0.005, 1.005])


def test_cycle_merge_like_horovods_background_thread():
    """Four 1-byte gradients ready at [0.2, 0.5, 1.5, 4.2], cycle 1:

    T(n) = 0.5 (shorter than a cycle): t0 = 0 finds nothing ready and sleeps one cycle;
      t = 1.0 sends the two ready (0.2, 0.5) as one message; next cycle t = 1 + max(1, 0.5)
      = 2.0 sends 1.5's; t = 3.0 finds nothing, sleeps ceil((4.2 - 3) / 1) = 2 cycles; t = 5.0
      sends the last: messages (2 B at 1.0), (1 B at 2.0), (1 B at 5.0).
    T(n) = 1.5 (a transfer outlasts the cycle): t = 1.0 sends two; the next cycle starts when
      that transfer ends, 2.5, and sends 1.5's; t = 4.0 finds nothing, sleeps one cycle; t =
      5.0 sends the last: (2 at 1.0), (1 at 2.5), (1 at 5.0).
    """
    raw = grads([1, 1, 1, 1], [0.2, 0.5, 1.5, 4.2])
    g = pm.group_by_tensor(raw)
    short = pm.merge_by_cycle(g, lambda n: 0.5, cycle_s=1.0)
    assert [(m.nbytes, m.ready) for m in short] == [(2, 1.0), (1, 2.0), (1, 5.0)]
    assert short[0].members == ("l0.weight", "l1.weight")
    long = pm.merge_by_cycle(g, lambda n: 1.5, cycle_s=1.0)
    assert [(m.nbytes, m.ready) for m in long] == [(2, 1.0), (1, 2.5), (1, 5.0)]
    # the fusion threshold caps a cycle's buffer: the rest waits for the next cycle
    capped = pm.merge_by_cycle(pm.group_by_tensor(grads([2, 2, 2], [0.0, 0.0, 0.0])), lambda n: 0.5,
                               cycle_s=1.0, cap=4)
    assert [(m.nbytes, m.ready) for m in capped] == [(4, 0.0), (2, 1.0)]
    # a scheme with merge "cycle" sends these, scheduled from their cycle starts
    scheme = pm.Scheme.from_dict({"overlap": True, "granularity": "tensor", "merge": "cycle",
                                  "cycle_ms": 1000.0})
    sent = scheme.messages(raw, lambda n: 0.5)
    assert [(m.nbytes, m.ready) for m in sent] == [(2, 1.0), (1, 2.0), (1, 5.0)]
    assert [m.nbytes for m in scheme.messages(raw, lambda n: 0.5, separate=True)] == [1, 1, 1, 1]


def test_contention_slows_backward_while_a_transfer_runs():
    """The three-layer example (ready [1, 3, 4], messages [3, 1, 2] bytes at 1 s/B, t_f = 2,
    t_u = 0.5, t_io = 0.1 unhidden) with kappa = 0.5: backward runs at half pace beside a
    transfer (kappa_c = 0.25, a transfer at 3/4 pace beside backward, is worked out below).

    Message 1 is ready at 1 and runs (1, 4); backward does 1 + 0.5 * 3 = 2.5 of its work by 4.
    Message 2 is ready at work 3: backward alone reaches it at 4 + 0.5 = 4.5; it runs
    (4.5, 5.5) and backward does 3 + 0.5 = 3.5 by 5.5.  Message 3 is ready at work 4, reached
    alone at 5.5 + 0.5 = 6 = t_b'; it runs (6, 8).  Backward + communication 8, iteration
    0.1 + 2 + 8 + 0.5 = 10.6 (9.6 without contention), exposed 8 - 4 = 4.

    kappa = 1 stalls backward beside every transfer: (1, 4), then work 1 -> 3 alone by 6,
    (6, 7), work 3 -> 4 by 8, (8, 10): 12.6, the time without overlap (t_b + sum c = 10).
    """
    prof = profile([1.0, 2.0, 1.0], [3, 1, 2], io=0.1, forward=2.0, update=0.5)
    per_byte = pm.comm_time_function("p2p", 2, pm.LinkCost(beta=1.0))
    wfbp = pm.Scheme(overlap=True, granularity="layer")
    contended = pm.predict(prof, wfbp, per_byte, contention=0.5)
    assert [(t.ready, t.start, t.end) for t in contended.transfers] == [
        approx(x) for x in [(1.0, 1.0, 4.0), (4.5, 4.5, 5.5), (6.0, 6.0, 8.0)]]
    assert contended.iter_time == approx(10.6) and contended.comm_exposed == approx(4.0)
    assert pm.predict(prof, wfbp, per_byte, contention=0.0).iter_time == approx(9.6)
    stalled = pm.predict(prof, wfbp, per_byte, contention=1.0)
    assert [(t.start, t.end) for t in stalled.transfers] == [approx(x) for x in [(1, 4), (6, 7), (8, 10)]]
    # kappa_c = 0.25 as well: message 1 runs at 3/4 pace, (1, 5), backward doing 1 + 0.5 * 4 = 3
    # by 5; message 2 is ready then and runs (5, 5 + 1/0.75 = 6.333), backward 3 + 0.5 * 1.333
    # = 3.667 by then; backward alone reaches 4 at 6.667 = t_b', and message 3 runs
    # (6.667, 8.667) at full pace after it: 0.1 + 2 + 8.667 + 0.5 = 11.267
    both = pm.predict(prof, wfbp, per_byte, contention=0.5, transfer_contention=0.25)
    assert [(t.start, t.end) for t in both.transfers] == [
        approx(x) for x in [(1.0, 5.0), (5.0, 19 / 3), (20 / 3, 26 / 3)]]
    assert both.iter_time == approx(0.1 + 2 + 26 / 3 + 0.5)
    # nothing runs beside backward without overlap: kappa changes nothing
    whole = pm.Scheme()
    assert pm.predict(prof, whole, per_byte, contention=0.9).iter_time == approx(12.6)
    assert stalled.iter_time == approx(12.6)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            pm.predict(prof, wfbp, per_byte, contention=bad)
        with pytest.raises(ValueError):
            pm.predict(prof, wfbp, per_byte, transfer_contention=bad)
    with pytest.raises(ValueError):  # neither would ever advance
        pm.predict(prof, wfbp, per_byte, contention=1.0, transfer_contention=1.0)


def profile(layer_backward, sizes, io=0.0, h2d=0.0, forward=1.0, update=0.1):
    tau = pm.ready_times(layer_backward)
    return pm.Profile(io, h2d, forward, tau[-1], update, tuple(grads(sizes, tau)))


def test_predict_composes_the_equations():
    prof = profile([1.0, 2.0, 1.0], [3, 1, 2], io=0.1, forward=2.0, update=0.5)
    per_byte = pm.comm_time_function("p2p", 2, pm.LinkCost(beta=1.0))  # c = n: the 3-layer example
    wfbp = pm.predict(prof, pm.Scheme(overlap=True, granularity="layer"), per_byte)
    assert wfbp.iter_time == approx(9.6) and wfbp.comm_exposed == approx(3.0)
    assert [(t.start, t.end) for t in wfbp.transfers] == [(1.0, 4.0), (4.0, 5.0), (5.0, 7.0)]
    assert wfbp.phases["comm"] == approx(6.0)  # as the separated profile sends them
    assert wfbp.hidden_fraction == approx(0.5)
    whole = pm.predict(prof, pm.Scheme(), per_byte)
    assert whole.iter_time == approx(12.6) and whole.comm_exposed == approx(6.0)
    # a bucketed scheme whose separated profile sends the whole gradient at once
    bucket = pm.Scheme(overlap=True, granularity="bucket", bucket_bytes=4, profile_granularity="whole")
    prediction = pm.predict(prof, bucket, per_byte)
    # buckets [3+1] ready at 3, [2] at 4: e = [3+4, 7+2] = [7, 9]
    assert prediction.backward_comm == approx(9.0) and prediction.phases["comm"] == approx(6.0)


def test_compression_shrinks_each_formed_message_and_zero_adds_an_unhidden_gather():
    prof = profile([1.0, 2.0, 1.0], [3, 1, 2], io=0.1, forward=2.0, update=0.5)
    per_byte = pm.comm_time_function("p2p", 2, pm.LinkCost(beta=1.0))
    bucket = dict(overlap=True, granularity="bucket", bucket_bytes=4, profile_granularity="whole")
    # buckets form by the gradient's own bytes ([3+1], [2]), then each goes at half its bytes
    half = pm.predict(prof, pm.Scheme(**bucket, wire_ratio=0.5), per_byte)
    assert [t.nbytes for t in half.transfers] == [2.0, 1.0]
    assert [t.members for t in half.transfers] == [t.members for t in pm.predict(prof, pm.Scheme(**bucket),
                                                                                 per_byte).transfers]
    assert half.phases["comm"] == approx(3.0)  # the separated profile's whole gradient, halved too
    # ZeRO: after the update, half an all-reduce of all 6 bytes, never hidden
    plain = pm.predict(prof, pm.Scheme(**bucket), per_byte)
    zero = pm.predict(prof, pm.Scheme(**bucket, gather_params=True), per_byte)
    assert zero.iter_time - plain.iter_time == approx(3.0)
    assert zero.phases["update"] == approx(0.5 + 3.0) and zero.comm_exposed - plain.comm_exposed == approx(3.0)
    for ratio in (0.0, 1.5):
        with pytest.raises(ValueError):
            pm.Scheme(wire_ratio=ratio)


def test_fsdp_gathers_each_layer_before_its_forward_hidden_behind_the_layers_before_it():
    """FSDP: backward is the per-layer all-reduce (gather + reduce-scatter per layer); each
    layer's forward waits for its own gather, the gathers back to back from forward's start."""
    prof = profile([1.0, 2.0, 1.0], [3, 1, 2], io=0.1, forward=2.0, update=0.5)
    per_byte = pm.comm_time_function("p2p", 2, pm.LinkCost(beta=1.0))
    layerwise = dict(granularity="layer", profile_granularity="layer")
    # forward order: layer 2 (gather 1.0, forward 0.25 x 2.0), layer 1 (0.5, 1.0), layer 0 (1.5, 0.5):
    # computed at 1.0 + 0.5 = 1.5, max(1.5, 1.5) + 1.0 = 2.5, max(2.5, 3.0) + 0.5 = 3.5: 1.5 waited
    assert pm.forward_gather_wait(prof.grads, per_byte, 2.0, 4.0) == (approx(3.0), approx(1.5))
    wfbp = pm.predict(prof, pm.Scheme(overlap=True, **layerwise), per_byte)
    fsdp = pm.predict(prof, pm.Scheme(overlap=True, gather_forward=True, **layerwise), per_byte)
    assert fsdp.iter_time - wfbp.iter_time == approx(1.5)
    assert fsdp.comm_total - wfbp.comm_total == approx(3.0) and fsdp.comm_exposed - wfbp.comm_exposed == approx(1.5)
    assert fsdp.phases == wfbp.phases  # the separated profile: one gather and one reduce-scatter per layer
    # blocking collectives (FSDP2 on CPUs): every gather before its layer, nothing hidden
    blocking = pm.predict(prof, pm.Scheme(overlap=False, gather_forward=True, **layerwise), per_byte)
    assert blocking.iter_time == approx(0.1 + 2.0 + 3.0 + 4.0 + 6.0 + 0.5)


def test_scheme_from_adapter_dict():
    scheme = pm.Scheme.from_dict({"label": "DDP buckets", "overlap": True, "granularity": "bucket",
                                  "bucket_bytes": 26214400.0, "first_bucket_bytes": 1048576,
                                  "transport": "gloo", "algorithm": "ring"})
    assert scheme.name == "DDP buckets" and scheme.bucket_bytes == 26214400
    with pytest.raises(ValueError):
        pm.Scheme(granularity="bucket")  # no bucket size
    with pytest.raises(ValueError):
        pm.Scheme(algorithm="ps")  # no servers
    with pytest.raises(ValueError):
        pm.Scheme(algorithm="carrier-pigeon")


# --------------------------------------------------------------------------- limits

SCHEMES = [pm.Scheme(), pm.Scheme(overlap=True, granularity="layer"),
           pm.Scheme(overlap=True, granularity="tensor", merge="greedy"),
           pm.Scheme(overlap=True, granularity="tensor", merge="cycle", cycle_s=1e-3, bucket_bytes=30000),
           pm.Scheme(overlap=True, granularity="bucket", bucket_bytes=5000, first_bucket_bytes=1000),
           pm.Scheme(algorithm="tree", overlap=True, granularity="layer"),
           pm.Scheme(algorithm="ps", servers=2, overlap=True, granularity="layer")]


def random_profile(rng: random.Random) -> pm.Profile:
    layers = rng.randint(1, 30)
    return profile([rng.uniform(0, 0.01) for _ in range(layers)], [rng.randint(0, 20000) for _ in range(layers)],
                   io=rng.uniform(0, 0.002), h2d=rng.uniform(0, 0.002), forward=rng.uniform(0.001, 0.05),
                   update=rng.uniform(0, 0.005))


def test_zero_communication_gives_ideal_scaling():
    """Free links and no background-thread cycle (a cycle delays the last gradient by up to
    one cycle even over a free link: Horovod's HOROVOD_CYCLE_TIME is a cost of its own)."""
    rng = random.Random(1)
    for _ in range(50):
        prof = random_profile(rng)
        t_one = pm.single_worker_prediction(prof).iter_time
        for scheme in (dataclasses.replace(s, cycle_s=0.0) for s in SCHEMES):
            for p in (2, 4, 16, 128):
                free = pm.comm_time_function(scheme.algorithm, p, pm.LinkCost(), max(1, scheme.servers))
                t_n = pm.predict(prof, scheme, free).iter_time
                assert t_n == pytest.approx(t_one)
                assert pm.speedup(t_one, t_n, p) == pytest.approx(p)
                assert pm.efficiency(pm.speedup(t_one, t_n, p), p) == pytest.approx(1.0)


def test_overlap_never_beats_forward_plus_backward_nor_loses_to_no_overlap():
    rng = random.Random(2)
    for _ in range(300):
        prof = random_profile(rng)
        cost = pm.LinkCost(rng.uniform(0, 1e-4), rng.uniform(0, 1e-8), rng.uniform(0, 1e-9))
        p = rng.choice([2, 3, 8, 32])
        comm = pm.comm_time_function("ring", p, cost)
        floor = prof.io + prof.h2d + prof.forward + prof.backward + prof.update
        without = pm.predict(prof, pm.Scheme(granularity="layer"), comm).iter_time
        with_overlap = pm.predict(prof, pm.Scheme(overlap=True, granularity="layer"), comm).iter_time
        assert floor - 1e-12 <= with_overlap <= without + 1e-12


def test_contention_never_shortens_an_iteration_and_grows_with_kappa():
    """Communication that takes cores from backward makes an iteration longer, never shorter
    than without contention, more contention never helps, and even kappa = 1 (backward
    stalled beside every transfer) is no worse than no overlap at all."""
    rng = random.Random(3)
    for _ in range(200):
        prof = random_profile(rng)
        comm = pm.comm_time_function("ring", 2, pm.LinkCost(rng.uniform(0, 1e-3), rng.uniform(0, 1e-8)))
        scheme = rng.choice(SCHEMES[1:])
        floor = prof.io + prof.h2d + prof.forward + prof.backward + prof.update
        times = [pm.predict(prof, scheme, comm, kappa).iter_time for kappa in (0.0, 0.3, 0.6, 1.0)]
        assert floor - 1e-12 <= times[0]
        assert all(a <= b + 1e-12 for a, b in zip(times, times[1:])), times
        if scheme.merge is None:  # the same messages either way (merging depends on ready times)
            serial = pm.predict(prof, dataclasses.replace(scheme, overlap=False), comm).iter_time
            assert times[-1] <= serial + 1e-12


def test_speedup_and_efficiency():
    assert pm.speedup(0.1, 0.125, 2) == approx(1.6)
    assert pm.efficiency(1.6, 2) == approx(0.8)
    with pytest.raises(ValueError):
        pm.speedup(0.1, 0.0, 2)


# --------------------------------------------------------------------------- per-layer inputs

def test_backward_split_by_flop_share():
    """Forward order conv1 (100 FLOPs), relu1 (10, no parameters), conv2 (200), fc (50).
    Backward weights: conv1 1 x 100 (first layer: no input gradient), relu1 10, conv2 2 x 200,
    fc 2 x 50; total 610.  Backward order fc 100, conv2 400, then relu1's 10 is done before
    conv1's gradient: conv1 110.  With t_b = 0.61: fc 0.1, conv2 0.4, conv1 0.11."""
    rows = [("conv1", 100, True), ("relu1", 10, False), ("conv2", 200, True), ("fc", 50, True)]
    split = pm.split_backward_by_flops(0.61, rows)
    assert [name for name, _ in split] == ["fc", "conv2", "conv1"]
    assert [t for _, t in split] == pytest.approx([0.1, 0.4, 0.11])
    assert sum(t for _, t in split) == pytest.approx(0.61)


def test_backward_split_of_a_real_model_sums_to_backward():
    from models import get_model

    spec = get_model("googlenet-tiny")
    rows = [(r.name, r.flops, r.params > 0) for r in spec.layer_table()]
    split = pm.split_backward_by_flops(0.25, rows)
    assert {name for name, _ in split} == {name for name, _ in spec.gradient_sizes_backward()}
    assert sum(t for _, t in split) == pytest.approx(0.25)
    assert all(t >= 0 for _, t in split)


def test_perfmodel_is_standard_library_only():
    """The worker imports it inside every framework's environment (MXNet's has an old NumPy)."""
    import ast
    from pathlib import Path

    import analysis.perfmodel as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "bisect", "math", "dataclasses", "functools", "statistics", "typing"}, imported


# --------------------------------------------------------------------------- hierarchy

# intra-node link 5 us, 1 ns/B (1 GB/s); NIC 2 us, 2 ns/B (500 MB/s); gamma 0.1 ns/B
FABRIC = pm.Fabric(intra=pm.LinkCost(5 * US, 1e-9), inter=pm.LinkCost(2 * US, 2e-9), gamma=0.1e-9)


def test_flat_ring_goes_at_the_pace_of_its_slowest_hop():
    """2 nodes x 2 workers, p = 4, n = 1 MB: 2(p-1) = 6 steps of max(5, 2) = 5 us;
    2(p-1)/p n = 1.5 MB at the NIC's 2 ns/B = 3 ms; (p-1)/p n gamma = 75 us."""
    cost = pm.ring_on(pm.Topology(2, 2), FABRIC)
    assert cost(N) == approx(30 * US + 3 * MS + 75 * US)
    assert cost.breakdown(N) == {"link latency": approx(30 * US), "NIC": approx(3 * MS), "reduction": approx(75 * US)}
    # one node: only intra hops (2 steps of 5 us, 0.5 MB at 1 ns/B); one worker per node: only the NIC
    assert pm.ring_on(pm.Topology(1, 2), FABRIC)(N) == approx(10 * US + 1 * MS + 50 * US)
    assert pm.ring_on(pm.Topology(2, 1), FABRIC)(N) == approx(4 * US + 2 * MS + 50 * US)
    # a faster NIC than the intra-node link: the intra-node link paces the ring
    fast_nic = pm.Fabric(intra=pm.LinkCost(5 * US, 1e-9), inter=pm.LinkCost(2 * US, 0.5e-9))
    assert set(pm.ring_on(pm.Topology(2, 2), fast_nic).breakdown(N)) == {"link latency", "intra-node link"}


def test_transport_software_cost_and_efficiency():
    """nccl-like alpha_s = 3 us per step and 80 % of a link's bandwidth, 2 x 1: 2 steps of
    (2 + 3) us, 1 MB at 2 ns/B / 0.8 = 2.5 ms."""
    fabric = pm.Fabric(intra=FABRIC.intra, inter=FABRIC.inter, software=pm.LinkCost(3 * US), efficiency=0.8)
    cost = pm.ring_on(pm.Topology(2, 1), fabric)
    assert cost(N) == approx(10 * US + 2.5 * MS)
    assert cost.breakdown(N)["per-message software cost"] == approx(6 * US)


def test_two_level_all_reduce_by_hand():
    """4 nodes x 4 workers, n = 1 MB: reduce-scatter and all-gather in the node, 2 (G-1) = 6
    steps of 5 us and 2 (G-1)/G n = 1.5 MB at 1 ns/B = 1.5 ms; each worker's 1/4 shard
    all-reduced across nodes, 2 (N-1) = 6 steps of 2 us, the 4 shards together through the
    NIC: 2 (N-1)/N n = 1.5 MB at 2 ns/B = 3 ms; sums (3/4 + 3/16) n gamma = 93.75 us."""
    cost = pm.two_level_on(pm.Topology(4, 4), FABRIC)
    assert cost(N) == approx(30 * US + 12 * US + 1.5 * MS + 3 * MS + 93.75 * US)
    # the flat ring on the same cluster: 30 steps of 5 us, 1.875 MB at the NIC's 2 ns/B
    assert pm.ring_on(pm.Topology(4, 4), FABRIC)(N) == approx(150 * US + 3.75 * MS + 93.75 * US)
    # one worker per node or one node: the two-level all-reduce is the flat ring
    for topology in (pm.Topology(4, 1), pm.Topology(1, 4)):
        assert pm.two_level_on(topology, FABRIC)(N) == approx(pm.ring_on(topology, FABRIC)(N))


def test_one_link_everywhere_is_the_flat_model():
    cost = pm.LinkCost(10 * US, 1e-9, 0.5e-9)
    for nodes, per_node in ((1, 2), (2, 1), (2, 2), (4, 4), (3, 5)):
        flat = pm.comm_time_function("ring", nodes * per_node, cost)
        assert pm.ring_on(pm.Topology(nodes, per_node), pm.Fabric.flat(cost))(N) == approx(flat(N))


def test_parameter_servers_share_the_nodes_nics():
    """2 nodes x 2 workers, one server on node 0 (n = 1 MB each way per worker): node 1's
    NIC sends both its workers' whole gradients (2 n) and node 0's receives them (2 n); node
    0's server takes n from each local worker over its intra-node link (2 n).  A push or
    pull: 2 us + max(2 MB x 1 ns/B, 2 MB x 2 ns/B) = 4 ms; server sums (P-1)/S n gamma."""
    cost = pm.ps_on(pm.Topology(2, 2), FABRIC, servers=1)
    assert pm.server_loads(2, 2, 1) == (2.0, 2.0, False)
    assert cost(N) == approx(2 * 2 * US + 2 * 4 * MS + 3 * 0.1 * MS)
    # one server per node: each NIC sends 2 n / 2 and receives 2 n / 2; each server takes n
    assert pm.server_loads(2, 2, 2) == (1.0, 1.0, False)
    # 4 nodes x 1 worker, one server: node 0 receives 3 n -- the server side binds
    assert pm.server_loads(4, 1, 1) == (1.0, 3.0, True)
    assert "parameter server" in pm.ps_on(pm.Topology(4, 1), FABRIC, servers=1).breakdown(N)
    # servers on machines of their own: worker NICs send G n = 2 n, 2 servers take 4 n / 2
    assert pm.server_loads(2, 2, 2, "dedicated") == (1.0, 2.0, False)
    # one node: the flat formula with the server links taken as intra-node links
    flat = pm.ps_pushpull(N, 4, 2, pm.LinkCost(5 * US, 1e-9, 0.1e-9))
    assert pm.ps_on(pm.Topology(1, 4), FABRIC, servers=2)(N) == approx(flat)
    with pytest.raises(ValueError):
        pm.server_loads(2, 2, 1, "nowhere")


def test_local_reduce_then_one_push_per_node():
    """MXNet dist_device_sync, 2 nodes x 4 devices, one server per node: the node's reduce
    and broadcast (2 x 3 steps of 5 us, 2 x 3/4 MB at 1 ns/B, 3/4 n gamma) and one push/pull
    per node (1 pusher per node: each NIC carries n / 2 each way; 2 us + 0.5 MB x 2 ns/B)."""
    scheme = pm.Scheme(algorithm="ps", servers=2, topology="local_reduce")
    cost = pm.topology_cost(scheme, pm.Topology(2, 4), FABRIC)
    inside = 30 * US + 1.5 * MS + 0.075 * MS
    across = 2 * (2 * US + 1 * MS) + 0.5 * 0.1 * MS
    assert cost(N) == approx(inside + across)
    # against every worker pushing: each NIC carries 4 n / 2 = 2 n each way
    every = pm.topology_cost(pm.Scheme(algorithm="ps", servers=2), pm.Topology(2, 4), FABRIC)
    assert every(N) == approx(2 * (2 * US + 4 * MS) + 7 / 2 * 0.1 * MS)
    with pytest.raises(ValueError):
        pm.Scheme(algorithm="tree", topology="two_level")


def test_bottleneck_names_what_the_iteration_waits_for():
    prof = profile([1.0, 1.0], [1_000_000, 1_000_000], forward=1.0, update=0.0)
    scheme = pm.Scheme(overlap=True, granularity="layer")
    cheap = pm.ring_on(pm.Topology(2, 2), FABRIC)  # 3 ms per 1 MB: hidden behind 1 s layers
    assert pm.bottleneck(pm.predict(prof, scheme, cheap), cheap) == "compute"
    slow = pm.ring_on(pm.Topology(2, 2), pm.Fabric(intra=FABRIC.intra, inter=pm.LinkCost(2 * US, 2e-6)))
    assert pm.bottleneck(pm.predict(prof, scheme, slow), slow) == "NIC"
    chatty = pm.ring_on(pm.Topology(2, 2), pm.Fabric(inter=pm.LinkCost(0.5, 0.0), intra=pm.LinkCost(0.5, 0.0)))
    assert pm.bottleneck(pm.predict(prof, scheme, chatty), chatty) == "link latency"


# --------------------------------------------------------------------------- node effects, coordination, pipelining

def test_expected_maximum_of_normals_matches_tippetts_table():
    """e_p = E[max of p standard normals]: e_2 = 1/sqrt(pi) exactly; Tippett (1925) for 4..32."""
    assert pm.expected_max_standard_normal(1) == 0.0
    assert pm.expected_max_standard_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    for p, table in ((4, 1.0294), (8, 1.4236), (16, 1.7660), (32, 2.0697)):
        assert pm.expected_max_standard_normal(p) == pytest.approx(table, abs=1e-4), p


def test_straggler_factor_and_step_jitter_by_hand():
    # 8 ranks whose steps vary by 2 %: the slowest takes 1 + 0.02 x 1.4236 as long
    assert pm.straggler_factor(8, 0.02) == pytest.approx(1 + 0.02 * 1.42360, rel=1e-5)
    assert pm.straggler_factor(1, 0.5) == 1.0 and pm.straggler_factor(64, 0.0) == 1.0
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError):
            pm.straggler_factor(8, bad)
    # six repeats of 100 steps, 362.41 +- 0.24 images/s: 0.24 / 362.41 x sqrt(100) per step
    assert pm.step_jitter(0.24, 362.41, 100) == pytest.approx(0.24 / 362.41 * 10)
    with pytest.raises(ValueError):
        pm.step_jitter(0.1, 0.0, 10)


def node_profile() -> pm.Profile:
    grads = (pm.Grad("fc.w", "fc", 1_000_000, 0.1), pm.Grad("conv.w", "conv", 1_000_000, 0.2))
    return pm.Profile(0.0, 0.01, 0.1, 0.2, 0.01, grads, prefetch=True)


def test_node_effects_stretch_compute_and_share_the_host_link():
    """2 x 4 ranks, jitter 0.2: forward, backward and ready times x (1 + 0.2 e_8); four
    workers of 10 GB/s each on a 20 GB/s host link: the copy takes 4 x 10 / 20 = 2 x as long."""
    effects = pm.NodeEffects(jitter=0.2, host_to_device=10e9, host_bandwidth=20e9)
    stretch = 1 + 0.2 * pm.expected_max_standard_normal(8)
    shaped, losses = effects.shape(node_profile(), pm.Topology(2, 4))
    assert shaped.forward == pytest.approx(0.1 * stretch) and shaped.backward == pytest.approx(0.2 * stretch)
    assert [g.ready for g in shaped.grads] == pytest.approx([0.1 * stretch, 0.2 * stretch])
    assert shaped.h2d == pytest.approx(0.02)
    assert losses == pytest.approx({"slowest worker": 0.3 * (stretch - 1), "host link": 0.01})
    # one worker, or a host link wide enough: nothing changes
    assert effects.shape(node_profile(), pm.Topology(1, 1)) == (node_profile(), {})
    assert pm.NodeEffects(0.0, 10e9, 80e9).shape(node_profile(), pm.Topology(1, 8))[1] == {}
    # no communication at all: t = h2d' + (f + b) stretch + u, named by its largest loss
    prediction = pm.predict_on(node_profile(), pm.Scheme(), pm.CommCost(), pm.Topology(2, 4), effects)
    assert prediction.iter_time == pytest.approx(0.02 + 0.3 * stretch + 0.01)
    assert pm.bottleneck(prediction, pm.CommCost()) == "slowest worker"
    mild = pm.predict_on(node_profile(), pm.Scheme(), pm.CommCost(), pm.Topology(2, 4), pm.NodeEffects(0.01))
    assert pm.bottleneck(mild, pm.CommCost()) == "compute"  # 1.4 % of the iteration: within the 10 %


def test_pipelined_transport_pays_the_link_latency_once_per_queue():
    """2 nodes x 1 worker, NIC 50 us and 1 ns/B: T(n) = 2 x 50 us + n x 1 ns/B.  Two 1 MB
    tensors after backward: the second waits behind the first and, pipelined, skips its
    100 us of link latency; ready after the first ended, it pays them again."""
    fabric = pm.Fabric(inter=pm.LinkCost(50 * US, 1e-9), pipelined=True)
    cost = pm.topology_cost(pm.Scheme(granularity="tensor"), pm.Topology(2, 1), fabric)
    assert cost(N) == approx(100 * US + 1 * MS) and cost.queued == approx(100 * US)
    after = pm.Scheme(granularity="tensor")
    transfers = pm.predict(node_profile(), after, cost).transfers
    assert [t.end - t.start for t in transfers] == pytest.approx([1.1 * MS, 1.0 * MS])
    assert [t.hidden for t in transfers] == pytest.approx([0.0, 100 * US])
    plain = pm.topology_cost(after, pm.Topology(2, 1), replace_fabric(fabric, pipelined=False))
    assert plain.queued == 0.0
    assert [t.end - t.start for t in pm.predict(node_profile(), after, plain).transfers] == pytest.approx([1.1 * MS] * 2)
    # during backward the tensors are ready 100 ms apart: nothing is queued, both pay it
    during = pm.Scheme(overlap=True, granularity="tensor")
    assert [t.hidden for t in pm.predict(node_profile(), during, cost).transfers] == [0.0, 0.0]


def replace_fabric(fabric: pm.Fabric, **changes) -> pm.Fabric:
    return dataclasses.replace(fabric, **changes)


def test_coordination_is_a_tree_of_control_hops_per_message():
    """coordination 10 us per hop: 2 x 1 ranks over the NIC (50 us): 1 hop of 60 us; 1 x 8
    over the intra-node link (5 us): ceil(log2 8) = 3 hops of 15 us."""
    fabric = pm.Fabric(intra=pm.LinkCost(5 * US, 1e-9), inter=pm.LinkCost(50 * US, 1e-9), coordination=10 * US)
    across = pm.ring_on(pm.Topology(2, 1), fabric)
    assert across.breakdown(N)["coordination"] == approx(60 * US)
    inside = pm.ring_on(pm.Topology(1, 8), fabric)
    assert inside.breakdown(N)["coordination"] == approx(45 * US)
    assert "coordination" not in pm.ring_on(pm.Topology(1, 8), replace_fabric(fabric, coordination=0.0)).breakdown(N)
    # the node's own reduce in MXNet's device kvstore is one process: no control exchange
    assert "coordination" not in pm.local_reduce_on(pm.Topology(2, 4), fabric).breakdown(N)


def test_parameter_servers_on_the_host_cpu_by_hand():
    """One node of 8 workers, one server on its CPU: each worker's slices leave over its own
    10 GB/s link, all 8 n cross the node's 40 GB/s host link: 8 / 40 GB/s = 0.2 ns/B each
    way; the CPU sums 7 n at 3 / 60 GB/s."""
    fabric = pm.Fabric(device_link=pm.LinkCost(beta=1 / 10e9), host_link=pm.LinkCost(beta=1 / 40e9),
                       server_gamma=3 / 60e9, inter=pm.LinkCost(50 * US, 1 / 1.25e9))
    cost = pm.ps_on(pm.Topology(1, 8), fabric, 1, "host")
    assert cost.breakdown(N) == pytest.approx({"host link": 2 * 8 * N / 40e9, "parameter server": 7 * N * 3 / 60e9})
    # a 100 GB/s host link: each worker's own 10 GB/s link bounds it
    wide = pm.ps_on(pm.Topology(1, 8), replace_fabric(fabric, host_link=pm.LinkCost(beta=1 / 100e9)), 1, "host")
    assert wide.breakdown(N)["host link"] == pytest.approx(2 * N / 10e9)
    # 2 nodes x 8, a server on each CPU: the host link carries 8 x 1/2, the NIC 8 x 1/2 out and
    # 1 x 8/2 in; at 1.25 GB/s the NIC is the busier; both servers sum 15/2 n, each in its own host
    two = pm.ps_on(pm.Topology(2, 8), fabric, 2, "host")
    assert pm.server_loads(2, 8, 2, "host") == (4.0, 4.0, False)
    assert two.breakdown(N) == pytest.approx({"link latency": 100 * US, "NIC": 2 * 4 * N / 1.25e9,
                                             "parameter server": 7.5 * N * 3 / 60e9})
    # two servers on one CPU share its memory: twice the sums of one
    one_host = pm.ps_on(pm.Topology(1, 8), fabric, 2, "host")
    assert one_host.breakdown(N)["parameter server"] == pytest.approx(2 * 7 / 2 * N * 3 / 60e9)
    with pytest.raises(ValueError):
        pm.server_loads(2, 8, 2, "rack")


def test_a_queued_saving_cannot_exceed_the_latency():
    with pytest.raises(ValueError):
        pm.CommCost((pm.CostTerm("link latency", 1e-6),), queued=2e-6)
