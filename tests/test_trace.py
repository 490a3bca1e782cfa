"""Each run's trace (analysis/trace.py): every rank a process, the model's schedule beside them,
slices that nest, ranks on one clock, the scheme's messages with their bytes, found by
`dlcompare trace` and linked from the report.

The unit tests build traces from rank parts written the way the worker writes them; the slow
test runs a real 2-rank campaign of the two schemes whose messages Python sends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import trace
from tests.conftest import run_cli

FAST = ["--iterations", "2", "--repeats", "2", "--warmup", "1", "--profile-iterations", "3",
        "--batch-size", "4"]


def rank_part(rank: int, clock: float, start: float, comm: float = 0.004,
              messages: list[list] | None = None) -> dict:
    """A rank's part as `ProfileRounds.trace` writes it: one iteration of each kind."""
    separated = {"io": 0.001, "h2d": 0.0005, "forward": 0.01, "backward": 0.02, "comm": comm, "update": 0.002}
    overlapped = {"io": 0.001, "h2d": 0.0005, "forward": 0.01, "backward_comm": 0.022, "update": 0.002}
    return {"rank": rank, "host": f"node{rank}", "clock_s": clock,
            "layer_ready": [["fc", 0.005], ["conv2", 0.012], ["conv1", 0.018]],
            "iterations": [{"kind": "separated", "start_s": start, "laps": separated, "messages": messages},
                           {"kind": "overlapped", "start_s": start + 0.05, "laps": overlapped, "messages": None}]}


def slices(built: dict, pid: int | None = None, cat: str | None = None) -> list[dict]:
    return [e for e in built["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)
            and (cat is None or e["cat"] == cat)]


def named(built: dict, pid: int, name: str) -> dict:
    return next(e for e in slices(built, pid) if e["name"] == name)


def process_names(built: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in built["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def test_ranks_on_hosts_whose_clocks_differ_line_up_at_their_barrier():
    """Rank 1's host's clock runs 3 s ahead; both left the barrier together and ended the same
    all-reduce together: in the trace their comm phases end at the same microsecond.  Ranks on
    one host keep their readings (one clock), whatever the barrier's skew."""
    offset = 3.0
    built = trace.measured({"run_id": "r"}, [rank_part(1, 100.0 + offset, 100.2 + offset, comm=0.004),
                                             rank_part(0, 100.0, 100.2, comm=0.004)])
    assert trace.problems(built) == []
    assert process_names(built) == {1: "rank 0 · node0", 2: "rank 1 · node1"}
    ends = [named(built, pid, "comm")["ts"] + named(built, pid, "comm")["dur"] for pid in (1, 2)]
    assert ends[0] == pytest.approx(ends[1], abs=0.01)
    unsynced = trace.measured({"run_id": "r"}, [rank_part(0, None, 100.2), rank_part(1, None, 100.2 + offset)])
    assert unsynced["otherData"]["clock"] == "wall clock"
    assert named(unsynced, 2, "comm")["ts"] - named(unsynced, 1, "comm")["ts"] == pytest.approx(offset * 1e6)
    one_host = [dict(rank_part(r, 100.0 + 0.004 * r, 100.2), host="h") for r in (0, 1)]  # 4 ms barrier skew
    shared = trace.measured({"run_id": "r"}, one_host)
    assert named(shared, 1, "comm")["ts"] == named(shared, 2, "comm")["ts"]


def test_every_rank_shows_the_same_iteration_the_median_by_its_slowest_rank():
    """Three separated iterations: rank 0 takes 10, 30, 20 ms, rank 1 takes 50, 10, 10 ms; by
    the slowest rank they took 50, 30, 20, so the median is the second on both ranks, which
    neither rank's own median (its third, its second or third) would agree on."""
    def part(rank, times):
        return {"rank": rank, "host": "h", "clock_s": 0.0, "iterations": [
            {"kind": "separated", "start_s": 1.0 + j, "laps": {"forward": t}, "messages": None}
            for j, t in enumerate(times)]}

    ranks = [part(0, [0.010, 0.030, 0.020]), part(1, [0.050, 0.010, 0.010])]
    assert trace.chosen_iterations(ranks) == {"separated": 1}
    built = trace.measured({"run_id": "r"}, ranks)
    assert [e["ts"] for e in slices(built, cat="iteration")] == [0.0, 0.0]  # 2.0 s on both, the origin
    assert built["otherData"]["profile_iterations"] == {"separated": 2}


def test_layers_nest_in_backward_and_phases_in_their_iteration():
    built = trace.measured({"run_id": "r"}, [rank_part(0, 1.0, 1.0)])
    backward = named(built, 1, "backward")
    layers = slices(built, 1, "layer")
    assert [e["name"] for e in layers] == ["fc", "conv2", "conv1"]
    assert layers[0]["ts"] == backward["ts"]
    assert layers[-1]["ts"] + layers[-1]["dur"] == pytest.approx(backward["ts"] + backward["dur"], abs=1e-3)
    iterations = slices(built, 1, "iteration")
    assert [e["args"]["kind"] for e in iterations] == ["separated", "overlapped"]
    assert sum(e["dur"] for e in slices(built, 1, "phase")) == pytest.approx(sum(e["dur"] for e in iterations), abs=0.01)


def test_overlapping_messages_go_to_threads_of_their_own():
    messages = [["a", 1.030, 1.034, 100], ["b", 1.031, 1.033, 200], ["c", 1.035, 1.036, 300]]
    built = trace.measured({"run_id": "r"}, [rank_part(0, 1.0, 1.0, messages=messages)])
    assert trace.problems(built) == []
    sent = {e["name"]: (e["tid"], e["args"]["bytes"]) for e in slices(built, 1, "message")}
    assert sent == {"a": (2, 100), "b": (3, 200), "c": (2, 300)}


def test_problems_finds_what_a_viewer_would_misdraw():
    built = trace.measured({"run_id": "r"}, [rank_part(0, 1.0, 1.0)])
    assert trace.problems(built) == []
    crossing = json.loads(json.dumps(built))
    forward = next(e for e in crossing["traceEvents"] if e.get("name") == "forward")
    forward["dur"] *= 1.5  # now overlaps backward without holding it
    assert any("without nesting" in p for p in trace.problems(crossing))
    negative = json.loads(json.dumps(built))
    next(e for e in negative["traceEvents"] if e.get("name") == "io")["dur"] = -1
    assert any("dur -1" in p for p in trace.problems(negative))
    unnamed = {"traceEvents": [e for e in built["traceEvents"] if e["name"] != "process_name"]}
    assert any("no process_name" in p for p in trace.problems(unnamed))


def test_the_model_process_is_replaced_not_added():
    built = trace.measured({"run_id": "r"}, [rank_part(0, 1.0, 1.0)])
    prediction = {"phases": {"io": 0.001, "h2d": 0.0005, "forward": 0.01, "update": 0.002},
                  "layer_source": "hooks",
                  "timeline": {"backward_start": 0.0115, "backward_end": 0.0315, "iteration_end": 0.0375,
                               "layers": [["fc", 0.0115, 0.0165], ["conv1", 0.0165, 0.0315]],
                               "transfers": [[0.0165, 0.02, 4000, "fc"], [0.0315, 0.0355, 9000, "conv1"]]}}
    once = trace.with_model(built, prediction)
    twice = trace.with_model(once, prediction)
    assert trace.problems(twice) == []
    assert list(process_names(twice).values()) == ["rank 0 · node0", trace.MODEL_PROCESS]
    model = next(pid for pid, name in process_names(twice).items() if name == trace.MODEL_PROCESS)
    assert slices(twice, model) == slices(once, model)
    assert named(twice, model, "iteration (predicted)")["ts"] == named(twice, 1, trace.KIND_TITLES["overlapped"])["ts"]
    assert sum(e["args"]["bytes"] for e in slices(twice, model, "message")) == 13000
    assert named(twice, model, "exposed communication")["dur"] == pytest.approx(4000, abs=0.01)
    assert process_names(trace.with_model(twice, None)) == {1: "rank 0 · node0"}


def messages_in(built: dict, pid: int, kind: str) -> list[dict]:
    """The messages a rank sent during its iteration of `kind` (the two kinds' median
    iterations may come from different rounds, in either order)."""
    iteration = named(built, pid, trace.KIND_TITLES[kind])
    return [e for e in slices(built, pid, "message")
            if iteration["ts"] <= e["ts"] <= iteration["ts"] + iteration["dur"]]


def assert_traced(out: Path, record: dict) -> dict:
    """A successful run's trace: it nests, and every rank is a process whose iterations hold
    a forward that took time."""
    built = trace.read(out / "runs" / record["run_id"] / trace.TRACE_FILE)
    assert trace.problems(built) == [], (record["run_id"], trace.problems(built)[:3])
    ranks = [pid for pid, name in process_names(built).items() if name.startswith("rank ")]
    assert len(ranks) == record["world_size"], (record["run_id"], process_names(built))
    for pid in ranks:
        assert all(e["dur"] > 0 for e in slices(built, pid) if e["name"] == "forward"), record["run_id"]
        assert {e["args"]["kind"] for e in slices(built, pid, "iteration")} == {"separated", "overlapped"}
    return built


def gradient_bytes(record: dict) -> int:
    return int(record["params"]) * 4  # float32


@pytest.mark.slow
def test_a_two_rank_campaign_traces_every_rank_its_messages_and_the_model(tmp_path):
    """PyTorch DDP over gloo (its buckets, through DDP's comm hook), Caffe-MPI-style (one
    all-reduce per tensor from its thread) and CNTK-style (one flat all-reduce after backward),
    2 ranks: each run's trace has both ranks and the model, nests, sends the whole gradient once
    per iteration kind, and the two ranks end the separated iteration's last all-reduce
    together; `dlcompare trace` finds it, the report links it."""
    out = tmp_path / "traced"
    result = run_cli("launchers.compare", "--frameworks", "torch,caffe-mpi-style,cntk-style", "--model",
                     "googlenet-tiny", "--workers", "2", "--out", str(out), *FAST, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    from analysis.store import ResultStore

    records = ResultStore.for_campaign(out, create=False).records()
    assert len(records) == 3 and all(r["status"] == "ok" for r in records)
    for record in records:
        path = out / "runs" / record["run_id"] / trace.TRACE_FILE
        built = trace.read(path)
        assert trace.problems(built) == [], trace.problems(built)[:3]
        assert list(process_names(built).values()) == ["rank 0 · " + process_names(built)[1].split(" · ")[1],
                                                        "rank 1 · " + process_names(built)[2].split(" · ")[1],
                                                        trace.MODEL_PROCESS]
        assert built["otherData"]["clock"] == "barrier"
        for pid in (1, 2):
            assert len(slices(built, pid, "layer")) == len(record["extra"]["layer_backward_s"])  # in backward
            for kind in ("separated", "overlapped"):
                sent = sum(e["args"]["bytes"] for e in messages_in(built, pid, kind))
                assert sent == gradient_bytes(record), (record["run_id"], kind)
        last_sends = [max(e["ts"] + e["dur"] for e in messages_in(built, pid, "separated")) for pid in (1, 2)]
        assert abs(last_sends[0] - last_sends[1]) < 10000, last_sends  # µs: the same all-reduce ends
        model = slices(built, 3)
        assert named(built, 3, "iteration (predicted)")["dur"] == pytest.approx(
            record["predicted_iter_time"] * 1e6, rel=0.01)
        assert sum(e["args"]["bytes"] for e in model if e["cat"] == "message") == pytest.approx(
            gradient_bytes(record), rel=0.01)

    run_id = next(r["run_id"] for r in records if r["framework"] == "caffe-mpi-style")
    found = run_cli("launchers.cli", "trace", str(out), run_id[:-3], "--open", "--check")
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == [str(out / "runs" / run_id / trace.TRACE_FILE), trace.VIEWER_HINT]
    report = (out / "report.html").read_text()
    assert f'href="runs/{run_id}/{trace.TRACE_FILE}"' in report
    for argv, message in ((["googlenet"], "matches 3 runs"), (["nothing-like-this"], "no run with a trace matches"),
                          ([], None)):
        listed = run_cli("launchers.cli", "trace", str(out), *argv)
        if message is None:
            assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 3
        else:
            assert listed.returncode == 2 and message in listed.stderr and len(listed.stderr.splitlines()) == 1
    assert run_cli("launchers.cli", "trace", str(tmp_path / "absent")).returncode == 2
