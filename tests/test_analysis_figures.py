"""Figures keep topologies apart and give each scheme one colour everywhere (analysis/figures.py,
analysis/palette.py), checked through the series each figure lists beside its PNG."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import figures, palette
from core import schemes as catalogue
from analysis.store import ResultStore
from tests.test_analysis_data import make_campaign, make_record

ROOT = Path(__file__).resolve().parent.parent


def topology_records(schemes=(("PyTorch DDP", "torch", "ddp"), ("CNTK-style", "cntk-style", "allreduce"))):
    """Two schemes at 1×1, 1×2 and 2×1; 2×1 twice as slow as 1×2 (a slower link)."""
    records = []
    for k, (label, framework, mode) in enumerate(schemes):
        base = 0.1 + 0.01 * k
        for nodes, per_node, t in ((1, 1, base), (1, 2, base * 1.25), (2, 1, base * 2.5)):
            records.append(make_record(label, framework, mode, nodes * per_node, t, nodes=nodes,
                                       workers_per_node=per_node, run_id=f"{framework}-{mode}-{nodes}x{per_node}"))
    return records


def drawn(out: Path, name: str) -> dict[str, dict]:
    """The figure's series by name, from its sidecar."""
    return {s["name"]: s for s in json.loads((out / "figures" / f"{name}.json").read_text())["series"]}


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    with ResultStore.for_campaign(make_campaign(tmp_path_factory.mktemp("c"), topology_records())) as store:
        return store.runs_frame()


def test_scaling_draws_one_node_and_two_nodes_as_separate_series(frame, tmp_path):
    figures.scaling_curves(frame, tmp_path)
    series = drawn(tmp_path, "scaling")
    one_node, two_nodes = series["PyTorch DDP · 1 node"], series["PyTorch DDP · 2 nodes"]
    assert one_node["points"] == [[1, pytest.approx(1.0)], [2, pytest.approx(2 / 1.25)]]
    assert two_nodes["points"] == [[2, pytest.approx(2 / 2.5)]]  # not merged with 1x2 at the same N
    assert one_node["colour"] == two_nodes["colour"] == palette.scheme_colour("torch", "ddp").lower()


def test_throughput_bars_never_average_topologies(frame, tmp_path):
    figures.throughput_bars(frame, tmp_path)
    series = drawn(tmp_path, "throughput")
    assert series["PyTorch DDP · 1×2"]["points"] == [["1×2", pytest.approx(32 / 0.125)]]
    assert series["PyTorch DDP · 2×1"]["points"] == [["2×1", pytest.approx(32 / 0.25)]]
    assert len(series) == 6  # 2 schemes x 3 topologies, one bar each


def test_a_scheme_keeps_its_colour_whatever_else_is_in_the_campaign(tmp_path):
    other = topology_records((("MXNet", "mxnet", "dist_sync"), ("Horovod", "horovod", "gloo"),
                              ("PyTorch DDP", "torch", "ddp")))
    colours = []
    for name, records in (("a", topology_records()), ("b", other)):
        with ResultStore.for_campaign(make_campaign(tmp_path / name, records)) as store:
            frame = store.runs_frame()
        for draw in (figures.scaling_curves, figures.iteration_spread, figures.throughput_bars):
            draw(frame, tmp_path / name)
        colours.append({s["name"]: s["colour"] for fig in ("scaling", "iteration_spread", "throughput")
                        for s in drawn(tmp_path / name, fig).values() if s["name"].startswith("PyTorch DDP")})
    assert len(set(colours[0].values()) | set(colours[1].values())) == 1


def test_phase_figure_lists_the_throughput_mode_iteration(frame, tmp_path):
    figures.phase_bars(frame, tmp_path)
    series = drawn(tmp_path, "phases")
    points = dict(map(tuple, series["PyTorch DDP · 2×1"]["points"]))
    assert points["iteration"] == pytest.approx(250.0) and points["backward"] > 0


def test_layer_figure_draws_each_schemes_smallest_and_largest_topology(frame, tmp_path):
    figures.layer_lines(frame, tmp_path)
    series = drawn(tmp_path, "layers")
    assert {"PyTorch DDP · 1×1", "PyTorch DDP · 2×1", "CNTK-style · 1×1"} <= set(series)
    assert [p[0] for p in series["PyTorch DDP · 1×1"]["points"]][:2] == ["fc8", "fc7"]  # backward order


def test_nine_schemes_fit_one_readable_figure(tmp_path):
    schemes = [("PyTorch DDP", "torch", "ddp"), ("TensorFlow", "tf", "collective"), ("TensorFlow", "tf", "ps"),
               ("MXNet", "mxnet", "dist_sync"), ("MXNet", "mxnet", "dist_device_sync"), ("CNTK", "cntk", "mpi"),
               ("CNTK-style", "cntk-style", "allreduce"), ("Caffe-MPI-style", "caffe-mpi-style", "mpi"),
               ("Horovod", "horovod", "gloo")]
    with ResultStore.for_campaign(make_campaign(tmp_path / "c", topology_records(schemes))) as store:
        frame = store.runs_frame()
    for name, draw in figures.FIGURES.items():
        draw(frame, tmp_path)
    colours = {s["name"].split(" · ")[0]: s["colour"] for s in drawn(tmp_path, "throughput").values()}
    assert len(colours) == 9 and len(set(colours.values())) == 9


def test_palette_is_fixed_for_catalogue_names_and_stable_for_others():
    assert palette.scheme_colour("torch", "ddp") == palette.scheme_colour("torch") == palette.SCHEME_COLOURS["torch:ddp"]
    assert palette.scheme_colour("tf", "ps") == catalogue.SCHEMES["tf:ps"].colour
    assert len(set(palette.SCHEME_COLOURS.values())) == len(palette.SCHEME_COLOURS)
    unknown = palette.scheme_colour("newfw", "ring")
    assert re.fullmatch(r"#[0-9A-F]{6}", unknown) and unknown not in palette.SCHEME_COLOURS.values()
    # the fallback does not depend on the process (no salted hash)
    code = "from analysis.palette import scheme_colour; print(scheme_colour('newfw', 'ring'))"
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == unknown
