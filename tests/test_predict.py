"""The model applied: a prediction for every stored run, the study's tables, the what-if CLI,
and (slow) the model against real 2-rank loopback campaigns of every synchronous scheme."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from analysis import perfmodel as pm
from analysis import predict, rendering, report, tables, units, whatif
from analysis.calibration import CalibrationFit
from analysis.store import ResultStore
from bench.loopback_prediction import (campaign_arguments, prediction_table, scheme_medians,
                                       schemes_to_hold, show)
from models import get_model
from tests.conftest import run_cli
from tests.test_analysis_data import make_campaign, make_record

MODEL = "alexnet-tiny"
SPEC = get_model(MODEL)
LAYERS = [name for name, _ in SPEC.gradient_sizes_backward()]  # fc8 ... conv1
TENSORS = [(name, 4 * math.prod(shape)) for name, shape in reversed(list(SPEC.parameter_shapes().items()))]
TOTAL_BYTES = sum(n for _, n in TENSORS)
PHASES = {"io": 0.001, "h2d": 0.0, "forward": 0.020, "backward": 0.040, "comm": 0.005, "update": 0.002}
ALPHA, BETA = 50e-6, 2e-9


def record(framework="torch", mode="ddp", world_size=2, scheme=None, t_iter=0.070, **overrides):
    """A run of alexnet-tiny whose layers take 5 ms of backward each (8 layers = 40 ms)."""
    rec = make_record("PyTorch DDP" if framework == "torch" else framework, framework, mode, world_size, t_iter,
                      run_id=f"{framework}-{mode}-w{world_size}", model=MODEL, **overrides)
    rec["phases"] = [{"phase": p, "measured_s": (v if world_size > 1 or p != "comm" else 0.0), "predicted_s": None}
                     for p, v in PHASES.items()]
    rec["extra"] = {"layer_backward_s": [[name, 0.005] for name in LAYERS], "layer_backward_source": "hooks"}
    if scheme is not None:
        rec["extra"]["comm_scheme"] = scheme
    rec["predicted_iter_time"] = rec["prediction_error"] = None
    return rec


def calibration(framework="torch", transport="gloo", world_size=2, gamma=0.0) -> CalibrationFit:
    # ring on p = 2: T(n) = 2 alpha + n (beta + gamma / 2)
    return CalibrationFit(framework, "ddp", transport, "allreduce", "ring", "cpu", 1, world_size, world_size, 0,
                          2 * ALPHA, BETA + gamma / 2, 0.01, ALPHA, BETA, gamma, 17, 10)


WHOLE = {"overlap": False, "granularity": "whole", "algorithm": "ring", "transport": "gloo"}
TENSOR_WFBP = {"overlap": True, "granularity": "tensor", "algorithm": "ring", "transport": "mpi"}


# --------------------------------------------------------------------------- per run

def test_whole_gradient_after_backward_by_hand():
    item = predict.predict_record(record(scheme=WHOLE), [calibration()])
    t_c = 2 * ALPHA + TOTAL_BYTES * BETA
    expected = 0.001 + 0.020 + 0.040 + t_c + 0.002
    assert item["predicted_iter_time"] == pytest.approx(expected)
    assert item["prediction_error"] == pytest.approx((expected - 0.070) / 0.070)
    assert item["phases"]["comm"] == pytest.approx(t_c)
    assert item["prediction"]["basis"] == "calibrated"
    assert item["prediction"]["comm_exposed_s"] == pytest.approx(t_c)
    assert item["prediction"]["scheme"]["assumed"] is False


def test_layerwise_overlap_follows_the_wfbp_recurrence():
    item = predict.predict_record(record(framework="caffe-mpi-style", mode="mpi", scheme=TENSOR_WFBP),
                                  [calibration("caffe-mpi-style", "mpi")])
    # tensors in reverse parameter order, each ready when its layer's backward is done
    ready = {name: 0.005 * (k + 1) for k, name in enumerate(LAYERS)}
    schedule = pm.wfbp_schedule([ready[t.rsplit(".", 1)[0]] for t, _ in TENSORS],
                                [2 * ALPHA + n * BETA for _, n in TENSORS])
    expected = 0.001 + 0.020 + max(0.040, schedule[-1][1]) + 0.002
    assert item["predicted_iter_time"] == pytest.approx(expected)
    timeline = item["prediction"]["timeline"]
    assert len(timeline["transfers"]) == len(TENSORS) and len(timeline["layers"]) == len(LAYERS)
    assert timeline["backward_start"] == pytest.approx(0.021)
    assert item["phases"]["comm"] == pytest.approx(sum(2 * ALPHA + n * BETA for _, n in TENSORS))


def test_without_calibration_the_measured_comm_is_spread_over_the_bytes():
    item = predict.predict_record(record(scheme=WHOLE), [])
    assert item["prediction"]["basis"] == predict.BASIS_MEASURED
    assert item["phases"]["comm"] == pytest.approx(PHASES["comm"])
    assert item["predicted_iter_time"] == pytest.approx(sum(PHASES.values()))


def test_single_worker_and_unknown_scheme_and_failed_runs():
    single = predict.predict_record(record(world_size=1, scheme=WHOLE), [])
    assert single["prediction"]["basis"] == predict.BASIS_SINGLE
    assert single["predicted_iter_time"] == pytest.approx(0.063)
    assumed = predict.predict_record(record(scheme=None), [calibration()])
    assert assumed["prediction"]["scheme"]["assumed"] is True and assumed["prediction"]["basis"] == "calibrated"
    failed = record(scheme=WHOLE)
    failed["status"] = "failed"
    assert predict.predict_record(failed, [calibration()]) is None
    no_profile = record(scheme=WHOLE)
    no_profile["phases"] = []
    assert predict.predict_record(no_profile, []) is None


def test_flop_split_when_the_record_has_no_layer_times():
    rec = record(scheme=WHOLE)
    rec["extra"].pop("layer_backward_s")
    item = predict.predict_record(rec, [calibration()])
    assert item["prediction"]["layer_source"] == "flop-share (analysis)"
    layers = item["prediction"]["timeline"]["layers"]
    assert layers[-1][2] - layers[0][1] == pytest.approx(0.040)


def test_slowest_rank_profile_is_used_when_kept():
    rec = record(scheme=WHOLE)
    rec["extra"]["rank_phases_s"] = [{**PHASES, "forward": 0.010}, {**PHASES, "backward": 0.050}]
    item = predict.predict_record(rec, [calibration()])
    assert item["phases"]["backward"] == pytest.approx(0.050) and item["phases"]["forward"] == pytest.approx(0.020)


def test_compute_is_stretched_to_the_slowest_rank_per_iteration():
    """Profile rounds of two ranks, compute before the exchange (io+h2d+f+b) in ms:
    rank 0: 60, 80, 60, 70; rank 1: 80, 60, 60, 50 -> each rank's median is 60 or 65 but
    the iterations wait for 80, 80, 60, 70.  Rounds of 1, 2 and 1 iterations (each after a
    timed loop): round means 80, 70, 70, median 70 -- the statistic of the measured time, a
    median over loops of the mean iteration.  Forward and backward are stretched by
    (70 - 1) / 60."""
    from adapters.worker import slowest_rank_compute

    def samples(values):
        return [{"io": 0.001, "h2d": 0.0, "forward": (v - 1) / 3e3, "backward": 2 * (v - 1) / 3e3, "update": 0.002}
                for v in values]

    found = slowest_rank_compute([{"profile_samples": samples([60, 80, 60, 70]), "profile_rounds": [1, 2, 1]},
                                  {"profile_samples": samples([80, 60, 60, 50]), "profile_rounds": [1, 2, 1]}])
    assert found["before_comm"] == pytest.approx(0.070) and found["iterations"] == 4 and found["rounds"] == 3
    without_rounds = slowest_rank_compute([{"profile_samples": samples([60, 80, 60, 70])},
                                           {"profile_samples": samples([80, 60, 60, 50])}])
    assert without_rounds["before_comm"] == pytest.approx(0.0725)  # one round: the mean
    rec = record(scheme=WHOLE)
    rec["extra"]["sync_compute_s"] = found
    item = predict.predict_record(rec, [calibration()])
    scale = (0.070 - 0.001) / 0.060
    assert item["phases"]["forward"] == pytest.approx(0.020 * scale)
    assert item["phases"]["backward"] == pytest.approx(0.040 * scale)
    assert item["predicted_iter_time"] == pytest.approx(0.070 + 2 * ALPHA + TOTAL_BYTES * BETA + 0.002)


def test_comm_is_timed_from_the_last_rank_arrival_so_skew_is_not_overlap():
    """One separated iteration of a scheme that cannot overlap (CNTK's), in ms: rank 0 ends
    backward at 100 and waits 20 for rank 1 before their 10 ms exchange (comm phase 30);
    rank 1 arrives at 120 (comm 10); both end at 130.  Run overlapped, the slowest rank's
    backward+comm is again 120 + 10.  Counting rank 0's wait as comm (the old per-phase
    maximum) gives overlap (120 + 30 - 130) / 30 = 0.67; the exchange from the last arrival
    is 130 - 120 = 10 ms and the overlap (120 + 10 - 130) / 10 = 0."""
    from adapters.worker import collective_time, overlap_fraction, slowest_rank_compute

    assert collective_time([0.100, 0.120], [0.030, 0.010]) == pytest.approx(0.010)
    assert overlap_fraction(0.120, 0.030, 0.130) == pytest.approx(2 / 3)
    assert overlap_fraction(0.120, 0.010, 0.130) == pytest.approx(0.0)
    ranks = [{"profile_samples": [{"forward": 0.030, "backward": 0.070, "comm": 0.030, "update": 0.001},
                                  {"forward": 0.030, "backward": 0.090, "comm": 0.012, "update": 0.001}]},
             {"profile_samples": [{"forward": 0.040, "backward": 0.080, "comm": 0.010, "update": 0.001},
                                  {"forward": 0.040, "backward": 0.070, "comm": 0.022, "update": 0.001}]}]
    found = slowest_rank_compute(ranks)  # exchanges 10 and 12 ms (rank 1 waits 10 in the second)
    assert found["comm"] == pytest.approx(0.011) and found["comm_median"] == pytest.approx(0.011)
    rec = record(scheme=WHOLE)
    rec["extra"]["sync_compute_s"] = found
    assert predict._measured_comm(rec) == pytest.approx(0.011)


def test_refresh_writes_predictions_into_the_store(tmp_path):
    with ResultStore.for_campaign(tmp_path) as store:
        store.add(record(world_size=1, scheme=WHOLE, t_iter=0.063))
        store.add(record(scheme=WHOLE))
        failed = record(framework="cntk-style", mode="allreduce", scheme=WHOLE)
        failed.update(status="failed", error="boom")
        store.add(failed)
        store.add_calibration(calibration(), {1024: [1e-4], 2048: [1.1e-4]})
        predictions = predict.refresh_predictions(store)
        assert {p["run_id"] for p in predictions} == {"torch-ddp-w1", "torch-ddp-w2"}
        two = store.get("torch-ddp-w2")
        assert two["predicted_iter_time"] == pytest.approx(0.063 + 2 * ALPHA + TOTAL_BYTES * BETA)
        assert {p["phase"]: p["predicted_s"] for p in two["phases"]}["comm"] == pytest.approx(
            2 * ALPHA + TOTAL_BYTES * BETA)
        assert two["extra"]["prediction"]["from_single_worker_s"] == pytest.approx(two["predicted_iter_time"])
        assert store.get("cntk-style-allreduce-w2")["predicted_iter_time"] is None
        frame = store.runs_frame()
    table = tables.prediction_table(frame)
    assert list(table["world_size"]) == [1, 2] and table["basis"].tolist() == ["single worker", "calibrated"]
    summary = tables.prediction_summary(frame)
    assert summary["calibrated_runs"].tolist() == [1] and summary["multi_worker_runs"].tolist() == [1]


# --------------------------------------------------------------------------- tables and report

def study_records():
    records = []
    for label, fw, mode, times in (("PyTorch DDP", "torch", "ddp", {(1, 1): 0.100, (1, 2): 0.125, (1, 4): 0.15,
                                                                    (2, 2): 0.2}),
                                   ("CNTK-style", "cntk-style", "allreduce", {(1, 1): 0.1, (1, 2): 0.2})):
        for (nodes, world), t in times.items():
            rec = record(framework=fw, mode=mode, world_size=world, scheme=WHOLE, t_iter=t, nodes=nodes,
                         workers_per_node=world // nodes, framework_label=label)
            rec["run_id"] = f"{fw}-{nodes}x{world}"
            records.append(rec)
    return records


def test_study_tables_markdown_csv_latex(tmp_path):
    out = make_campaign(tmp_path / "c", study_records())
    with ResultStore.for_campaign(out) as store:
        frame = store.runs_frame()
    wide = tables.study_scaling_tables(frame)[MODEL]
    assert list(wide.index) == ["CNTK-style", "PyTorch DDP"]
    topologies = list(dict.fromkeys(wide.columns.get_level_values(0)))
    assert topologies == ["1 worker", "2 workers", "4 workers", "2 nodes", "4 nodes"]
    assert wide.loc["PyTorch DDP", ("2 workers", "S")] == pytest.approx(1.6)
    assert wide.loc["PyTorch DDP", ("2 nodes", "E")] == pytest.approx(0.5)
    assert math.isnan(wide.loc["CNTK-style", ("4 workers", "ms")])
    written = tables.write_study_tables(frame, out)
    tex = written[f"study_scaling_{MODEL}"]["tex"].read_text()
    assert r"\multicolumn{3}{c}{2 workers}" in tex and r"\toprule" in tex and "PyTorch DDP & 100.0 & 1.00" in tex
    md = written[f"study_scaling_{MODEL}"]["md"].read_text()
    assert "2 workers S" in md and "1.60" in md
    single = written["study_single"]["csv"].read_text()
    assert "images_per_s" in single and "backward_ms" in single
    assert rendering.latex_escape("a_b & 5%") == r"a\_b \& 5\%"


def test_report_has_model_section_timeline_and_study_tables(tmp_path):
    out = make_campaign(tmp_path / "c", study_records())
    with ResultStore.for_campaign(out) as store:
        store.add_calibration(calibration(), {1024: [1e-4], 2048: [1.1e-4]})
    text = report.build_report(out).read_text(encoding="utf-8")
    for needle in ('id="model"', "Performance model: error per scheme", "Calibration of the communication model",
                   'id="study"', "study_scaling_alexnet-tiny.tex", "One iteration as the model schedules it", "calibrated"):
        assert needle in text, needle
    assert (out / "figures" / "timeline.png").is_file()
    with ResultStore.for_campaign(out) as store:
        assert all(r["predicted_iter_time"] is not None for r in store.records() if r["status"] == "ok")


# --------------------------------------------------------------------------- what-if

def whatif_campaign(tmp_path) -> Path:
    records = [record(world_size=1, scheme={**WHOLE, "overlap": True, "granularity": "bucket",
                                            "bucket_bytes": 25 * 2 ** 20, "first_bucket_bytes": 2 ** 20}),
               record(framework="caffe-mpi-style", mode="mpi", world_size=1, scheme=TENSOR_WFBP)]
    out = make_campaign(tmp_path / "c", records)
    with ResultStore.for_campaign(out) as store:
        store.add_calibration(calibration(gamma=1e-10), {1024: [1e-4], 2048: [1.1e-4]})
    return out


GRID = ["--nodes", "2,4,8,16", "--bandwidth", "10Gbit,56Gbit,100Gbit", "--latency", "5us,50us"]


def test_whatif_grid_is_consistent(tmp_path):
    out = whatif_campaign(tmp_path)
    args = predict.build_parser().parse_args(["--from", str(out), "--model", MODEL, *GRID])
    rows, written = predict.run(args)
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    assert len(rows) == len(schemes) * 24 and len(schemes) == 2 + len(predict.CATALOGUE)
    assert schemes[:2] == ["torch:ddp", "caffe-mpi-style:mpi"]  # sorted by framework label
    for scheme in schemes:
        for bandwidth in ("10Gbit", "56Gbit", "100Gbit"):
            for latency in ("5us", "50us"):
                line = sorted((r["world_size"], r["efficiency"]) for r in rows if r["scheme"] == scheme
                              and r["bandwidth"] == bandwidth and r["latency"] == latency)
                assert len(line) == 4 and all(0 < e <= 1 + 1e-9 for _, e in line)
                if scheme != "ps":  # ring: more workers never help efficiency
                    assert [e for _, e in line] == sorted((e for _, e in line), reverse=True)
        # a faster network is never worse
        for n in (2, 16):
            slow = next(r for r in rows if r["scheme"] == scheme and r["nodes"] == n and r["bandwidth"] == "10Gbit"
                        and r["latency"] == "50us")
            fast = next(r for r in rows if r["scheme"] == scheme and r["nodes"] == n and r["bandwidth"] == "100Gbit"
                        and r["latency"] == "5us")
            assert fast["efficiency"] >= slow["efficiency"]
    # by hand: no-overlap, 2 nodes at 10 Gbit/s and 5 us, compute of the first profile
    row = next(r for r in rows if r["scheme"] == "no-overlap" and r["nodes"] == 2
               and r["bandwidth"] == "10Gbit" and r["latency"] == "5us")
    t_c = 2 * 5e-6 + TOTAL_BYTES * (8 / 10e9 + 1e-10 / 2)
    assert row["iter_time_s"] == pytest.approx(0.063 + t_c)
    assert row["speedup"] == pytest.approx(2 * 0.063 / (0.063 + t_c))
    assert row["comm_exposed_s"] == pytest.approx(t_c) and row["bottleneck"] in ("compute", "link")
    assert {p.suffix for p in written.values()} == {".csv", ".md", ".png"}
    assert written["png"].read_bytes()[:4] == b"\x89PNG"
    csv = written["csv"].read_text().splitlines()
    assert csv[0].split(",") == list(whatif.ROW_KEYS) and len(csv) == len(rows) + 1
    assert "| no-overlap" in written["md"].read_text()


def test_whatif_selects_stored_schemes_by_cli_name(tmp_path):
    out = whatif_campaign(tmp_path)
    rows, _ = predict.run(predict.build_parser().parse_args(
        ["--from", str(out), "--model", MODEL, "--frameworks", "torch,wfbp", "--nodes", "2", "--no-files"]))
    assert [r["scheme"] for r in rows] == ["torch:ddp", "wfbp"]
    # the catalogue runs on the first profile (PyTorch DDP's), on its calibrated link: 1 / beta = 4 Gbit/s
    assert [r["profile"] for r in rows] == ["PyTorch DDP b16"] * 2
    assert [r["bandwidth"] for r in rows] == ["4Gbit"] * 2 and rows[0]["latency"] == "50us"


def test_whatif_cli_prints_the_table(tmp_path):
    out = whatif_campaign(tmp_path)
    result = run_cli("analysis.predict", "--from", str(out), "--model", MODEL, *GRID, "--frameworks", "stored",
                     timeout=120)
    assert result.returncode == 0, result.stderr
    assert "efficiency" in result.stdout and "caffe-mpi-style" in result.stdout and "bottleneck" in result.stdout
    assert len([line for line in result.stdout.splitlines() if "Gbit" in line]) == 2 * 24


@pytest.mark.parametrize("args,needle", [
    (["--bandwidth", "10G"], "cannot read bandwidth"),
    (["--bandwidth", "fast"], "cannot read bandwidth"),
    (["--latency", "5"], "cannot read latency"),
    (["--nodes", "0,2"], "--nodes"),
    (["--nodes", "2,,4"], "--nodes has an empty item"),
    (["--bandwidth", "10Gbit,"], "--bandwidth has an empty item"),
    (["--model", "resnet50"], "no successful one-worker run of resnet50"),
    (["--frameworks", "magic"], "unknown scheme"),
    (["--profile", "TensorFlow"], "--profile"),
])
def test_whatif_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    out = whatif_campaign(tmp_path)
    base = {"--from": str(out), "--model": MODEL}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = [item for pair in base.items() for item in pair]
    assert predict.main(argv + (["--no-files"])) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_whatif_without_store(tmp_path, capsys):
    assert predict.main(["--from", str(tmp_path / "none"), "--model", MODEL]) == 2
    assert "results.sqlite" in capsys.readouterr().err


@pytest.mark.parametrize("text,value", [("10Gbit", 1.25e9), ("10 Gbit/s", 1.25e9), ("10Gbps", 1.25e9),
                                        ("1.25GB/s", 1.25e9), ("100Mbit", 12.5e6), ("1Gibit", 2 ** 30 / 8),
                                        ("400MB", 400e6), ("56Gb/s", 7e9)])
def test_parse_bandwidth(text, value):
    assert units.parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text,value", [("5us", 5e-6), ("5 µs", 5e-6), ("0.05ms", 5e-5), ("100ns", 1e-7),
                                        ("1e-6s", 1e-6), ("0us", 0.0)])
def test_parse_latency(text, value):
    assert units.parse_latency(text) == pytest.approx(value)


# --------------------------------------------------------------------------- the real thing

def calibration_line(name: str) -> str:
    """How compare announces a calibration: 'calibrating FRAMEWORK:MODE on ...'."""
    return f"calibrating {name}{' ' if ':' in name else ':'}"


LIMIT = 0.30
OVERLOADED = 2.0  # 5-min load average per CPU above which other work competes with the ranks
# the benchmark's campaign less googlenet-tiny, for CI's time: alexnet-tiny (a few large
# tensors) and resnet50-tiny (161 small ones) are the two ends per-tensor schemes are priced at
CI_MODELS = "alexnet-tiny,resnet50-tiny"


def loopback_campaign(schemes: list[str], out: Path):
    """`compare --calibrate` of `schemes` over `CI_MODELS` on 2 loopback ranks, as the
    benchmark runs it."""
    return run_cli("launchers.compare", *campaign_arguments(schemes, CI_MODELS), "--out", str(out), timeout=3600)


@pytest.mark.slow
def test_model_predicts_loopback_campaigns_within_30_percent(tmp_path_factory):
    """Calibrate every synchronous scheme on 2 loopback ranks (torch with the calibrate CLI,
    the others by compare --calibrate, which skips what is stored and calibrates what it
    calibrated again after the runs, pooled), run 2-rank campaigns over two tiny models, and
    compare each run's predicted iteration time with the measured one.

    The 15 % target is `bench.loopback_prediction`'s: on a shared 2-core machine a scheme's
    median moves by 10 points from one campaign to the next (horovod:mpi, mxnet:dist_sync and
    tf:ps read 16-19 % in one run of .ci/run on the 2-core VM, within 15 % in the runs before),
    so CI holds each median to 30 %, enough to fail a model that leaves out the exchange of a
    scheme whose iteration it dominates (TF ps, MXNet: half the iteration).

    Each run takes its profile iterations in rounds between its timed loops and the model
    compares like with like (adapters/worker.py `slowest_rank_compute`); with the profile
    taken after all timed loops instead, the median errors on a quiet machine were 9-23%."""
    out = tmp_path_factory.mktemp("model") / "loopback"
    schemes = schemes_to_hold()
    load_before = os.getloadavg()[1]
    calibrated = run_cli("launchers.calibrate", "--frameworks", schemes[0], "--workers", "2",
                         "--out", str(out), "--repeats", "8", timeout=1800)
    assert calibrated.returncode == 0, calibrated.stderr[-3000:]
    assert "algbw(GB/s)" in calibrated.stdout and "busbw(GB/s)" in calibrated.stdout
    result = loopback_campaign(schemes, out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calibration_line(schemes[0]) not in result.stderr  # stored: not redone
    assert all(calibration_line(name) in result.stderr for name in schemes[1:]), result.stderr[-3000:]
    with ResultStore.for_campaign(out, create=False) as store:
        frame = store.runs_frame()
        calibrations = store.calibration_frame()
    # what compare calibrated it calibrated again after the runs (pooled: two windows), not torch
    windows = {f"{c.framework}:{c.mode}": len(c.windows) for c in calibrations.itertuples()}
    assert windows.pop(f"{schemes[0]}:ddp") == 1 and set(windows.values()) == {2}, windows
    assert len(windows) == len(schemes) - 1, windows
    print("\n" + rendering.to_markdown(tables.calibration_table(calibrations)))
    table = tables.prediction_table(frame)
    shown = table[["framework_label", "model", "world_size", "measured_ms", "predicted_ms", "error_pct",
                   "comm_measured_ms", "comm_predicted_ms", "comm_exposed_pred_ms", "basis", "layer_source"]]
    print("\n" + rendering.to_markdown(shown))
    summary = tables.prediction_summary(frame)
    print(rendering.to_markdown(summary))
    assert set(table["basis"]) == {"calibrated"}, table[["framework_label", "mode", "basis"]]
    assert len(summary) == len(schemes)
    medians = scheme_medians(table)
    failing = [scheme for scheme, error in medians.items() if error > LIMIT]
    if failing:
        # A shared 2-core machine moves a whole campaign now and then: the schemes that missed
        # get one more calibration and campaign of their own, and must meet it there.
        print(f"re-measuring {', '.join(failing)}: " + "; ".join(f"{s} {medians[s]:.1%}" for s in failing))
        again = tmp_path_factory.mktemp("model") / "again"
        rerun = loopback_campaign(failing, again)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        retable = prediction_table(again)
        show(retable)
        medians.update(scheme_medians(retable))
    failures = [f"{scheme}: median |error| {error:.1%}" for scheme, error in medians.items() if error > LIMIT]
    load = max(load_before, os.getloadavg()[1])
    if failures and load > OVERLOADED * (os.cpu_count() or 1):
        # The calibrated contention covers the ranks' own communication competing with their
        # compute; with other work keeping every core busy as well, each collective waits for
        # the OS to run both ranks at once (ms per message instead of us) and the claim
        # cannot be tested here.
        pytest.xfail(f"machine overloaded (5-min load average {load:.1f} on {os.cpu_count()} CPUs): "
                     + "; ".join(f"{scheme} {error:.1%}" for scheme, error in medians.items()))
    assert not failures, "; ".join(failures) + f" (5-min load average {load:.1f} on {os.cpu_count()} CPUs)"
