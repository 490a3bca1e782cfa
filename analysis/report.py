"""The campaign's HTML report: one self-contained page, readable offline and archivable.

``build_report(out_dir)`` reads ``out_dir/results.sqlite``, refreshes the performance model's
prediction of every stored run with the campaign's current calibration (written back to the
store), (re)writes the tables under ``tables/`` (the study's also as LaTeX) and the figures
under ``figures/``, and writes ``report.html`` with the figures
embedded as base64 PNG, the tables as HTML, the environment the runs saw, the failures with
their error tails, and how to read it all.  The page loads nothing from elsewhere (no CDN,
no script), so it renders the same on an air-gapped cluster and in a browser test.

CLI: ``python -m analysis.report DIR`` prints the report's path; a folder without a store
gives a one-line error and exit status 2. When no campaign holds the folder, it first stores
the run folders' records the store lacks (runs measured while the disk was full:
`ResultStore.import_pending`). A report that cannot be written (a full disk) is one line and
exit status 3, and the previous report.html stays whole.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shlex
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

from core.cli import EXIT_NOT_WRITTEN, OneLineParser, fail
from core.envs import reexec_in_host_env
from core.files import write_text_atomic

if __name__ == "__main__":  # `python3 -m analysis.report` from any Python: pandas is in the host env
    reexec_in_host_env("analysis.report", sys.argv[1:])

import pandas as pd  # noqa: E402

from analysis import figures, tables, verdict
from analysis.palette import scheme_colour
from analysis.predict import refresh_predictions
from analysis.rendering import display_frame, flatten_columns, float_format, missing
from analysis.store import CampaignBusy, CampaignLock, ResultStore, StoreError, imported_line

REPORT_FILENAME = "report.html"
ERROR_TAIL_LINES = 40

FIGURE_TEXT: dict[str, tuple[str, str]] = {
    # name: (caption, alt text)
    "throughput": ("Training throughput: one panel per model and topology (nodes × workers per node), one bar per "
                   "scheme, fastest on top.",
                   "Horizontal bar charts of images per second, one bar per scheme in its fixed colour, one panel "
                   "per model and topology."),
    "phases": ("Milliseconds per iteration in each phase (profile mode, communication after backward); the black "
               "tick is the profile iteration with communication run the framework's own way (left of the stack "
               "end where communication overlapped backward); the grey bar below is the throughput-mode "
               "iteration, the time every other figure and table uses.",
               "Horizontal stacked bars of per-phase time for each scheme and topology, with a tick for the "
               "overlapped profile iteration and a thin grey bar for the throughput-mode iteration time."),
    "scaling": ("Speedup against the number of workers: one colour per scheme, one line style per node count "
                "(solid: one node), so 1 node × 2 workers and 2 nodes × 1 worker are separate points; the dashed "
                "grey line is ideal linear scaling.",
                "Line chart of speedup versus number of workers, one colour per scheme and one line style per "
                "node count, with a dashed ideal line."),
    "bandwidth": ("Efficiency against the emulated link bandwidth (--cluster emulated --bandwidth): measured "
                  "(solid) and the performance model's prediction (dashed, hollow), per scheme and topology.",
                  "Line chart of efficiency versus link bandwidth on a log axis, one colour per scheme, measured "
                  "as solid lines and predicted as dashed lines."),
    "iteration_spread": ("Median iteration time with its 10th–90th percentile range over repeats, per scheme, at "
                         "each topology.",
                         "Dot plot of median iteration time with error bars from the 10th to the 90th percentile, "
                         "per scheme, grouped by topology."),
    "prediction": ("Iteration time predicted by the performance model against the measured one, labelled with the "
                   "topology; the shaded band is ±15 %.",
                   "Scatter plot of predicted versus measured iteration time with a dashed diagonal."),
    "timeline": ("One iteration as the model schedules it, per scheme: forward, backward layer by layer (blue) "
                 "and the gradient transfers beneath it (orange), then the update (green); the dashed line is "
                 "the measured iteration time.",
                 "Gantt chart per scheme: a compute row with forward and per-layer backward bars, and a "
                 "transfers row below with the gradient messages scheduled during or after backward."),
    "layers": ("Backward milliseconds per layer with parameters, in the order backward computes them: each scheme "
               "at its smallest topology (solid) and its largest (dashed).",
               "Line chart of backward time per layer, one colour per scheme, solid for the smallest and dashed "
               "for the largest topology."),
}
# Figures that take the page's whole width (wide, with small print).
WIDE_FIGURES = frozenset({"throughput", "phases", "timeline", "layers"})

MODEL_TEXT = """
<p>The model of one synchronous SGD iteration (Shi, Wang, Chu, DataCom 2018), in
<code>analysis/perfmodel.py</code>: one worker takes t = t<sub>io</sub>′ + t<sub>h2d</sub> +
t<sub>f</sub> + t<sub>b</sub> + t<sub>u</sub> (I/O hidden behind the rest when a prefetching
reader is faster); synchronous workers add the communication t<sub>c</sub> of the whole gradient
when it runs after backward; with layer-wise overlap (wait-free backprop) message i starts at
s<sub>i</sub> = max(r<sub>i</sub>, e<sub>i−1</sub>), once its gradient is final and the previous
transfer has ended, and only the communication that outlasts backward is exposed. A message of
n bytes costs α–β–γ: ring all-reduce 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ, with α, β, γ fitted per
transport by <code>python -m launchers.calibrate</code>.</p>
<p>Each run is predicted from its own profile's compute phases and per-layer backward times
(hooks where the framework allows, else backward split by FLOPs) with the communication
modelled; the error is against the measured (throughput-mode) median. Runs without a stored
calibration use their own measured communication phase spread over the bytes (basis
“measured comm”). “from 1 worker” is the prediction from the one-worker profile, what
<code>python -m analysis.predict</code> answers for topologies not measured.</p>
"""

HOW_TO_READ = """
<p>Every configuration ran untimed warm-up iterations, then timed repeats. <strong>Iteration
time</strong> is the <strong>median</strong> over the repeats of the slowest worker's time per
iteration; <strong>p10–p90</strong> is the range between the 10th and 90th percentile of those
repeats, so a narrow range means a stable measurement and a wide one a noisy machine.
Throughput counts the images of all workers per second. Where a configuration ran more than
once, the tables show the median over runs. Times are in milliseconds throughout.</p>
<p>A <strong>topology</strong> is nodes × workers per node: <code>1×2</code> is two workers on one
node, <code>2×1</code> one worker on each of two nodes. They have the same number of workers but
different links between them, so they are never averaged together.</p>
<p>Scaling is <strong>weak scaling</strong>: every worker keeps the same batch, so N workers
process N times as many images per iteration. The speedup S(N) = N · t(1) / t(N) compares a run
with the same scheme's one-worker run with the same per-worker batch; the efficiency
E = S(N) / N is 1 for perfect scaling. Where no one-worker run was measured the speedup is left
blank (—), never extrapolated.</p>
<p>The phase breakdown comes from a separate profile mode that synchronises the device around
each phase; its iteration time is therefore a little longer than in throughput mode.
<em>Overlap</em> is the fraction of communication hidden behind the backward pass.</p>
<p>On a CPU, workers are processes sharing the machine's cores: each gets
<em>threads per worker</em> = cores / workers on the machine, so two workers compute each
iteration with half the threads one worker had. The Runs table shows, per run, the threads, the
cores, whether the run was <em>oversubscribed</em> (more threads than cores), the load average and
how many cores other processes kept busy while it ran.</p>
<p>Rows labelled <strong>CNTK-style</strong> or <strong>Caffe-MPI-style</strong> are
<strong>emulated schemes</strong>: the gradient aggregation of that framework (CNTK: one
all-reduce of the whole gradient after backward, no overlap; Caffe-MPI: a per-layer MPI
all-reduce from a communication thread while backward goes on) re-implemented over another
framework's compute, not the original framework. Failed and timed-out runs are left out of
every table and figure and listed under Failures. Click a figure to see it full size.</p>
"""

CSS = """
:root { color-scheme: light; --ink: #1d2430; --muted: #5b6575; --line: #d8dde6; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: #f6f7f9; }
header { background: #1d2a3a; color: #fff; padding: 1.4rem 2rem 1.2rem; }
header h1 { margin: 0 0 .3rem; font-size: 1.6rem; }
header .sub { margin: 0 0 .8rem; color: #c9d3e0; }
header dl { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1.2rem; margin: 0; font-size: .92rem; }
header dt { color: #9fb0c6; }
header dd { margin: 0; overflow-wrap: anywhere; }
nav { padding: .6rem 2rem; background: #fff; border-bottom: 1px solid var(--line); font-size: .92rem; }
nav a { margin-right: 1.1rem; color: var(--accent); text-decoration: none; }
main { max-width: 1600px; margin: 0 auto; padding: 0 2rem 3rem; }
section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 1rem 1.4rem 1.2rem;
          margin-top: 1.2rem; }
h2 { margin: .2rem 0 .6rem; font-size: 1.25rem; }
h3 { margin: 1rem 0 .3rem; font-size: 1rem; }
p.note { color: var(--muted); margin: .2rem 0 .8rem; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(600px, 1fr)); gap: 0 1.2rem; }
figure { margin: .6rem 0 1rem; }
figure.wide { grid-column: 1 / -1; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); display: block; }
figcaption { color: var(--muted); font-size: .9rem; }
figcaption .hint { font-size: .8rem; }
.zoom { position: absolute; opacity: 0; width: 1px; height: 1px; }
.zoom + label { display: block; cursor: zoom-in; }
.zoom:focus-visible + label img { outline: 3px solid var(--accent); }
.zoom:checked + label { position: fixed; inset: 0; z-index: 10; display: flex; overflow: auto; padding: 1rem;
                        background: rgba(20, 24, 30, .88); cursor: zoom-out; }
.zoom:checked + label img { max-width: none; width: auto; height: auto; margin: auto; background: #fff; }
.verdict h3 { margin-top: 1.1rem; }
p.headline { font-size: 1.05rem; margin: .2rem 0 .4rem; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px; margin-right: .4em;
          vertical-align: -.05em; }
td.text { white-space: normal; min-width: 18rem; max-width: 46rem; }
.flag { color: #a15c00; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: .85rem; margin: .4rem 0; }
th, td { padding: .25rem .5rem; border-bottom: 1px solid var(--line); text-align: left; white-space: nowrap; }
th { background: #eef1f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.missing { color: #9aa3b0; text-align: center; }
pre { background: #1f2329; color: #e8e8e8; padding: .7rem .9rem; border-radius: 4px; overflow-x: auto;
      font-size: .8rem; line-height: 1.35; }
.links { font-size: .85rem; color: var(--muted); }
.links a { color: var(--accent); }
.ok { color: #17803d; font-weight: 600; }
.bad { color: #b42318; font-weight: 600; }
footer { text-align: center; color: var(--muted); font-size: .8rem; padding: 1.5rem; }
"""


# --------------------------------------------------------------------------- small pieces

def esc(value) -> str:
    return html.escape("" if missing(value) else str(value), quote=True)


# Text columns that hold numbers (aligned like numbers).
NUMERIC_TEXT = {"iter_ms_p10_p90"}


def _cell(column: str, value) -> str:
    """One <td>: numbers right-aligned in the column's format, missing values as a dash."""
    if missing(value):
        return '<td class="missing">—</td>'
    if isinstance(value, float):
        return f'<td class="num">{format(value, float_format(column))}</td>'
    if (isinstance(value, int) and not isinstance(value, bool)) or column in NUMERIC_TEXT:
        return f'<td class="num">{esc(value)}</td>'
    return f"<td>{esc(value)}</td>"


# Shorter headers for the page (the CSV and Markdown files keep the column names).
DISPLAY_NAMES = {"framework_label": "framework", "batch_per_worker": "batch/worker", "world_size": "workers",
                 "global_batch": "global batch", "images_per_s": "images/s",
                 "images_per_s_per_worker": "images/s/worker", "iter_ms_median": "iter ms median",
                 "iter_ms_p10_p90": "iter ms p10–p90", "spread_pct": "spread %",
                 "error_last_line": "error (last line)", "threads_per_worker": "threads/worker",
                 "cpu_cores": "cores", "ranks_per_host": "ranks/machine", "load_avg_start": "load avg start",
                 "load_avg_end": "load avg end", "other_load": "other busy cores", "duration_s": "wall s",
                 "workers_per_node": "workers/node"}


# Columns left out of a page table when every row has the same value (said once above it).
CONSTANT_COLUMNS = ("device", "model", "batch_per_worker", "nodes", "runs", "scaling", "cpu_cores")


def compact(table: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Narrow a table for the page; return it and the constant values it left out.

    The adapter's CLI name goes (the label says it); device, nodes, runs and scaling go
    when every row has the same value; iteration time p10 and p90 become one "low–high"
    column.  The CSV and Markdown files keep every column.
    """
    drop = [c for c in ("framework",) if c in table.columns and "framework_label" in table.columns]
    constants = {}
    if len(table) > 1 or "run_id" not in table.columns:
        for column in CONSTANT_COLUMNS:
            if column in table.columns and table[column].nunique(dropna=False) == 1:
                drop.append(column)
                constants[column] = table[column].iloc[0]
    table = table.drop(columns=drop)
    if {"iter_ms_p10", "iter_ms_p90"} <= set(table.columns):  # one "low–high" column
        at = list(table.columns).index("iter_ms_p10")
        spread = [None if missing(lo) or missing(hi) else f"{lo:.2f}–{hi:.2f}"
                  for lo, hi in zip(table["iter_ms_p10"], table["iter_ms_p90"])]
        table = table.drop(columns=["iter_ms_p10", "iter_ms_p90"])
        table.insert(at, "iter_ms_p10_p90", spread)
    return table, constants


def _header(column: str) -> str:
    return DISPLAY_NAMES.get(column, column.replace("_", " "))


def html_table(table: pd.DataFrame, raw_headers: bool = False) -> str:
    """A DataFrame as a plain HTML5 table (no obsolete attributes), inside a scroll box.

    `raw_headers` keeps column names as they are (when they are labels, not field names).
    """
    if table.empty:
        return '<p class="note">No rows.</p>'
    table, constants = (table, {}) if raw_headers else compact(table)
    same = ""
    if constants:
        same = '<p class="note">In every row: ' + ", ".join(
            f"{esc(_header(k))} = {esc(v)}" for k, v in constants.items()) + ".</p>\n"
    shown = display_frame(table)
    head = "".join(f"<th>{esc(c if raw_headers else _header(c))}</th>" for c in table.columns)
    body = "\n".join("<tr>" + "".join(_cell(c, _scalar(v)) for c, v in zip(table.columns, row)) + "</tr>"
                     for row in shown.itertuples(index=False))
    return f'{same}<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table></div>'


def _scalar(value):
    """NumPy scalars -> Python ones, so that formatting picks the numeric branch."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, str) else value


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (lets the page reserve the image's space)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def figure_html(name: str, path: Path) -> str:
    """A <figure> with the PNG embedded as base64, its caption and alt text; clicking the image
    opens it full size over the page and clicking again closes it (a checkbox and CSS: the page
    runs no script).  ``data-series`` carries the figure's drawn series (``<name>.json``)."""
    path = Path(path)
    data = path.read_bytes()
    width, height = png_size(data)
    caption, alt = FIGURE_TEXT.get(name, (name, f"Figure {name}"))
    encoded = base64.b64encode(data).decode("ascii")
    sidecar = path.with_suffix(".json")
    series = json.loads(sidecar.read_text(encoding="utf-8")).get("series", []) if sidecar.exists() else []
    wide = ' class="wide"' if name in WIDE_FIGURES else ""
    return (f'<figure id="figure-{name}"{wide} data-series="{esc(json.dumps(series))}">'
            f'<input type="checkbox" class="zoom" id="zoom-{name}" aria-label="show {esc(name)} full size">'
            f'<label for="zoom-{name}" title="click to open full size, click again to close">'
            f'<img src="data:image/png;base64,{encoded}" alt="{esc(alt)}" width="{width}" height="{height}">'
            f'</label><figcaption>{esc(caption)} <span class="hint">(click to enlarge)</span></figcaption></figure>')


def _unique(series: pd.Series) -> list[str]:
    return [str(v) for v in dict.fromkeys(series.dropna()) if str(v).strip()]


def _joined(frame: pd.DataFrame, columns: list[str]) -> str:
    values = []
    for column in columns:
        if column in frame.columns:
            values += _unique(frame[column])
    return ", ".join(dict.fromkeys(values)) or "—"


def env_columns(frame: pd.DataFrame, word: str) -> list[str]:
    """``env_*`` columns whose key mentions `word` (python, cpu, gpu, version ...)."""
    return [c for c in frame.columns if c.startswith("env_") and word in c[len("env_"):].lower()]


VERSION_LIKE = re.compile(r"^v?\d+(\.\d+)+")


def _is_version_column(frame: pd.DataFrame, column: str) -> bool:
    """An env column that holds library versions: named so, or valued like ``2.3.0``.

    The env's keys are whatever each adapter reports (library names), so versions are found
    by shape rather than by a list of framework names; Python has its own header line.
    """
    key = column[len("env_"):].lower()
    if "python" in key:
        return False
    values = list(frame[column].dropna())
    return "version" in key or (bool(values) and all(isinstance(v, str) and VERSION_LIKE.match(v)
                                                      for v in values))


def versions_by_label(frame: pd.DataFrame) -> str:
    """'Label: lib 1.2.3, ...; ...' from the env columns that carry versions."""
    columns = [c for c in frame.columns if c.startswith("env_") and _is_version_column(frame, c)]
    parts = []
    labels = tables.prepare(frame)["framework_label"] if len(frame) else pd.Series(dtype=object)
    for label in _unique(labels):
        rows = frame[labels == label]
        found = [f"{_short_key(c)} {v}" for c in columns for v in _unique(rows[c])]
        if found:
            parts.append(f"{label}: {', '.join(found)}")
    return "; ".join(parts) or "—"


def cpu_text(frame: pd.DataFrame) -> str:
    """CPU model names from the env, with the CPU count where one is reported."""
    columns = env_columns(frame, "cpu")
    counts = [c for c in columns if "count" in c]
    text = _joined(frame, [c for c in columns if c not in counts])
    count = _joined(frame, counts)
    return text if count == "—" else f"{text} ({count} CPUs)"


def gpu_text(frame: pd.DataFrame) -> str:
    """GPUs from the env when an adapter reports them, else the names of GPU devices used."""
    text = _joined(frame, env_columns(frame, "gpu"))
    if text == "—" and {"device_kind", "device_name"} <= set(frame.columns):
        text = _joined(frame[frame["device_kind"] == "gpu"], ["device_name"])
    return text if text != "—" else "none used"


def _short_key(column: str) -> str:
    """``env_versions_torch`` -> ``torch``; ``env_cuda_version`` -> ``cuda``."""
    key = column[len("env_"):]
    for prefix in ("versions_", "version_"):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key.removesuffix("_version")


def environment_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Environment facts (``env_*`` columns) as rows, one column per framework label.

    Each framework runs in its own environment, so versions are shown per label.
    """
    columns = [c for c in frame.columns if c.startswith("env_")]
    if frame.empty or not columns:
        return pd.DataFrame()
    labels = tables.prepare(frame)["framework_label"]
    result = {"key": [c[len("env_"):] for c in columns]}
    for label in _unique(labels):
        rows = frame[labels == label]
        result[label] = [", ".join(_unique(rows[c])) or None for c in columns]
    return pd.DataFrame(result)


def _meta_text(value) -> str:
    """A campaign fact as one line: an argv list as a shell command line, a list joined."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return shlex.join(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(_meta_text(v) for v in value)
    return str(value)


def _decoded(value):
    """A value stored as JSON text (a dict serialised twice) becomes the dict again."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def meta_items(meta: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Campaign facts as (key, text) rows, nested dicts flattened as ``outer.inner``."""
    rows = []
    for key, value in sorted(meta.items()):
        value = _decoded(value)
        if isinstance(value, dict):
            rows += meta_items(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", _meta_text(value)))
    return rows


# --------------------------------------------------------------------------- sections

def header_html(out_dir: Path, frame: pd.DataFrame, meta: dict) -> str:
    """Campaign, devices, versions, git revision: what a reader needs to trust the numbers."""
    campaign = meta.get("campaign") or _joined(frame, ["campaign"])
    if campaign == "—":
        campaign = out_dir.resolve().name
    status = frame["status"] if "status" in frame.columns else pd.Series(dtype=object)
    n_ok, n_bad = int((status == "ok").sum()), int((status.notna() & (status != "ok")).sum())
    facts = [
        ("Campaign", campaign),
        ("Device", _joined(frame, ["device_name"]) if "device_name" in frame else "—"),
        ("Device kind", _joined(frame, ["device_kind"])),
        ("Models", _joined(frame, ["model"])),
        ("Frameworks", _joined(tables.prepare(frame), ["framework_label"]) if len(frame) else "—"),
        ("Versions", versions_by_label(frame)),
        ("Python", _joined(frame, env_columns(frame, "python"))),
        ("CPU", cpu_text(frame)),
        ("GPU", gpu_text(frame)),
        ("Git revision", _joined(frame, ["git_revision"])),
    ]
    if "image_digest" in frame.columns and frame["image_digest"].notna().any():
        facts.append(("Image digest", _joined(frame, ["image_digest"])))
    if "command" in meta:  # the rest of the campaign's facts are under Environment
        facts.append(("Command", _meta_text(_decoded(meta["command"]))))
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    items = "\n".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    return (f"<header><h1>dlcompare report — {esc(campaign)}</h1>\n"
            f'<p class="sub">{len(frame)} runs: <span>{n_ok} ok</span>, <span>{n_bad} failed or timed out</span>'
            f" · generated {esc(generated)}</p>\n<dl>\n{items}\n</dl></header>")


def table_section(name: str, table: pd.DataFrame, figure_names: list[str], made: dict[str, Path]) -> str:
    """A report section: its figures, what the table means, the table, links to its files."""
    parts = [f'<section id="{name}"><h2>{esc(tables.TABLE_TITLES[name])}</h2>',
             f'<p class="note">{esc(tables.TABLE_DESCRIPTIONS[name])}</p>']
    drawn = [figure_html(f, made[f]) for f in figure_names if f in made]
    if drawn:
        parts.append('<div class="figures">' + "\n".join(drawn) + "</div>")
    parts.append(html_table(table))
    parts.append(f'<p class="links">Files: <a href="tables/{name}.csv">{name}.csv</a> · '
                 f'<a href="tables/{name}.md">{name}.md</a></p></section>')
    return "\n".join(parts)


VERDICT_TEXT = """
<p class="note">Per model and topology (nodes × workers per node), the synchronous schemes ranked by images/s.
A win is <em>beyond the spread</em> when the p10–p90 ranges of the two iteration times do not overlap. For each
multi-worker run, <em>E</em> is its efficiency against the same scheme's one-worker run, and the cause says where
the lost time per iteration went, from the profile's measured phases: slower compute (each worker's forward and
backward against the one-worker run: workers sharing cores or a device), communication left exposed after
backward, skew (waiting for the slowest rank), I/O, update. Flags mark numbers to read with care: oversubscribed
CPU runs (ranks × threads above the cores), a machine kept busy by other processes, a wide spread.</p>
"""


def _verdict_row(row: pd.Series) -> str:
    """One scheme of a topology's verdict as a <tr>."""
    def number(value, fmt):
        return '<td class="missing">—</td>' if missing(value) else f'<td class="num">{format(value, fmt)}</td>'

    rank = "" if missing(row["rank"]) else f"{int(row['rank'])}"
    scheme = (f'<span class="swatch" style="background:{scheme_colour(row["framework"], row["mode"])}"></span>'
              f'{esc(row["series"])}' + ("" if row["synchronous"] else " <em>(asynchronous: not ranked)</em>"))
    spread = (f"{row['iter_ms']:.1f} [{row['iter_ms_p10']:.1f}–{row['iter_ms_p90']:.1f}]"
              if not missing(row["iter_ms_p10"]) else f"{row['iter_ms']:.1f}")
    behind = "" if missing(row["behind_winner_pct"]) or row["rank"] == 1 else f"−{row['behind_winner_pct']:.0f}%"
    flags = f'<span class="flag">{esc(row["flags"])}</span>' if row["flags"] else ""
    return ("<tr>" + f'<td class="num">{rank}</td><td>{scheme}</td>' + number(row["images_per_s"], ".1f")
            + f'<td class="num">{esc(spread)}</td><td class="num">{behind}</td>' + number(row["efficiency"], ".2f")
            + f'<td class="text">{esc(row["cause_text"])}</td><td class="text">{flags}</td></tr>')


def verdict_section(table: pd.DataFrame) -> str:
    """The answer first: per topology the headline and the ranked schemes with their causes."""
    parts = ['<section id="verdict" class="verdict"><h2>Verdict</h2>', VERDICT_TEXT]
    found = verdict.verdicts(table)
    if not found:
        parts.append('<p class="note">No successful run yet.</p></section>')
        return "\n".join(parts)
    head = "".join(f"<th>{h}</th>" for h in ("#", "scheme", "images/s", "iter ms [p10–p90]", "behind",
                                                "E", "where the time went", "flags"))
    for item in found:
        rows = "\n".join(_verdict_row(row) for _, row in item.rows.iterrows())
        parts += [f"<h3>{esc(item.title)}</h3>", f'<p class="headline">{esc(item.headline)}</p>',
                  f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>'
                  "\n</table></div>"]
    parts.append('<p class="links">Every component in milliseconds: <a href="tables/verdict.csv">verdict.csv</a> · '
                  '<a href="tables/verdict.md">verdict.md</a></p></section>')
    return "\n".join(parts)


def layers_section(table: pd.DataFrame, made: dict[str, Path]) -> str:
    """Backward per layer: the figure, then per model a table of layers × scheme and topology."""
    parts = [f'<section id="layers"><h2>{esc(tables.TABLE_TITLES["layers"])}</h2>',
             f'<p class="note">{esc(tables.TABLE_DESCRIPTIONS["layers"])}</p>']
    if "layers" in made:
        parts.append('<div class="figures">' + figure_html("layers", made["layers"]) + "</div>")
    if table.empty:
        parts.append('<p class="note">No rows.</p>')
    for model, rows in table.groupby("model", sort=True):
        wide = rows.assign(column=[f"{tables.series_name(lb, m)} · {t}" for lb, m, t in
                                   zip(rows["framework_label"], rows["mode"], rows["topology"])]) \
            .pivot_table(index=["order", "layer"], columns="column", values="backward_ms", aggfunc="median") \
            .reset_index().drop(columns="order")
        wide.columns = [str(c) if c != "layer" else "layer (backward order)" for c in wide.columns]
        parts += [f"<h3>{esc(model)} (ms)</h3>", html_table(wide, raw_headers=True)]
    parts.append('<p class="links">Files: <a href="tables/layers.csv">layers.csv</a> · '
                 '<a href="tables/layers.md">layers.md</a></p></section>')
    return "\n".join(parts)


def failures_section(frame: pd.DataFrame, failures: pd.DataFrame) -> str:
    """The failures table, then each failed run's error tail in <pre>."""
    parts = ['<section id="failures"><h2>Failures</h2>']
    if failures.empty:
        parts.append('<p class="note"><span class="ok">No run failed.</span></p></section>')
        return "\n".join(parts)
    parts.append(f'<p class="note"><span class="bad">{len(failures)} run(s) failed or timed out.</span> '
                 "They are excluded from every table and figure above.</p>")
    parts.append(html_table(failures))
    errors = frame.set_index("run_id")["error"] if "error" in frame.columns else pd.Series(dtype=object)
    for run_id in failures["run_id"]:
        tail = "\n".join(str(errors.get(run_id) or "(no error output recorded)").rstrip().splitlines()[-ERROR_TAIL_LINES:])
        parts.append(f"<h3>{esc(run_id)}</h3>\n<pre>{esc(tail)}</pre>")
    parts.append("</section>")
    return "\n".join(parts)


def environment_section(frame: pd.DataFrame, meta: dict) -> str:
    """Per-framework environment facts, then the campaign's own settings."""
    settings = pd.DataFrame(meta_items({k: v for k, v in meta.items() if k not in ("campaign", "command")}),
                            columns=["setting", "value"])
    parts = ['<section id="environment"><h2>Environment</h2>',
             '<p class="note">What each framework\'s environment reported (from the records\' env).</p>',
             html_table(environment_table(frame), raw_headers=True)]
    if len(settings):
        parts += ["<h3>Campaign settings</h3>", html_table(settings)]
    parts.append("</section>")
    return "\n".join(parts)


def model_section(built: dict[str, pd.DataFrame], made: dict[str, Path]) -> str:
    """The performance model: figures, error per scheme, per configuration, calibration."""
    parts = ['<section id="model"><h2>Performance model: predicted against measured</h2>', MODEL_TEXT]
    drawn = [figure_html(f, made[f]) for f in ("prediction", "timeline") if f in made]
    if drawn:
        parts.append('<div class="figures">' + "\n".join(drawn) + "</div>")
    for name in ("prediction_summary", "prediction", "calibration"):
        parts += [f"<h3>{esc(tables.TABLE_TITLES[name])}</h3>",
                  f'<p class="note">{esc(tables.TABLE_DESCRIPTIONS[name])}</p>', html_table(built[name]),
                  f'<p class="links">Files: <a href="tables/{name}.csv">{name}.csv</a> · '
                  f'<a href="tables/{name}.md">{name}.md</a></p>']
    if built["calibration"].empty:
        parts.append('<p class="note">No calibration stored: run <code>python -m launchers.calibrate --out '
                     'DIR</code> (or <code>compare --calibrate</code>) for calibrated predictions.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def study_section(frame: pd.DataFrame, built: dict[str, pd.DataFrame] | None = None) -> str:
    """The study's tables: single-worker throughput and phases; per model, frameworks against
    1, 2, 4 workers and 2, 4 nodes with iteration time, speedup, efficiency."""
    parts = ['<section id="study"><h2>The study\'s tables</h2>',
             '<p class="note">As in Shi, Wang, Chu (2018): per model, frameworks as rows and the topologies as '
             'columns, each with iteration time (ms), speedup S and efficiency E (weak scaling); '
             'a dash where a topology was not measured. Also as Markdown, CSV and LaTeX.</p>',
             "<h3>Single worker: throughput and phases</h3>"]
    study = {k: v for k, v in (built or {}).items() if k.startswith("study_")} or tables.study_tables(frame)
    parts.append(html_table(study["study_single"], raw_headers=True))
    parts.append('<p class="links">Files: <a href="tables/study_single.csv">csv</a> · '
                 '<a href="tables/study_single.md">md</a> · <a href="tables/study_single.tex">tex</a></p>')
    for name, table in study.items():
        if name == "study_single":
            continue
        model = name[len("study_scaling_"):]
        flat = flatten_columns(table)
        parts += [f"<h3>{esc(model)}</h3>", html_table(flat, raw_headers=True),
                  f'<p class="links">Files: <a href="tables/{name}.csv">csv</a> · <a href="tables/{name}.md">md</a>'
                  f' · <a href="tables/{name}.tex">tex</a></p>']
    parts.append("</section>")
    return "\n".join(parts)


def render_html(out_dir: Path, frame: pd.DataFrame, meta: dict, built: dict[str, pd.DataFrame],
                made: dict[str, Path]) -> str:
    """The whole page as a string."""
    sections = [
        verdict_section(built["verdict"]),
        f'<section id="how-to-read"><h2>How to read this</h2>{HOW_TO_READ}</section>',
        table_section("throughput", built["throughput"], ["throughput", "iteration_spread"], made),
        table_section("phases", built["phases"], ["phases"], made),
        table_section("scaling", built["scaling"], ["scaling", "bandwidth"], made),
        table_section("runs", built["runs"], [], made),
        layers_section(built["layers"], made),
        model_section(built, made),
        study_section(frame, built),
        failures_section(frame, built["failures"]),
        environment_section(frame, meta),
    ]
    nav = " ".join(f'<a href="#{anchor}">{esc(text)}</a>' for anchor, text in (
        ("verdict", "Verdict"), ("how-to-read", "How to read this"), ("throughput", "Throughput"),
        ("phases", "Phases"), ("scaling", "Scaling"), ("runs", "Runs"), ("layers", "Layers"), ("model", "Model"),
        ("study", "Study tables"), ("failures", "Failures"), ("environment", "Environment")))
    campaign = meta.get("campaign") or out_dir.resolve().name
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>dlcompare report — {esc(campaign)}</title>",
        '<link rel="icon" href="data:,">',  # no favicon request, hence no 404 in the console
        f"<style>{CSS}</style>", "</head>", "<body>",
        header_html(out_dir, frame, meta), f"<nav>{nav}</nav>", "<main>", *sections, "</main>",
        "<footer>Generated by dlcompare's analysis package from results.sqlite.</footer>",
        "</body>", "</html>", ""])


def _drop_stale_figures(out_dir: Path, made: dict[str, Path]) -> None:
    """Remove figures an earlier build drew that have nothing to show now."""
    for name in figures.FIGURES:
        path = out_dir / "figures" / f"{name}.png"
        if name not in made and path.exists():
            path.unlink()


def build_report(out_dir: str | Path) -> Path:
    """Read the campaign's store, write tables, figures and report.html; return its path.

    Raises StoreError when `out_dir` has no result store.
    """
    out_dir = Path(out_dir)
    with ResultStore.for_campaign(out_dir, create=False) as store:
        try:  # predictions with the campaign's current calibration (stored for every run)
            refresh_predictions(store)
        except StoreError:
            pass  # a read-only store keeps the predictions it has
        frame = store.runs_frame()
        meta = store.meta()
        calibrations = store.calibration_frame()
    built = {**tables.build_tables(frame, calibrations), "verdict": verdict.verdict_table(frame),
             **tables.study_tables(frame)}
    tables.write_tables(frame, out_dir, built=built)
    made = figures.make_figures(frame, out_dir)
    _drop_stale_figures(out_dir, made)
    path = out_dir / REPORT_FILENAME
    # whole or not at all: a full disk leaves the previous report readable
    write_text_atomic(path, render_html(out_dir, frame, meta, built, made))
    return path


def import_pending_records(out_dir: Path) -> list[str]:
    """Store the run folders' records the store lacks, unless a campaign holds the folder
    (it stores them itself); returns the run ids imported."""
    try:
        with CampaignLock(out_dir).acquire():
            with ResultStore.for_campaign(out_dir, create=False) as store:
                imported, _ = store.import_pending(out_dir)
    except CampaignBusy:
        return []
    return imported


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.report DIR``: (re)build a campaign's report and print its path."""
    parser = OneLineParser(prog="python -m analysis.report",
                                     description="Build the HTML report of a dlcompare campaign folder.")
    parser.add_argument("out_dir", metavar="DIR", help="campaign folder holding results.sqlite")
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    try:
        if (out_dir / "results.sqlite").is_file():
            imported = import_pending_records(out_dir)
            if imported:
                print(imported_line(imported), file=sys.stderr)
        print(build_report(out_dir))
    except StoreError as exc:
        return fail(exc, exc.exit_code)
    except OSError as exc:
        return fail(f"report not written: {exc.strerror or exc}: {exc.filename or out_dir}", EXIT_NOT_WRITTEN)
    return 0


if __name__ == "__main__":
    sys.exit(main())
