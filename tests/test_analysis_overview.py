"""The overview of a sweep: the verdict matrix fits one screen whatever the campaign's size, its
cells name the measured winner and the model's pick, and `--where` narrows a campaign (a bad
filter is one line and exit 2)."""

from __future__ import annotations

import html.parser
import io
import json
import re
import subprocess
import sys

import pandas as pd
import pytest
from rich.console import Console

from analysis import figures, overview, report, summary, verdict
from analysis.store import ResultStore
from tests.test_analysis_data import make_campaign, sweep_records, sweep_time

BATCHES = [2 ** k for k in range(1, 7)] + [96 + 8 * k for k in range(30)]  # 36 batch sizes


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return make_campaign(tmp_path_factory.mktemp("sweep"), sweep_records(BATCHES))


def runs_of(folder) -> pd.DataFrame:
    with ResultStore.for_campaign(folder, create=False) as store:
        return store.runs_frame()


def printed(folder, width=80, **options) -> tuple[str, int]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    lines = summary.print_summary(folder, console=console, **options)
    return console.file.getvalue(), lines


def test_the_matrix_names_each_topologys_winner_and_the_models_pick(sweep):
    grids, left_out = overview.verdict_matrix(verdict.verdict_table(runs_of(sweep)), max_rows=40, max_columns=4)
    assert left_out == 0 and len(grids) == 1
    grid = grids[0]
    # 36 batch sizes against 3 topologies: the longer axis runs down
    assert grid.row_axis == "batch/worker" and grid.column_axis == "nodes×workers"
    assert grid.columns == ["1×1", "1×2", "2×1"] and grid.rows[:3] == ["b2", "b4", "b8"]
    assert len(grid.rows) == len(BATCHES) and grid.rows_left_out == 0
    for row in grid.rows:
        batch = int(row[1:])
        for column in grid.columns:
            cell = grid.cells[(row, column)]
            expected = "PyTorch DDP" if batch < 100 else "MXNet (dist_sync)"
            assert cell.winner == expected, (row, column)
            assert cell.predicted == expected  # the fixture's predictions are 1.1 × measured
            assert cell.margin_pct > 0


def test_a_grid_over_budget_keeps_evenly_spaced_rows_with_the_ends_and_counts_the_rest(sweep):
    grids, _ = overview.verdict_matrix(verdict.verdict_table(runs_of(sweep)), max_rows=8, max_columns=2)
    grid = grids[0]
    assert len(grid.rows) == 8 and grid.rows[0] == "b2" and grid.rows[-1] == f"b{BATCHES[-1]}"
    assert grid.rows_left_out == len(BATCHES) - 8
    assert grid.columns == ["1×1", "2×1"] and grid.columns_left_out == 1
    assert overview.evenly(list(range(10)), 4) == [0, 3, 6, 9]


def test_the_summary_of_a_sweep_fits_one_screen_and_asks_for_the_rest(sweep):
    text, lines = printed(sweep)
    assert lines <= summary.SCREEN_LINES, text
    assert len(text.splitlines()) == lines
    assert "216 run(s): 216 ok" in text
    assert "columns: nodes×workers" in text and "batch/worker  1×1" in text
    assert "A PyTorch DDP" in text or "B PyTorch DDP" in text
    assert "12 more rows evenly left out" in text and "--all" in text
    assert "Iter ms" not in text  # the runs table is not on the one screen


def test_all_and_where_print_the_details(sweep):
    everything, lines = printed(sweep, show_all=True)
    assert lines > summary.SCREEN_LINES and "Iter ms" in everything and "Verdict" in everything
    narrowed, _ = printed(sweep, where="nodes=2,batch=64")
    assert "2 run(s): 2 ok" in narrowed and "where nodes=2,batch=64" in narrowed
    assert "MXNet (dist_sync)" in narrowed and "Iter ms" in narrowed


def test_a_filter_compares_links_and_numbers_by_value(sweep):
    runs = runs_of(sweep)
    assert len(overview.where(runs, "batch=64.0,workers=2")) == 2
    linked = runs.assign(bandwidth=["1Gbit" if i % 2 else "100Mbit" for i in range(len(runs))])
    assert len(overview.where(linked, "bandwidth=1000Mbit")) == len(runs) // 2
    assert len(overview.where(runs, "scheme=PyTorch DDP")) == len(runs) // 2


@pytest.mark.parametrize("text, words", [
    ("nodes=9", "no run has nodes=9 (nodes values: 1, 2)"),
    ("foo=1", "unknown dimension 'foo'"),
    ("batch", "wants dim=value"),
])
def test_a_bad_filter_is_one_line_and_exit_2(sweep, text, words):
    done = subprocess.run([sys.executable, "-m", "analysis.summary", str(sweep), "--where", text],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


# --------------------------------------------------------------------------- the report of a 1,000-run sweep

class _MatrixReader(html.parser.HTMLParser):
    """The report's verdict matrix as rows of cell texts (header cells included)."""

    def __init__(self):
        super().__init__()
        self.depth, self.rows, self.cell = 0, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "div" and ("id", "verdict-matrix") in attrs:
            self.depth = 1
        elif tag == "div" and self.depth:
            self.depth += 1
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "div" and self.depth:
            self.depth -= 1
        elif self.depth and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _winners(records: list[dict]) -> dict[tuple[str, str], str]:
    """(matrix row label, topology) -> the scheme with the highest throughput, from the records."""
    best = {}
    for r in records:
        links = f"{r['bandwidth'] or 'unshaped'} · {r['latency'] or '—'}"
        key = (f"b{r['batch_per_worker']} · {links}", f"{r['nodes']}×{r['workers_per_node']}")
        name = r["framework_label"] if r["mode"] == "ddp" else f"{r['framework_label']} ({r['mode']})"
        if key not in best or r["throughput"] > best[key][0]:
            best[key] = (r["throughput"], name)
    return {key: name for key, (_, name) in best.items()}


def _sidecar(folder, name: str) -> dict:
    return json.loads((folder / "figures" / f"{name}.json").read_text())


@pytest.mark.slow  # builds a 1,000-run report
def test_a_sweeps_figures_stay_within_bounds_and_say_what_they_left_out(wide_sweep):
    folder, _, records = wide_sweep
    pngs = sorted((folder / "figures").glob("*.png"))
    assert len(pngs) >= 10
    for png in pngs:
        assert max(report.png_size(png.read_bytes())) <= figures.MAX_PX, png.name
    # 48 batch sizes × 7 topologies would be 336 throughput panels: the budget keeps 12
    topologies = {(r["batch_per_worker"], r["nodes"], r["workers_per_node"], r["bandwidth"]) for r in records}
    throughput = _sidecar(folder, "throughput")
    assert throughput["left_out"].startswith(f"{figures.MAX_PANELS} of {len(topologies)} panels")
    names = {entry["name"].split(" · ")[0] for entry in throughput["series"]}
    assert names == {"PyTorch DDP", "MXNet (dist_sync)", "Horovod (gloo)"}


@pytest.mark.slow  # builds a 1,000-run report
def test_each_swept_dimension_is_an_axis_with_a_line_per_scheme(wide_sweep):
    folder, _, records = wide_sweep
    drawn = {p.stem for p in (folder / "figures").glob("sweep_*.png")}
    assert drawn == {"sweep_batch", "sweep_workers", "sweep_bandwidth"}  # one latency, two node counts
    schemes = {"PyTorch DDP", "MXNet (dist_sync)", "Horovod (gloo)"}
    for name in drawn:
        measured = [s for s in _sidecar(folder, name)["series"] if s["kind"] == "measured"]
        for (facet, metric), lines in pd.DataFrame(measured).groupby(["facet", "metric"]):
            assert set(lines["scheme"]) <= schemes and lines["scheme"].is_unique, (name, facet, metric)
            for points in lines["points"]:
                x = [p[0] for p in points]
                assert x == sorted(x) and len(x) >= 2, (name, facet, metric)
    # batch: 4 of the 7 topologies (where the schemes differ most), each along every batch size
    batch = _sidecar(folder, "sweep_batch")
    assert batch["left_out"].startswith("4 of 7 columns")
    ddp = {s["facet"]: s for s in batch["series"] if s["scheme"] == "PyTorch DDP" and s["metric"] == "images_per_s"
           and s["kind"] == "measured"}
    facet = next(f for f in ddp if "2 nodes, 1 worker/node, 1Gbit" in f)
    run = next(r for r in records if r["run_id"] == "torch-ddp-n2x1-b10-1Gbit")
    assert dict(map(tuple, ddp[facet]["points"]))[10] == pytest.approx(run["throughput"])
    assert len(ddp[facet]["points"]) == len({r["batch_per_worker"] for r in records
                                              if r["nodes"] == 2 and r["workers_per_node"] == 1})
    # bandwidth: every scheme is more efficient on the faster link; the model's line beside it
    efficiency = [s for s in _sidecar(folder, "sweep_bandwidth")["series"] if s["metric"] == "efficiency"]
    for line in efficiency:
        assert [p[0] for p in line["points"]] == [1.0, 10.0]
        assert line["points"][0][1] < line["points"][1][1], line["name"]
    assert {s["kind"] for s in efficiency} == {"measured", "predicted"}


@pytest.mark.slow  # builds a 1,000-run report
def test_the_report_opens_with_the_verdict_matrix(wide_sweep):
    folder, page, records = wide_sweep
    reader = _MatrixReader()
    reader.feed(page.read_text(encoding="utf-8"))
    header, *rows = reader.rows
    assert header[1:] == ["1×1", "1×2", "1×4", "2×1", "2×2"]
    assert len(rows) == report.MATRIX_BUDGET["max_rows"]
    winners = _winners(records)
    checked = 0
    for label, *cells in rows:
        for topology, text in zip(header[1:], cells):
            if (label, topology) in winners:
                assert text.startswith(winners[label, topology]), (label, topology, text)
                checked += 1
            else:
                assert text == "—", (label, topology, text)
    assert checked > 100
    # clear wins are marked in the cell's class and counted in the wins line
    text = page.read_text(encoding="utf-8")
    cells = re.findall(r'<td class="(cell(?: clear)?)">(.*?)</td>', text)
    assert cells and all((kind == "cell clear") == ("✓" in body) for kind, body in cells)
    wins = re.sub(r"<[^>]+>", "", re.search(r'<p class="wins">(.*?)</p>', text).group(1))
    counted = re.findall(r"(\d+) \((\d+) clear", wins)
    assert len(counted) == 3 and all(int(clear) <= int(won) for won, clear in counted), wins


@pytest.mark.slow  # builds a 1,000-run report
def test_the_report_spells_out_a_bounded_number_of_topologies(wide_sweep):
    _, page, records = wide_sweep
    text = page.read_text(encoding="utf-8")
    verdict_section = text[text.index('id="verdict"'):text.index('id="sweeps"')]
    assert verdict_section.count('<p class="headline">') == report.SPELLED_OUT_TOPOLOGIES
    topologies = len(_winners(records))
    assert f"{topologies - report.SPELLED_OUT_TOPOLOGIES} more are in tables/verdict.csv" in verdict_section


@pytest.mark.slow  # builds a 1,000-run report
def test_a_sweeps_page_and_folder_stay_small_and_link_the_figures(wide_sweep):
    folder, page, _ = wide_sweep
    drawn = sum(png.stat().st_size for png in (folder / "figures").glob("*.png"))
    assert drawn > report.EMBED_LIMIT_BYTES  # the fixture is large enough to test the limit
    sources = re.findall(r'<img src="([^"]+)"', page.read_text(encoding="utf-8"))
    assert sources and all((folder / src).is_file() for src in sources), sources
    assert page.stat().st_size < 5_000_000
    kept = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("results.sqlite")]
    assert sum(p.stat().st_size for p in kept) < 10_000_000


@pytest.mark.slow  # builds a 1,000-run store
def test_the_summary_of_1000_runs_fits_one_screen(wide_sweep):
    text, lines = printed(wide_sweep[0])
    assert lines <= summary.SCREEN_LINES, text
    assert "1,000 run(s): 1,000 ok" in text


def test_a_sweep_with_one_scheme_and_a_missing_measurement_still_draws_its_axis(tmp_path):
    records = [r for r in sweep_records([2, 4, 8, 16]) if r["framework"] == "torch"]
    broken = next(r for r in records if r["run_id"] == "torch-ddp-n1x2-b8")
    broken.update(iter_time_median=None, iter_time_p10=None, iter_time_p90=None, throughput=None)
    folder = make_campaign(tmp_path / "one-scheme", records)
    page = report.build_report(folder).read_text(encoding="utf-8")
    assert "No numeric dimension was swept" not in page
    lines = [s for s in _sidecar(folder, "sweep_batch")["series"]
             if s["metric"] == "images_per_s" and s["kind"] == "measured"]
    assert {s["scheme"] for s in lines} == {"PyTorch DDP"}
    two_workers = next(s for s in lines if "1 node, 2 workers/node" in s["facet"])
    measured = {x: y for x, y in two_workers["points"]}
    assert list(measured) == [2.0, 4.0, 8.0, 16.0] and measured[8.0] is None  # a gap in the line
    assert measured[4.0] == pytest.approx(4 * 2 / sweep_time("torch", 4, 2))
    # one batch size: nothing swept, and the page says so
    single = make_campaign(tmp_path / "single", [r for r in records if r["batch_per_worker"] == 4])
    assert "No numeric dimension was swept" in report.build_report(single).read_text(encoding="utf-8")
    assert not list((single / "figures").glob("sweep_*.png"))
