"""Calibration: fitting alpha, beta (gamma) from timings, nccl-tests' bandwidths, the store's
calibration tables, and the calibrate CLI's input checks (a real calibration is in
tests/test_predict.py's loopback campaign)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
from rich.console import Console

from analysis import calibration as cal
from analysis import perfmodel as pm
from analysis import tables
from analysis.store import ResultStore
from tests.conftest import run_cli

SIZES = cal.default_sizes()  # 1 KB .. 64 MB, x2


def synthetic_points(truth: pm.LinkCost, p: int, rng: random.Random, sigma: float = 0.08,
                     repeats: int = 10, outliers: float = 0.05) -> dict[int, list[float]]:
    """Ring all-reduce times of `truth` with multiplicative log-normal noise (sigma), and a
    share of samples a busy machine made 3-10 times slower."""
    points = {}
    for n in SIZES:
        t = pm.ring_allreduce(n, p, truth)
        samples = []
        for _ in range(repeats):
            value = t * math.exp(rng.gauss(0.0, sigma))
            if rng.random() < outliers:
                value *= rng.uniform(3, 10)
            samples.append(value)
        points[n] = samples
    return points


def reduction_points(gamma: float, rng: random.Random, sigma: float = 0.08) -> dict[int, list[float]]:
    return {n: [(2e-6 + gamma * n) * math.exp(rng.gauss(0.0, sigma)) for _ in range(10)] for n in SIZES}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("p", [2, 4])
def test_fit_recovers_alpha_and_beta_within_5_percent_from_noisy_timings(seed, p):
    rng = random.Random(seed)
    truth = pm.LinkCost(alpha=25e-6, beta=0.4e-9, gamma=0.1e-9)  # 25 us, 20 Gbit/s
    fit = cal.fit_calibration(synthetic_points(truth, p, rng), framework="x", mode="m", transport="t",
                              collective="allreduce", algorithm="ring", device_kind="cpu", nodes=1,
                              workers_per_node=p, reduction_points=reduction_points(truth.gamma, rng))
    assert fit.alpha_s == pytest.approx(truth.alpha, rel=0.05)
    assert fit.beta_s_per_byte == pytest.approx(truth.beta, rel=0.05)
    assert fit.gamma_s_per_byte == pytest.approx(truth.gamma, rel=0.05)
    assert fit.world_size == p and fit.n_sizes == len(SIZES) and fit.repeats == 10


def test_fit_without_reduction_timings_folds_gamma_into_beta():
    truth = pm.LinkCost(alpha=5e-6, beta=1e-9, gamma=0.2e-9)
    points = {n: [pm.ring_allreduce(n, 2, truth)] for n in SIZES}
    fit = cal.fit_calibration(points, framework="x", mode="m", transport="t", collective="allreduce",
                              algorithm="ring", device_kind="cpu", nodes=1, workers_per_node=2)
    assert fit.gamma_s_per_byte == 0.0
    # T = 2 alpha + n (beta + gamma / 2): beta absorbs the reduction
    assert fit.beta_s_per_byte == pytest.approx(1.1e-9) and fit.alpha_s == pytest.approx(5e-6)
    assert fit.rel_rmse == pytest.approx(0.0, abs=1e-9)
    assert fit.predicted(2 ** 20) == pytest.approx(pm.ring_allreduce(2 ** 20, 2, truth))


def test_fit_linear_exact_and_degenerate():
    a, b, rms = cal.fit_linear([1, 2, 4, 8], [3 + 2 * n for n in [1, 2, 4, 8]])
    assert (a, b) == (pytest.approx(3.0), pytest.approx(2.0)) and rms == pytest.approx(0.0, abs=1e-12)
    # decreasing times would need a negative slope: constant fit instead
    a, b, _ = cal.fit_linear([1, 2, 4], [5.0, 4.0, 3.0])
    assert b == 0.0 and a > 0
    with pytest.raises(ValueError):
        cal.fit_linear([1], [1.0])
    with pytest.raises(ValueError):
        cal.fit_linear([2, 2], [1.0, 1.1])


def test_nccl_tests_bandwidth_conventions():
    # 1 GB all-reduced in 1 s by 8 ranks: algbw 1 GB/s, busbw 2 * 7/8 = 1.75 GB/s
    assert cal.algbw(1e9, 1.0) == 1e9
    assert cal.busbw(1e9, 1.0, "allreduce", 8) == pytest.approx(1.75e9)
    assert cal.busbw(1e9, 1.0, "allgather", 8) == pytest.approx(0.875e9)
    assert cal.busbw(1e9, 1.0, "broadcast", 8) == pytest.approx(1e9)
    with pytest.raises(ValueError):
        cal.busbw(1, 1, "gossip", 2)


def test_default_sizes_follow_nccl_tests_steps():
    assert SIZES[0] == 1024 and SIZES[-1] == 64 * 2 ** 20 and len(SIZES) == 17
    assert cal.default_sizes(1024, 4096, 4) == [1024, 4096]


def fit_row(framework, transport, world, nodes=1, device="cpu", alpha=1e-5, mode="m"):
    return cal.CalibrationFit(framework, mode, transport, "allreduce", "ring", device, nodes, world // nodes,
                              world, 0, 2 * alpha, 1e-9, 0.01, alpha, 1e-9, 0.0, 17, 10)


def test_lookup_prefers_same_framework_and_topology():
    fits = [fit_row("torch", "gloo", 4), fit_row("cntk-style", "gloo", 2), fit_row("torch", "gloo", 2, device="gpu"),
            fit_row("caffe", "mpi", 2)]
    found, how = cal.lookup(fits, framework="torch", transport="gloo", world_size=2, nodes=1, device_kind="cpu")
    assert (found.framework, how) == ("cntk-style", "calibrated (same transport)")
    found, how = cal.lookup(fits, framework="torch", transport="gloo", world_size=4, nodes=1, device_kind="cpu")
    assert (found.framework, found.world_size, how) == ("torch", 4, "calibrated")
    found, how = cal.lookup(fits, framework="torch", transport=None, world_size=8, nodes=1, device_kind="cpu")
    assert (found.world_size, how) == (4, "calibrated (other world size)")
    assert cal.lookup(fits, framework="tf", transport="grpc", world_size=2, nodes=1, device_kind="cpu") is None


def test_lookup_does_not_price_one_mode_with_another_modes_calibration():
    """tf:collective's ring over gRPC says nothing about tf:ps's push/pull; two modes over the
    same transport still share it, labelled as such."""
    fits = [fit_row("tf", "grpc", 2, mode="collective")]
    assert cal.lookup(fits, framework="tf", mode="ps", transport=None, world_size=2, nodes=1,
                      device_kind="cpu") is None
    found, how = cal.lookup(fits, framework="tf", mode="collective", transport="grpc", world_size=2, nodes=1,
                            device_kind="cpu")
    assert how == "calibrated"
    found, how = cal.lookup(fits, framework="tf", mode="mirrored", transport="grpc", world_size=4, nodes=1,
                            device_kind="cpu")
    assert how == "calibrated (same transport, other world size)"


def test_store_keeps_calibrations_and_replaces_the_same_key(tmp_path):
    rng = random.Random(0)
    truth = pm.LinkCost(alpha=25e-6, beta=0.4e-9)
    points = synthetic_points(truth, 2, rng, outliers=0.0)
    fit = cal.fit_calibration(points, framework="torch", mode="ddp", transport="gloo", collective="allreduce",
                              algorithm="ring", device_kind="cpu", nodes=1, workers_per_node=2)
    with ResultStore.for_campaign(tmp_path) as store:
        first = store.add_calibration(fit, points, reduction_points(1e-10, rng), measured_at="t0")
        second = store.add_calibration(fit, points, None, measured_at="t1")
        rows = store.calibrations()
        assert len(rows) == 1 and rows[0]["calibration_id"] == second != first and rows[0]["measured_at"] == "t1"
        assert store.calibration_fits() == [fit]
        stored = store.calibration_points(second)
        assert [p["bytes"] for p in stored] == SIZES and {p["kind"] for p in stored} == {"collective"}
        assert stored[0]["values"] == points[SIZES[0]] and stored[0]["repeats"] == 10
        frame = store.calibration_frame()
        assert list(frame["framework"]) == ["torch"] and frame["alpha_s"].iloc[0] == pytest.approx(fit.alpha_s)
    # reopening read-only sees it
    with ResultStore.for_campaign(tmp_path, create=False) as store:
        assert len(store.calibration_fits()) == 1


def test_format_points_uses_nccl_tests_columns():
    points = {1024: [1e-5], 2 ** 20: [1e-3]}
    fit = cal.fit_calibration(points, framework="torch", mode="ddp", transport="gloo", collective="allreduce",
                              algorithm="ring", device_kind="cpu", nodes=1, workers_per_node=2)
    text = cal.format_points(fit, points)
    assert "algbw(GB/s)" in text and "busbw(GB/s)" in text and "alpha" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("1M"))
    # 1 MiB in 1 ms: algbw 1.049 GB/s; busbw with p = 2 is the same (2(p-1)/p = 1)
    assert "1.049" in line


@pytest.mark.parametrize("args,needle", [
    (["--workers", "1"], "at least 2 workers"),
    (["--frameworks", "nope"], "unknown framework"),
    (["--min-bytes", "1X"], "cannot read size"),
    (["--min-bytes", "64M", "--max-bytes", "1K"], "--min-bytes"),
    (["--repeats", "0"], "--repeats"),
    (["--nodes", "2"], "cluster transport"),
    (["--workers", "two"], "whole numbers"),
])
def test_calibrate_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    result = run_cli("launchers.calibrate", "--out", str(tmp_path / "c"), *args, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "c" / "results.sqlite").exists()


# --------------------------------------------------------------------------- contention

def horovod_like_fit(alpha_s: float = 0.6e-3) -> cal.CalibrationFit:
    return cal.CalibrationFit("horovod", "gloo", "horovod-gloo", "allreduce", "ring", "cpu", 1, 2, 2, 0,
                              2 * alpha_s, 1e-9, 0.1, alpha_s, 1e-9, 0.0, 17, 10)


def probe_with(kappa: float, kappa_c: float, fit: cal.CalibrationFit, scheme: dict, rng: random.Random,
               sigma: float = 0.01) -> dict:
    """A contention probe whose backward-with-submissions obeys the model at (kappa, kappa_c):
    16 tensors of 64 KiB ready over a 15 ms backward; t_w the end of backward and t_d the end
    of the exchange in `perfmodel.contended_schedule`, with 1 % log-normal noise on every
    sample."""
    ready = [0.3e-3 * (k + 1) for k in range(12)] + [10e-3, 10.1e-3, 15.6e-3, 15.6e-3]
    t_a = 15.7e-3
    described = {**scheme, "granularity": "tensor", "overlap": True}
    comm = pm.comm_time_function("ring", 2, fit.cost)
    grads = [pm.Grad(f"probe{i}", f"probe{i}", 65536, r) for i, r in enumerate(ready)]
    transfers, t_w = pm.contended_schedule(grads, pm.Scheme.from_dict(described), comm, t_a, kappa, kappa_c)
    t_d = max([t_w] + [t.end for t in transfers])
    noisy = lambda t: [t * math.exp(rng.gauss(0.0, sigma)) for _ in range(7)]  # noqa: E731
    return {"bytes": [65536] * len(ready), "alone_s": noisy(t_a), "with_s": noisy(t_w), "done_s": noisy(t_d),
            "ready_s": ready}


PAIRS = [(0.2, 0.0), (0.5, 0.3), (0.9, 0.6), (0.3, 0.7), (0.6, 0.5)]


@pytest.mark.parametrize("kappa, kappa_c", PAIRS)
def test_fit_contention_recovers_both_shares_where_the_exchange_outlasts_backward(kappa, kappa_c):
    """With per-tensor messages whose exchange (16 x 2.5 ms) outlasts the 15 ms backward, the
    probe's two ends tell the shares apart: the median of five noisy probes (1 % noise) is
    within 0.1 of kappa and of kappa_c."""
    fit = horovod_like_fit(alpha_s=1.2e-3)
    scheme = {"algorithm": "ring"}
    estimates = [cal.fit_contention(probe_with(kappa, kappa_c, fit, scheme, random.Random(seed)), scheme, fit)
                 for seed in range(5)]
    kappas, kappa_cs = zip(*estimates)
    assert abs(statistics.median(kappas) - kappa) <= 0.1, estimates
    assert abs(statistics.median(kappa_cs) - kappa_c) <= 0.1, estimates


@pytest.mark.parametrize("kappa, kappa_c", PAIRS)
@pytest.mark.parametrize("merge", [None, "cycle"])
def test_fitted_shares_reproduce_the_probe_and_prefer_the_least_transfer_contention(kappa, kappa_c, merge):
    """Where the exchange hardly outlasts backward (16 x 1.3 ms, or Horovod's cycles merging
    them into five), pairs along a curve end the probe alike: (0.3, 0.7) and (1, 0) both end
    backward at 21.4 ms and the exchange at 22.8 ms with cycles.  Whatever the truth, the fit
    ends both as the probe did (noise-free: within 0.2 %), and no pair with less transfer
    contention on the grid would."""
    fit = horovod_like_fit()
    scheme = {"merge": merge, "cycle_ms": 1.0, "algorithm": "ring"}
    probe = probe_with(kappa, kappa_c, fit, scheme, random.Random(0), sigma=0.0)
    fitted, fitted_c = cal.fit_contention(probe, scheme, fit)
    t_a = probe["alone_s"][0]
    described = pm.Scheme.from_dict({**scheme, "granularity": "tensor", "overlap": True})
    comm = pm.comm_time_function("ring", 2, fit.cost)
    grads = [pm.Grad(f"probe{i}", f"probe{i}", n, r) for i, (n, r) in enumerate(zip(probe["bytes"], probe["ready_s"]))]

    def ends(k, k_c):
        transfers, backward_end = pm.contended_schedule(grads, described, comm, t_a, k, k_c)
        return backward_end, max([backward_end] + [t.end for t in transfers])

    assert ends(fitted, fitted_c) == (pytest.approx(probe["with_s"][0], rel=2e-3),
                                      pytest.approx(probe["done_s"][0], rel=2e-3))
    assert fitted_c <= kappa_c + 1 / cal.KAPPA_C_STEPS


@pytest.mark.parametrize("kappa, kappa_c", [(0.5, 0.0), (0.3, 0.4)])
def test_fit_contention_leaves_the_exchanges_own_lateness_to_the_replay(kappa, kappa_c):
    """An exchange that ends 3 ms after the model's schedule of it whether or not backward
    runs (a last cycle, waiting on handles: Horovod over MPI) is not contention.  Without the
    replay the fit reads it as transfer contention; with the replay of the exchange alone,
    also 3 ms late, it recovers the true shares (noise-free: within one grid step)."""
    fit = horovod_like_fit(alpha_s=1.2e-3)
    scheme = {"algorithm": "ring"}
    probe = probe_with(kappa, kappa_c, fit, scheme, random.Random(0), sigma=0.0)
    late = 3e-3
    grads = [pm.Grad(f"probe{i}", f"probe{i}", n, r) for i, (n, r) in enumerate(zip(probe["bytes"], probe["ready_s"]))]
    transfers, _ = pm.contended_schedule(grads, pm.Scheme.from_dict({**scheme, "granularity": "tensor", "overlap": True}),
                                         pm.comm_time_function("ring", 2, fit.cost), probe["alone_s"][0], 0.0, 0.0)
    late_probe = {**probe, "done_s": [t + late for t in probe["done_s"]]}
    replayed = {**late_probe, "replay_s": [max(t.end for t in transfers) + late] * len(probe["with_s"])}
    assert cal.fit_contention(late_probe, scheme, fit)[1] > kappa_c + 0.05  # taken for contention
    fitted, fitted_c = cal.fit_contention(replayed, scheme, fit)
    assert fitted == pytest.approx(kappa, abs=0.05) and fitted_c == pytest.approx(kappa_c, abs=1 / cal.KAPPA_C_STEPS)


def test_fit_contention_without_exchange_ends_fits_kappa_alone():
    """A probe stored before probes timed the exchange (no done_s): kappa_c = 0 and kappa from
    backward's end."""
    fit = horovod_like_fit()
    scheme = {"algorithm": "ring"}
    probe = probe_with(0.5, 0.0, fit, scheme, random.Random(1), sigma=0.0)
    del probe["done_s"]
    kappa, kappa_c = cal.fit_contention(probe, scheme, fit)
    assert kappa == pytest.approx(0.5, abs=1e-6) and kappa_c == 0.0


def test_fit_contention_limits():
    fit = horovod_like_fit()
    scheme = {"merge": "cycle", "cycle_ms": 1.0}
    assert cal.fit_contention(None, scheme, fit) == (0.0, 0.0)  # no probe: no contention assumed
    faster = {"bytes": [65536, 65536], "alone_s": [0.02] * 3, "with_s": [0.019] * 3, "done_s": [0.021] * 3,
              "ready_s": [0.001, 0.02]}
    assert cal.fit_contention(faster, scheme, fit)[0] == 0.0  # noise below zero is clipped
    slower = {**faster, "with_s": [1.0] * 3, "done_s": [1.0] * 3}
    assert cal.fit_contention(slower, scheme, fit)[0] == 1.0  # and above one


def test_store_reads_calibrations_stored_before_contention_as_none(tmp_path):
    """A store written before calibrations had a contention column gets that column added
    empty; those fits read as kappa 0, what their predictions assumed."""
    rng = random.Random(0)
    points = synthetic_points(pm.LinkCost(alpha=25e-6, beta=0.4e-9), 2, rng, outliers=0.0)
    fit = cal.fit_calibration(points, framework="torch", mode="ddp", transport="gloo", collective="allreduce",
                              algorithm="ring", device_kind="cpu", nodes=1, workers_per_node=2)
    with ResultStore.for_campaign(tmp_path) as store:
        store.add_calibration(dataclasses.replace(fit, contention=0.4), points)
        assert store.calibration_fits()[0].contention == 0.4
        store._conn.execute("UPDATE calibration SET contention = NULL")
        store._conn.commit()
        assert store.calibration_fits()[0].contention == 0.0


class RecordingTrainer:
    """Just the calibration interface: `collective_times` logs each call (size, repeats,
    warm-up, iters) and answers the time of call number k as k, so a sample shows when it was
    taken."""

    MAX_CALIBRATION_ITERS = 20

    def __init__(self):
        self.calls = []

    def collective_times(self, sizes, repeats, warmup=2, iters=1):
        out = {}
        for size in sizes:
            self.calls.append((size, repeats, warmup, iters))
            out[size] = [float(len(self.calls))] * repeats
        return out


class RecordingTrainerWithoutIters(RecordingTrainer):
    def collective_times(self, sizes, repeats, warmup=2):
        return super().collective_times(sizes, repeats, warmup)


@pytest.mark.parametrize("trainer_class", [RecordingTrainer, RecordingTrainerWithoutIters])
def test_calibration_takes_each_repeat_as_a_round_over_every_size(trainer_class):
    """Sample i of every size comes from round i (a burst of load spoils a few samples of
    every size, not every sample of a few sizes); the warm-up is the first round's only;
    back-to-back calls up to loop_bytes per sample where the adapter takes `iters`."""
    from adapters.calibration import collective_samples

    trainer = trainer_class()
    sizes = [1024, 65536, 4 * 2 ** 20]
    samples = collective_samples(trainer, sizes, repeats=3, warmup=2, loop_bytes=2 ** 20)
    assert samples == {1024: [1.0, 4.0, 7.0], 65536: [2.0, 5.0, 8.0], 4 * 2 ** 20: [3.0, 6.0, 9.0]}
    assert [warmup for _, _, warmup, _ in trainer.calls] == [2, 2, 2] + [0] * 6
    assert all(repeats == 1 for _, repeats, _, _ in trainer.calls)
    if trainer_class is RecordingTrainer:
        assert [iters for _, _, _, iters in trainer.calls[:3]] == [20, 16, 1]


# --------------------------------------------------------------------------- bracketing

def test_pool_samples_and_probes():
    assert cal.pool_samples({1024: [1.0, 2.0]}, None, {"1024": [3.0], 2048: [4.0]}) == {1024: [1.0, 2.0, 3.0],
                                                                                        2048: [4.0]}
    before = {"bytes": [8, 16], "alone_s": [1.0, 1.1], "with_s": [1.5, 1.6], "ready_s": [0.2, 0.9]}
    after = {"bytes": [8, 16], "alone_s": [2.0], "with_s": [2.2], "ready_s": [0.4, 1.1], "rank_slowdown": [1.1]}
    pooled = cal.pool_probes(before, after)
    assert pooled["alone_s"] == [1.0, 1.1, 2.0] and pooled["with_s"] == [1.5, 1.6, 2.2]  # pairs kept
    assert pooled["ready_s"] == pytest.approx([0.3, 1.0]) and pooled["bytes"] == [8, 16]
    assert cal.pool_probes(before, None) is None  # one window without a probe: none
    assert cal.pool_probes(before, {**after, "bytes": [8]}) is None  # another network
    timed = cal.pool_probes({**before, "done_s": [1.7, 1.8]}, {**after, "done_s": [2.5]})
    assert timed["done_s"] == [1.7, 1.8, 2.5]  # exchange ends kept with their rounds
    assert "done_s" not in cal.pool_probes(before, {**after, "done_s": [2.5]})  # only where every probe has them
    replayed = cal.pool_probes({**before, "replay_s": [0.4, 0.5]}, {**after, "replay_s": [0.6]})
    assert replayed["replay_s"] == [0.4, 0.5, 0.6] and "done_s" not in replayed


def test_closing_calibration_pools_both_windows_through_the_store(tmp_path):
    """What `compare --calibrate` does after the runs (launchers.calibrate.pooled_result): the
    stored calibration's timings and probe plus the new ones, fitted together.  A first window
    on a machine 60% slower per message and a second normal one fit a between the two."""
    from launchers.calibration_runs import pooled_result

    rng = random.Random(1)
    normal = pm.LinkCost(alpha=250e-6, beta=1e-9)
    slow = pm.LinkCost(alpha=400e-6, beta=1e-9)

    def fit_of(points):
        return cal.fit_calibration(points, framework="mxnet", mode="dist_sync", transport="ps-lite",
                                   collective="pushpull", algorithm="ring", device_kind="cpu", nodes=1,
                                   workers_per_node=2)

    first, second = (synthetic_points(cost, 2, rng, sigma=0.02, outliers=0.0) for cost in (slow, normal))
    probe = {"bytes": [4096] * 3, "alone_s": [0.010] * 7, "with_s": [0.012] * 7, "ready_s": [0.001, 0.004, 0.009]}
    with ResultStore.for_campaign(tmp_path) as store:
        store.add_calibration(fit_of(first), first, {1024: [1e-7]}, measured_at="t0", extra={"contention": probe})
        previous = store.calibrations()[0]
        pooled = pooled_result({"collective": {str(k): v for k, v in second.items()}, "reduction": {1024: [3e-7]},
                                "contention": {**probe, "with_s": [0.014] * 7}}, previous, store)
    assert all(len(pooled["collective"][n]) == 20 for n in SIZES)
    assert pooled["reduction"] == {1024: [1e-7, 3e-7]}
    assert pooled["contention"]["with_s"] == [0.012] * 7 + [0.014] * 7
    a = fit_of(pooled["collective"]).fit_a_s
    assert fit_of(second).fit_a_s < a < fit_of(first).fit_a_s
    line = cal.drift_line(fit_of(first), fit_of(second))
    assert line.startswith("a 80") and "-3" in line.split("(")[1], line  # 800 -> 500 us: -37%
    windows = [{"measured_at": "t0", "fit_a_s": 800e-6, "fit_b_s_per_byte": 1e-9},
               {"measured_at": "t1", "fit_a_s": 500e-6, "fit_b_s_per_byte": 1.1e-9}]
    with ResultStore.for_campaign(tmp_path) as store:
        store.add_calibration(fit_of(pooled["collective"]), pooled["collective"], extra={"windows": windows})
        shown = tables.calibration_table(store.calibration_frame()).iloc[0]
    assert shown["windows"] == 2 and shown["repeats"] == 20
    assert shown["drift_a_pct"] == pytest.approx(-37.5) and shown["drift_b_pct"] == pytest.approx(10.0)


def test_closing_calibration_finds_the_one_before_by_the_stores_whole_key(tmp_path):
    """`calibrate_one` looks the calibration before the runs up by the store's key, servers
    included: an MXNet calibration with 2 servers is not the one to pool with a campaign's
    1-server calibration (it returns at once, having nothing of its own to close), while the
    1-server one is (it goes on, here to a one-line failure: no environment given)."""
    from adapters.registry import framework_info
    from launchers.calibration_runs import calibrate_one
    from launchers.interpreters import Interpreters

    points = synthetic_points(pm.LinkCost(alpha=250e-6, beta=1e-9), 2, random.Random(2), sigma=0.02, outliers=0.0)
    settings = {"servers": 1, "device": "cpu", "out": tmp_path, "sizes": SIZES, "repeats": 10, "warmup": 1,
                "timeout": 60}

    def close(servers):
        with ResultStore.for_campaign(tmp_path) as store:
            fit = cal.fit_calibration(points, framework="mxnet", mode="dist_sync", transport="ps-lite",
                                      collective="pushpull", algorithm="ps", device_kind="cpu", nodes=1,
                                      workers_per_node=2, servers=servers)
            store.add_calibration(fit, points, measured_at="2026-12-03T10:00:00+00:00")
            return calibrate_one(settings, Interpreters(), store, Console(quiet=True), False, None, framework_info("mxnet"),
                                 "dist_sync", 1, 2, None, None, pool_since="2026-12-03T09:00:00+00:00")

    assert close(servers=2) == []
    failure = close(servers=1)
    assert len(failure) == 1 and "unavailable" in failure[0], failure


def store_frame(out):
    with ResultStore.for_campaign(out, create=False) as store:
        return store.calibration_frame()


@pytest.mark.slow
def test_compare_calibrate_brackets_the_runs_and_pools_the_two_calibrations(tmp_path):
    """`compare --calibrate` calibrates before the runs and again after them; the stored fit
    has both calibrations' timings (20 per size), both windows, and the runs' predictions are
    made with it."""
    out = tmp_path / "bracket"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "2",
                     "--iterations", "2", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1",
                     "--calibrate", "--out", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.index("calibrating torch:ddp") < result.stderr.index("closing calibration of torch:ddp")
    assert "torch:ddp 1x2 after the runs: a " in result.stderr, result.stderr[-3000:]
    with ResultStore.for_campaign(out, create=False) as store:
        (row,) = store.calibrations()
        points = store.calibration_points(row["calibration_id"])
        (run,) = store.records()
    assert row["repeats"] == 20 and all(p["repeats"] == 20 for p in points if p["kind"] == "collective")
    windows = row["extra"]["windows"]
    assert len(windows) == 2 and row["measured_at"] == windows[0]["measured_at"] < windows[1]["measured_at"]
    (shown,) = tables.calibration_table(store_frame(out)).to_dict("records")
    assert shown["windows"] == 2 and shown["drift_a_pct"] == pytest.approx(
        (windows[1]["fit_a_s"] / windows[0]["fit_a_s"] - 1) * 100)
    assert len(row["extra"]["contention"]["alone_s"]) == 2 * 21
    assert run["extra"]["prediction"]["basis"] == "calibrated"
    assert run["extra"]["prediction"]["calibration"]["alpha_s"] == pytest.approx(row["alpha_s"])
