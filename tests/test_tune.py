"""`dlcompare tune`: bad input in one line; and on a space small enough to run in full here,
it measures only the predicted top-k and each scheme's best, says how many points it did not
run, and its answer is checked against the whole grid measured afterwards."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import run_cli

FAST = ["--iterations", "4", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1"]


@pytest.mark.parametrize("arguments, words", [(["--top", "0"], "--top must be at least 1"),
                                              (["--model", "vgg99"], "unknown model"),
                                              (["--frameworks", "caffe3"], "caffe3")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, arguments, words):
    done = run_cli("launchers.cli", "tune", *arguments, "--out", str(tmp_path / "t"))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert not (tmp_path / "t" / "results.sqlite").exists()


@pytest.mark.slow  # a real space: 4 one-worker profiles, a calibration, the chosen points, then the rest
def test_tune_measures_what_can_win_and_its_answer_holds_against_the_full_grid(tmp_path, torch_python):
    out = tmp_path / "tune"
    space = ["--frameworks", "torch,caffe-mpi-style", "--model", "alexnet-tiny", "--workers", "1,2",
             "--batch-size", "8,16"]
    done = run_cli("launchers.cli", "tune", *space, "--top", "1", "--out", str(out), *FAST, "--launches", "2",
                   timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    table = pd.read_csv(out / "tables" / "tune.csv")
    assert len(table) == 8 and sorted(table["predicted_rank"]) == list(range(1, 9))
    chosen = table[table["chosen"]]
    # the top-1 and each scheme's best, and every one-worker profile: measured; the rest: not
    assert (chosen["measured"]).all() and table.loc[table["world_size"] == 1, "measured"].all()
    assert 1 <= len(chosen) <= 3 and not table[~table["chosen"] & (table["world_size"] > 1)]["measured"].any()
    skipped = int((~table["measured"]).sum())
    assert skipped >= 1 and f"{8 - skipped} of 8 points measured ({skipped} not run)" in done.stdout
    assert (out / "figures" / "tune.png").stat().st_size > 5_000 and table["pareto"].any()
    # the whole grid, measured afterwards in the same folder: tune's winner is the best of it or
    # within the between-launch noise of it
    full = run_cli("launchers.compare", *space, "--out", str(out), *FAST, "--launches", "2", timeout=1500)
    assert full.returncode == 0, full.stderr[-3000:]
    from analysis import noise, verdict
    from analysis.store import ResultStore

    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        frame = store.campaign_frame()
    rows = verdict.verdict_table(frame).sort_values("images_per_s", ascending=False)
    best = rows.iloc[0]
    tuned = table[table["measured"]].sort_values("images_per_s", ascending=False).iloc[0]
    if (best["scheme"], best["batch_per_worker"], best["workers_per_node"]) != (
            tuned["scheme"], tuned["batch_per_worker"], tuned["workers_per_node"]):
        found = rows[(rows["scheme"] == tuned["scheme"]) & (rows["batch_per_worker"] == tuned["batch_per_worker"])
                     & (rows["workers_per_node"] == tuned["workers_per_node"])].iloc[0]
        images = (best["batch_per_worker"] * best["world_size"]) / (found["batch_per_worker"] * found["world_size"])
        test = noise.compare(noise.config_key(best), noise.config_key(found), noise.campaign_noise(frame),
                             images_ratio=images)
        assert test.beyond is not True, (best["scheme"], tuned["scheme"], test)
