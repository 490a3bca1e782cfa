"""Figures, the HTML report and its CLI, and the terminal summary."""

from __future__ import annotations

import html.parser
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console

from analysis import figures, report, summary
from analysis.store import ResultStore
from tests.test_analysis_data import make_campaign, make_failed_record, make_record, make_records

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """A campaign folder with a built report (built once: drawing figures takes seconds)."""
    out = make_campaign(tmp_path_factory.mktemp("campaign"))
    return out, report.build_report(out)


@pytest.fixture(scope="module")
def frame(campaign):
    with ResultStore.for_campaign(campaign[0]) as store:
        return store.runs_frame()


def assert_png(path: Path) -> None:
    assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.width > 200 and image.height > 200
        assert round(image.info["dpi"][0]) == figures.DPI


def test_every_figure_is_a_valid_png(campaign):
    out, _ = campaign
    for name in set(figures.FIGURES) - figures.OPTIONAL_FIGURES:  # no emulated links here
        assert_png(out / "figures" / f"{name}.png")


@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_figures_return_none_when_nothing_to_plot(frame, tmp_path, name):
    draw = figures.FIGURES[name]
    assert draw(frame.iloc[0:0], tmp_path) is None
    assert draw(frame[frame["status"] != "ok"], tmp_path) is None
    assert not (tmp_path / "figures" / f"{name}.png").exists()


def test_single_row_frame_does_not_crash(frame, tmp_path):
    made = figures.make_figures(frame.iloc[[0]], tmp_path)
    assert "throughput" in made and "iteration_spread" in made
    for path in made.values():
        assert_png(path)


CTRL_C_AT_FORK = """
import os, signal, sys
from analysis import figures
from analysis.store import ResultStore
from tests.test_analysis_data import make_campaign

signal.signal(signal.SIGINT, signal.default_int_handler)
with ResultStore.for_campaign(make_campaign(sys.argv[1])) as store:
    frame = store.runs_frame()
sent = []
def ctrl_c_in_the_fork_hook():  # the moment the fork's own hooks run in the parent
    if not sent:
        sent.append(os.kill(os.getpid(), signal.SIGINT))
os.register_at_fork(after_in_parent=ctrl_c_in_the_fork_hook)
try:
    figures.make_figures(frame, sys.argv[1], workers=2)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(f"Ctrl-C lost: {len(sent)} sent, the figures were drawn")
"""


def test_ctrl_c_while_figure_workers_are_forked_is_not_lost(tmp_path):
    """A Ctrl-C that arrives while the pool forks would raise inside the fork's hooks, where
    Python drops it ("Exception ignored"): the figures hold it back until the workers are
    forked, then stop."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_AT_FORK, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_several_models_and_batches_get_panels(tmp_path):
    records = make_records() + [
        make_record("PyTorch DDP", "torch", "ddp", 1, 0.4, run_id="g1", model="googlenet"),
        make_record("PyTorch DDP", "torch", "ddp", 2, 0.5, run_id="g2", model="googlenet", nodes=2,
                    workers_per_node=1),
        make_record("PyTorch DDP", "torch", "ddp", 1, 0.2, run_id="b32", batch_per_worker=32, global_batch=32),
    ]
    with ResultStore.for_campaign(make_campaign(tmp_path / "c", records)) as store:
        frame = store.runs_frame()
    for draw in (figures.phase_bars, figures.scaling_curves):
        assert_png(draw(frame, tmp_path))


def test_series_names_are_the_catalogues_labels():
    assert figures.series_name("PyTorch DDP", "ddp") == "PyTorch DDP"
    assert figures.series_name("TensorFlow", "ps") == "TensorFlow (ps)"
    assert figures.series_name("CNTK-style", "allreduce") == "CNTK-style"
    assert figures.series_name("Caffe-MPI-style", "mpi") == "Caffe-MPI-style"
    assert figures.series_name("Newframe", "ring") == "Newframe (ring)"  # not in the catalogue
    assert figures.series_name(None, "ps") == "ps"


class _Checker(html.parser.HTMLParser):
    """Collects tags, img attributes and unbalanced elements of a page."""

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.images, self.urls = [], [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        for key in ("src", "href"):
            if key in attrs:
                self.urls.append(attrs[key])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()


def test_report_embeds_images_and_is_self_contained(campaign):
    out, path = campaign
    assert path == out / "report.html" and path.is_file()
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and '<html lang="en">' in text and '<meta charset="utf-8">' in text
    checker = _Checker()
    checker.feed(text)
    assert not checker.errors and not checker.stack
    assert len(checker.images) == len(set(figures.FIGURES) - figures.OPTIONAL_FIGURES)
    for image in checker.images:
        assert image["src"].startswith("data:image/png;base64,") and len(image["alt"]) > 20
    # nothing loaded from elsewhere: data URIs, in-page anchors and the campaign's own files only
    for url in checker.urls:
        assert url.startswith(("data:", "#", "tables/")), url
    assert "http://" not in text and "https://" not in text
    # one script, the report's own, inlined: it pages, sorts and filters the long tables
    script = (Path(report.__file__).with_name("templates") / "report.js").read_text(encoding="utf-8")
    assert text.count("<script") == 1 and f"<script>\n{script}" in text


def test_report_content(campaign):
    text = campaign[1].read_text(encoding="utf-8")
    for needle in ("How to read this", "median", "p10–p90", "weak scaling", "CNTK-style", "Caffe-MPI-style",
                   "emulated", "Failures", "Environment", "test-campaign", "Intel Xeon Platinum 8375C",
                   "abc1234", "3.11.9", "torch 2.3.0", "MXNet dist_sync: numpy 2.4.6, mxnet 1.9.1", "launchers.compare",
                   "Campaign settings", "settings.timeout_s", "settings.workers", "(2 CPUs)"):
        assert needle in text, needle
    failures = text[text.index('id="failures"'):]
    pre = re.search(r"<pre>(.*?)</pre>", failures, re.S).group(1)
    assert "RuntimeError: rank 1 lost connection to parameter server &lt;ps:0&gt; &amp; gave up" in pre
    assert "1.600" in text and "0.800" in text  # speedup / efficiency of the 2-worker DDP run


def test_everything_from_the_records_is_escaped(tmp_path):
    """Run ids, labels, campaign settings and error tails come from records: the page shows them
    as text, never as markup (the template escapes every value)."""
    hostile = "<img src=x onerror=alert(1)>"
    failed = dict(make_failed_record(), run_id=f"run-{hostile}", framework_label=f"PS {hostile}",
                  error=f"Traceback\n<script>alert(2)</script> & {hostile}")
    out = make_campaign(tmp_path / "c", [make_records()[0], failed])
    with ResultStore.for_campaign(out) as store:
        store.set_meta("note", f"</td></tr>{hostile}")
    text = report.build_report(out).read_text(encoding="utf-8")
    assert text.count("<script") == 1  # the page's own
    assert "<img src=x" not in text and "</td></tr><img" not in text
    assert "&lt;script&gt;alert(2)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;" in text
    assert "run-&lt;img src=x onerror=alert(1)&gt;" in text and "PS &lt;img src=x" in text
    checker = _Checker()
    checker.feed(text)
    assert not checker.errors and not checker.stack and checker.images


def test_report_writes_tables(campaign):
    out, _ = campaign
    for name in ("throughput", "phases", "scaling", "failures"):
        assert (out / "tables" / f"{name}.md").is_file() and (out / "tables" / f"{name}.csv").is_file()


def test_report_of_an_empty_store(tmp_path):
    ResultStore.for_campaign(tmp_path).close()
    text = report.build_report(tmp_path).read_text(encoding="utf-8")
    assert "<img" not in text and "No rows." in text and "No run failed." in text


def test_report_drops_stale_figures(tmp_path):
    """A figure an earlier build drew must not outlive the data it showed."""
    ResultStore.for_campaign(tmp_path).close()
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "scaling.png").write_bytes(PNG_MAGIC)
    report.build_report(tmp_path)
    assert not (tmp_path / "figures" / "scaling.png").exists()


def run_cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cli_builds_the_report(tmp_path):
    out = make_campaign(tmp_path / "c", [make_records()[0]])
    result = run_cli("analysis.report", out)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == out / "report.html"


def test_cli_without_store_gives_one_line_and_exit_2(tmp_path, capsys):
    result = run_cli("analysis.report", tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "results.sqlite" in result.stderr
    for main in (report.main, summary.main):
        for folder in (tmp_path, tmp_path / "missing"):
            assert main([str(folder)]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and err.startswith("dlcompare: error: ")
    assert not (tmp_path / "results.sqlite").exists()  # reading never creates a store


def render(table, width=80) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return console.file.getvalue()


def test_summary_table(frame):
    table = summary.summary_table(frame)
    assert len(table.columns) == 9 and table.row_count == 5
    text = render(table, width=120)
    assert "PyTorch DDP" in text and "1.60" in text and "0.80" in text and "failed" in text
    assert "125.0 [118.8–135.0]" in text
    assert max(len(line) for line in render(table).splitlines()) <= 80  # fits one 80-column screen


def test_summary_of_empty_frame(frame):
    table = summary.summary_table(frame.iloc[0:0])
    assert table.row_count == 0 and "no runs" in render(table)


def test_print_summary(campaign):
    console = Console(file=io.StringIO(), width=100, color_system=None)
    summary.print_summary(campaign[0], console=console)
    assert "MXNet dist_sync" in console.file.getvalue()
