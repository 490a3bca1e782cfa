"""The overview of a sweep: the verdict matrix fits one screen whatever the campaign's size, its
cells name the measured winner and the model's pick, and `--where` narrows a campaign (a bad
filter is one line and exit 2)."""

from __future__ import annotations

import html.parser
import io
import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from rich.console import Console

from analysis import figures, overview, report, summary, verdict
from analysis.store import ResultStore
from tests.test_analysis_data import make_campaign, sweep_records

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


# --------------------------------------------------------------------------- the report of a sweep

@pytest.fixture(scope="module")
def sweep_report(sweep, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep_report")
    shutil.copy(sweep / "results.sqlite", folder / "results.sqlite")
    return folder, report.build_report(folder)


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


@pytest.mark.slow  # builds a 216-run report
def test_a_sweeps_figures_stay_within_bounds_and_say_what_they_left_out(sweep_report):
    folder, _ = sweep_report
    pngs = sorted((folder / "figures").glob("*.png"))
    assert pngs
    for png in pngs:
        assert max(report.png_size(png.read_bytes())) <= figures.MAX_PX, png.name
    # 36 batch sizes × 3 topologies would be 108 throughput panels: the budget keeps 12, both schemes in each
    throughput = json.loads((folder / "figures" / "throughput.json").read_text())
    assert throughput["left_out"].startswith(f"{figures.MAX_PANELS} of {3 * len(BATCHES)} panels")
    assert len(throughput["series"]) == 2 * figures.MAX_PANELS
    names = {entry["name"].split(" · ")[0] for entry in throughput["series"]}
    assert names == {"PyTorch DDP", "MXNet (dist_sync)"}


@pytest.mark.slow  # builds a 216-run report
def test_the_report_opens_with_the_verdict_matrix(sweep_report):
    reader = _MatrixReader()
    reader.feed(sweep_report[1].read_text(encoding="utf-8"))
    header, *rows = reader.rows
    assert header[1:] == ["1×1", "1×2", "2×1"] and len(rows) == len(BATCHES)
    for label, *cells in rows:
        expected = "PyTorch DDP" if int(label[1:]) < 100 else "MXNet (dist_sync)"
        assert all(cell.startswith(expected) and cell.endswith("◆") for cell in cells), (label, cells)


@pytest.mark.slow  # builds a 216-run report
def test_the_report_spells_out_a_bounded_number_of_topologies(sweep_report):
    text = sweep_report[1].read_text(encoding="utf-8")
    verdict_section = text[text.index('id="verdict"'):text.index('id="how-to-read"')]
    assert verdict_section.count('<p class="headline">') == report.SPELLED_OUT_TOPOLOGIES
    assert f"{3 * len(BATCHES) - report.SPELLED_OUT_TOPOLOGIES} more are in tables/verdict.csv" in verdict_section


@pytest.mark.slow  # builds a 216-run report
def test_a_sweeps_page_links_its_figures_as_files_once_they_outgrow_one_page(sweep_report):
    folder, page = sweep_report
    drawn = sum(png.stat().st_size for png in (folder / "figures").glob("*.png"))
    assert drawn > report.EMBED_LIMIT_BYTES  # the fixture is large enough to test the limit
    sources = re.findall(r'<img src="([^"]+)"', page.read_text(encoding="utf-8"))
    assert sources and all((folder / src).is_file() for src in sources), sources
    assert page.stat().st_size < drawn

