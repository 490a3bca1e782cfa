"""The verdict (analysis/verdict.py) on hand-made runs frames: rankings, margins over launches, and
where each scheme's lost time went, checked against numbers worked out by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from analysis import verdict

LABELS = {"torch": "PyTorch DDP", "cntk-style": "CNTK-style", "tf": "TensorFlow", "mxnet": "MXNet"}


def run(framework="torch", mode="ddp", nodes=1, per_node=1, t=0.100, forward=0.030, backward=0.060, comm=0.0,
        overlap=None, io=0.001, update=0.005, spread=(0.95, 1.05), threads=None, cores=2, other=0.0,
        arrival_sync=None, model="alexnet-tiny", batch=16, **extra) -> dict:
    """One successful run as a row of `ResultStore.runs_frame()`; times in seconds."""
    world = nodes * per_node
    threads = threads if threads is not None else max(1, cores // per_node)
    rank_phases = [{"io": io, "h2d": 0.0, "forward": forward, "backward": backward, "comm": comm, "update": update}
                   for _ in range(world)]
    row = {"run_id": f"{framework}-{mode}-{model}-{nodes}x{per_node}-{t}", "status": "ok", "framework": framework,
           "framework_label": LABELS.get(framework, framework), "mode": mode, "synchronous": 1, "model": model,
           "device_kind": "cpu", "device_name": "Test CPU", "batch_per_worker": batch, "global_batch": batch * world,
           "nodes": nodes, "workers_per_node": per_node, "world_size": world, "bandwidth": None, "latency": None,
           "iter_time_median": t, "iter_time_p10": t * spread[0], "iter_time_p90": t * spread[1],
           "throughput": batch * world / t, "overlap": overlap, "threads_per_worker": threads, "cpu_cores": cores,
           "ranks_per_host": per_node, "oversubscribed": int(per_node * threads > cores), "other_load": other,
           "phase_io_s": io, "phase_h2d_s": 0.0, "phase_forward_s": forward, "phase_backward_s": backward,
           "phase_comm_s": comm, "phase_update_s": update, "extra_rank_phases_s": json.dumps(rank_phases),
           "extra_sync_compute_s_before_comm": arrival_sync if arrival_sync is not None else io + forward + backward}
    row.update(extra)
    return row


def table_of(*runs) -> pd.DataFrame:
    return verdict.verdict_table(pd.DataFrame(list(runs)))


def pick(table, framework, topology) -> pd.Series:
    hit = table[(table["framework"] == framework) & (table["topology"] == topology)]
    assert len(hit) == 1, hit
    return hit.iloc[0]


def test_lost_time_is_split_into_its_causes_by_hand():
    # one worker: 100 ms; two workers sharing 2 cores with 1 thread each: 150 ms, forward and
    # backward 1.5x (30+60 -> 45+90 ms), 10 ms of communication none of it hidden, the
    # slowest rank reaching the exchange 5 ms after the average (141 vs 136 ms)
    one = run(t=0.100, forward=0.030, backward=0.060)
    two = run(per_node=2, t=0.150, forward=0.045, backward=0.090, comm=0.010, overlap=0.0, arrival_sync=0.141)
    got = pick(table_of(one, two), "torch", "1×2")
    assert got["efficiency"] == pytest.approx(0.100 / 0.150)
    assert got["lost_ms"] == pytest.approx(50.0)
    assert got["compute_ms"] == pytest.approx(45.0)
    assert got["comm_ms"] == pytest.approx(10.0)
    assert got["skew_ms"] == pytest.approx(5.0)
    assert got["io_ms"] == pytest.approx(0.0) and got["update_ms"] == pytest.approx(0.0)
    assert got["rest_ms"] == pytest.approx(50.0 - 45.0 - 10.0 - 5.0)
    assert got["compute_ratio"] == pytest.approx(1.5)
    assert got["cause"] == "compute"
    text = got["cause_text"]
    assert "slower compute 45.0 ms" in text and "1.50×" in text
    assert "2 workers × 1 thread on 2 cores" in text and "one worker alone had 2 threads" in text
    assert "exposed communication 10.0 ms" in text and text.startswith("50.0 ms more per iteration than one worker")
    assert "outside the profiled phases" not in text and "read them as shares" not in text  # -10 of 50 ms


def test_the_cause_says_when_the_profile_and_the_throughput_mode_disagree():
    one = run(t=0.100)
    # throughput mode lost 10 ms, the profile's compute grew by 45 ms
    two = run(per_node=2, t=0.110, forward=0.045, backward=0.090)
    assert "grew by 45.0 ms, more than the throughput-mode iteration" in pick(table_of(one, two), "torch",
                                                                            "1×2")["cause_text"]
    # throughput mode lost 50 ms, the profile places 10 ms
    two = run(per_node=2, t=0.150, forward=0.035, backward=0.065)
    assert "40.0 ms outside the profiled phases" in pick(table_of(one, two), "torch", "1×2")["cause_text"]


def test_exposed_communication_uses_the_measured_overlap_and_quotes_the_model():
    one = run(t=0.100)
    # 80 ms of communication of which 25 % hid behind backward: 60 ms exposed
    two = run(per_node=2, t=0.165, forward=0.031, backward=0.061, comm=0.080, overlap=0.25,
              extra_prediction_comm_exposed_s=0.055)
    got = pick(table_of(one, two), "torch", "1×2")
    assert got["comm_ms"] == pytest.approx(60.0)
    assert got["cause"] == "comm"
    assert "25% of 80.0 ms hidden behind backward" in got["cause_text"]
    assert "the model predicts 55.0 ms" in got["cause_text"]


def launches(framework, mode, times, **kwargs) -> list[dict]:
    """One run per launch of a configuration, launch k timed times[k - 1]."""
    return [run(framework, mode, t=t, extra_launch=k, **kwargs) for k, t in enumerate(times, start=1)]


def test_schemes_are_ranked_with_the_winners_margin_and_its_interval_over_launches():
    # two launches each; round 2 runs 2 % slower for every configuration, which the test removes
    runs = [*launches("torch", "ddp", [0.100, 0.102]), *launches("torch", "ddp", [0.150, 0.153], per_node=2),
            *launches("cntk-style", "allreduce", [0.100, 0.102]),
            *launches("cntk-style", "allreduce", [0.200, 0.205], per_node=2)]
    table = table_of(*runs)
    winner, second = pick(table, "torch", "1×2"), pick(table, "cntk-style", "1×2")
    assert (winner["rank"], second["rank"], winner["launches"]) == (1, 2, 2)
    assert winner["scheme"] == "torch:ddp"
    torch_thr, cntk_thr = (32 / 0.150 + 32 / 0.153) / 2, (32 / 0.200 + 32 / 0.205) / 2  # medians over launches
    assert winner["margin_pct"] == pytest.approx((torch_thr / cntk_thr - 1) * 100)
    assert second["behind_winner_pct"] == pytest.approx((1 - cntk_thr / torch_thr) * 100)
    assert winner["margin_low_pct"] < winner["margin_pct"] < winner["margin_high_pct"]
    assert winner["beyond_noise"] is True and winner["p_value"] < 0.05
    assert winner["efficiency_low"] < winner["efficiency"] < winner["efficiency_high"]
    found = {v.title: v for v in verdict.verdicts(table)}
    headline = found["alexnet-tiny · 1 node × 2 workers · batch 16/worker · Test CPU"].headline
    assert headline.startswith("PyTorch DDP is fastest at 211 images/s, 34% [")
    assert "ahead of CNTK-style (158); beyond the between-launch noise (2 launches each, p = " in headline


def test_a_win_inside_the_between_launch_noise_is_no_winner():
    # the order flips between the two rounds: nothing is proven
    runs = [*launches("torch", "ddp", [0.140, 0.165], per_node=2),
            *launches("cntk-style", "allreduce", [0.165, 0.150], per_node=2)]
    table = table_of(*runs)
    assert pick(table, "torch", "1×2")["beyond_noise"] is False
    headline = verdict.verdicts(table)[0].headline
    assert headline.startswith("No clear winner: ") and "within the between-launch noise (2 launches each" in headline


def test_one_launch_each_cannot_rank_and_says_what_would():
    runs = [run("torch", "ddp", per_node=2, t=0.150), run("cntk-style", "allreduce", per_node=2, t=0.200)]
    table = table_of(*runs)
    assert pick(table, "torch", "1×2")["beyond_noise"] is None
    assert "cannot be ranked: 1 launch each" in verdict.verdicts(table)[0].headline
    assert "--launches 2" in verdict.verdicts(table)[0].headline


def test_topologies_with_the_same_world_size_stay_apart():
    runs = [run(t=0.100), run(per_node=2, t=0.120), run(nodes=2, per_node=1, t=0.240)]
    table = table_of(*runs)
    assert list(table["topology"]) == ["1×1", "1×2", "2×1"]
    assert pick(table, "torch", "1×2")["images_per_s"] == pytest.approx(32 / 0.120)
    assert pick(table, "torch", "2×1")["images_per_s"] == pytest.approx(32 / 0.240)  # never averaged
    assert len(verdict.verdicts(table)) == 3


def test_flags_oversubscription_a_busy_machine_and_noise():
    runs = [run(t=0.1), run(per_node=2, threads=2, t=0.3, forward=0.09, backward=0.18, other=1.3, spread=(0.7, 1.4))]
    got = pick(table_of(*runs), "torch", "1×2")
    assert "oversubscribed: 2 ranks × 2 threads on 2 cores" in got["flags"]
    assert "busy machine: other processes kept 1.3 of 2 cores busy" in got["flags"]
    assert "unsteady launch: its repeats' p10–p90 spans 70% of the median" in got["flags"]
    assert "oversubscribed" in got["cause_text"]  # the compute explanation says it too
    quiet = pick(table_of(run(t=0.1), run(per_node=2, t=0.15)), "torch", "1×2")
    assert quiet["flags"] == ""
    assert quiet["cause"] == "rest" and "none of it in the profiled phases" in quiet["cause_text"]


def test_a_slow_baseline_is_named_instead_of_a_cause():
    runs = [run(t=0.900, spread=(0.6, 1.05), other=1.2), run(per_node=2, t=0.060)]
    got = pick(table_of(*runs), "torch", "1×2")
    assert got["efficiency"] > 10 and got["cause"] == "baseline"
    assert "its one-worker run took 900.0 ms" in got["cause_text"]
    assert "other processes kept 1.2 of 2 cores busy during it" in got["cause_text"]


def test_without_a_one_worker_run_only_the_absolute_causes_are_given():
    got = pick(table_of(run(per_node=2, t=0.15, comm=0.02, overlap=0.5)), "torch", "1×2")
    assert math.isnan(got["efficiency"]) and math.isnan(got["compute_ms"])
    assert got["comm_ms"] == pytest.approx(10.0)
    assert got["cause_text"].startswith("no one-worker run of this scheme")


def test_asynchronous_schemes_are_listed_but_not_ranked():
    runs = [run("tf", "ps-async", per_node=2, t=0.05, synchronous=0), run("torch", "ddp", per_node=2, t=0.15)]
    table = table_of(*runs)
    assert pick(table, "torch", "1×2")["rank"] == 1
    assert math.isnan(pick(table, "tf", "1×2")["rank"])
    assert verdict.verdicts(table)[0].headline.startswith("Only PyTorch DDP was measured here")


def test_repeated_runs_of_a_configuration_are_summarised_by_their_median():
    runs = [run(per_node=2, t=t, run_id=f"r{i}") for i, t in enumerate((0.1, 0.3, 0.2))]
    got = verdict.verdict_table(pd.DataFrame(runs)).iloc[0]
    assert got["launches"] == 3 and got["iter_ms"] == pytest.approx(200.0)


def test_failed_runs_and_empty_frames_give_no_verdict():
    failed = {**run(), "status": "failed"}
    assert verdict.verdict_table(pd.DataFrame([failed])).empty
    empty = verdict.verdict_table(pd.DataFrame(columns=list(run())))
    assert empty.empty and list(empty.columns) == verdict.VERDICT_COLUMNS
    assert verdict.verdicts(empty) == []


def test_peak_memory_near_the_device_or_the_machine_is_flagged():
    gib = 2 ** 30
    near = run(per_node=2, extra_peak_memory_bytes=int(75 * gib), extra_memory_total_bytes=80 * gib,
               extra_peak_memory_kind="device")
    got = pick(table_of(near), "torch", "1×2")
    assert "memory: a rank's peak held 94% of the device's 80.0 GiB" in got["flags"]
    assert got["peak_memory_mib"] == pytest.approx(75 * 1024)
    # two ranks of 12 GiB resident on a 24 GiB machine; one of 2 GiB is nothing to flag
    shared = run(per_node=2, extra_peak_memory_bytes=12 * gib, extra_memory_total_bytes=24 * gib,
                 extra_peak_memory_kind="resident")
    assert "memory: the 2 ranks on a machine held up to 100% of its 24.0 GiB" in pick(table_of(shared), "torch", "1×2")["flags"]
    small = run(per_node=2, extra_peak_memory_bytes=2 * gib, extra_memory_total_bytes=24 * gib,
                extra_peak_memory_kind="resident")
    assert "memory" not in pick(table_of(small), "torch", "1×2")["flags"]
