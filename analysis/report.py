"""The campaign's HTML report: one page, readable offline and archivable with its folder.

``build_report(out_dir)`` reads ``out_dir/results.sqlite``, refreshes the performance model's
prediction of every stored run with the campaign's current calibration (written back to the
store), (re)writes the tables under ``tables/`` (the study's also as LaTeX) and the figures
under ``figures/``, and writes ``report.html``: the verdict matrix first (`analysis.overview`),
then the verdict of each topology (at most `SPELLED_OUT_TOPOLOGIES`), the figures (embedded as
base64 PNG up to `EMBED_LIMIT_BYTES`, so a campaign of ordinary size is one self-contained
file; linked as the files under ``figures/`` beyond it), the tables as HTML, the environment
the runs saw, the failures with their error tails, and how to read it all.  A numeric
dimension the campaign swept gets its own figure (`figures.SWEEPS`), right after the verdict.
The page loads nothing from elsewhere (no CDN): its one script, ``templates/report.js``, is
inlined and pages, sorts and filters the tables longer than `PAGE_ROWS` (without script they
show every row), so it renders the same on an air-gapped cluster and in a browser test.

The page is the Jinja2 template ``analysis/templates/report.html.j2`` (its building blocks in
``report_macros.html.j2``, its stylesheet ``report.css`` and script ``report.js`` inlined):
this module turns the tables, figures and records into plain views (text already formatted),
and the template, autoescaping every value, lays them out.

CLI: ``python -m analysis.report DIR`` prints the report's path; a folder without a store
gives a one-line error and exit status 2. When no campaign holds the folder, it first stores
the run folders' records the store lacks (runs measured while the disk was full:
`ResultStore.import_pending`). A report that cannot be written (a full disk) is one line and
exit status 3, and the previous report.html stays whole.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import struct
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from core.cli import EXIT_NOT_WRITTEN, OneLineParser, fail, warning_line
from core.envs import reexec_in_host_env
from core.files import write_text_atomic

if __name__ == "__main__":  # `python3 -m analysis.report` from any Python: pandas is in the host env
    reexec_in_host_env("analysis.report", sys.argv[1:])

import pandas as pd  # noqa: E402
from jinja2 import Environment, FileSystemLoader, StrictUndefined  # noqa: E402

from analysis import figures, noise, overview, tables, trace, verdict
from analysis.palette import scheme_colour
from analysis.predict import refresh_predictions
from analysis.rendering import display_frame, flatten_columns, float_format, missing
from analysis.store import CampaignBusy, CampaignLock, ResultStore, StoreError, imported_line

REPORT_FILENAME = "report.html"
ERROR_TAIL_LINES = 40
# The page's verdict matrix: more room than a terminal's screen, still bounded at any size.
MATRIX_BUDGET = {"max_rows": 60, "max_columns": 8, "max_grids": 6}
# Topologies whose ranked schemes and causes the page spells out (evenly chosen beyond it; all
# of them are in tables/verdict.csv and `dlcompare summary DIR --where ...`).
SPELLED_OUT_TOPOLOGIES = 24
# Figures are embedded in the page up to this many bytes of PNG in all, and beyond it linked as
# the files under figures/ (a sweep's page stays small enough to open at once).
EMBED_LIMIT_BYTES = 1_000_000
# A table longer than this is shown a page of rows at a time, with a filter and sortable headers
# (templates/report.js, inlined; without script every row shows).
PAGE_ROWS = 50

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
    **{f"sweep_{name}": (f"Against {sweep.axis}, per scheme (its colour): images/s, efficiency against the "
                         "scheme's one-worker run and communication left exposed after backward; measured as solid "
                         "lines with the p10–p90 band of the iteration time, the performance model's prediction "
                         "dashed with hollow markers; one column per combination of the other swept dimensions.",
                         f"Three rows of line charts (throughput, efficiency, exposed communication) against "
                         f"{sweep.axis}, one line per scheme, measured solid with a shaded band and predicted dashed.")
       for name, sweep in figures.SWEEPS.items()},
}
# Figures that take the page's whole width (wide, with small print).
WIDE_FIGURES = frozenset({"throughput", "phases", "timeline", "layers", *(f"sweep_{n}" for n in figures.SWEEPS)})

# --------------------------------------------------------------------------- small pieces

@dataclass(frozen=True)
class Cell:
    """One table cell as the page shows it: its text and its class (``num`` right-aligned,
    ``missing`` a centred dash, "" plain text)."""

    text: str
    kind: str = ""
    href: str = ""  # a link relative to the page (the runs table's traces)


MISSING = Cell("—", "missing")


def text_of(value) -> str:
    """A value as page text: missing values as nothing."""
    return "" if missing(value) else str(value)


# Text columns that hold numbers (aligned like numbers).
NUMERIC_TEXT = {"iter_ms_p10_p90"}


def cell(column: str, value) -> Cell:
    """Numbers right-aligned in the column's format, missing values as a dash."""
    if missing(value):
        return MISSING
    if column == "trace":
        return Cell("trace.json", href=str(value))
    if isinstance(value, float):
        return Cell(format(value, float_format(column)), "num")
    if (isinstance(value, int) and not isinstance(value, bool)) or column in NUMERIC_TEXT:
        return Cell(str(value), "num")
    return Cell(str(value))


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


@dataclass(frozen=True)
class TableView:
    """A DataFrame as the page's table shows it: the constant columns said once above it,
    the headers, the cells."""

    constants: list[tuple[str, str]]
    headers: list[str]
    rows: list[list[Cell]]

    @property
    def paged(self) -> bool:
        """Longer than one page: the page's script pages, sorts and filters it."""
        return len(self.rows) > PAGE_ROWS


def table_view(table: pd.DataFrame, raw_headers: bool = False) -> TableView | None:
    """The page's view of a table (None: no rows); `raw_headers` keeps column names as they
    are (when they are labels, not field names)."""
    if table.empty:
        return None
    table, constants = (table, {}) if raw_headers else compact(table)
    shown = display_frame(table)
    return TableView(constants=[(_header(k), text_of(v)) for k, v in constants.items()],
                     headers=[str(c) if raw_headers else _header(c) for c in table.columns],
                     rows=[[cell(c, _scalar(v)) for c, v in zip(table.columns, row)]
                           for row in shown.itertuples(index=False)])


def _scalar(value):
    """NumPy scalars -> Python ones, so that formatting picks the numeric branch."""
    item = getattr(value, "item", None)
    return item() if callable(item) and not isinstance(value, str) else value


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (lets the page reserve the image's space)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def figure_view(name: str, path: Path, embed: bool = True) -> dict:
    """A figure for the page: the PNG as a base64 data URI (`embed`) or as its file's path
    relative to the page, its size, caption and alt text, and its drawn series
    (``<name>.json``) as JSON for ``data-series``."""
    path = Path(path)
    data = path.read_bytes()
    width, height = png_size(data)
    caption, alt = FIGURE_TEXT.get(name, (name, f"Figure {name}"))
    sidecar = path.with_suffix(".json")
    series = json.loads(sidecar.read_text(encoding="utf-8")).get("series", []) if sidecar.exists() else []
    return {"name": name, "wide": name in WIDE_FIGURES, "series": json.dumps(series),
            "src": ("data:image/png;base64," + base64.b64encode(data).decode("ascii")) if embed
            else f"{path.parent.name}/{path.name}", "width": width, "height": height,
            "caption": caption, "alt": alt}


def figure_views(names, shown: dict[str, dict]) -> list[dict]:
    """The figures among `names` that were drawn, from `shown_figures`' views."""
    return [shown[name] for name in names if name in shown]


def shown_figures(made: dict[str, Path]) -> dict[str, dict]:
    """Every drawn figure's view: embedded in the page while all of them together stay under
    `EMBED_LIMIT_BYTES` (one self-contained file), else linked as the files beside it."""
    embed = sum(path.stat().st_size for path in made.values()) <= EMBED_LIMIT_BYTES
    return {name: figure_view(name, path, embed) for name, path in made.items()}


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

def header_view(out_dir: Path, frame: pd.DataFrame, meta: dict) -> dict:
    """Campaign, devices, versions, git revision: what a reader needs to trust the numbers."""
    campaign = meta.get("campaign") or _joined(frame, ["campaign"])
    if campaign == "—":
        campaign = out_dir.resolve().name
    status = frame["status"] if "status" in frame.columns else pd.Series(dtype=object)
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
    return {"campaign": campaign, "runs": len(frame), "ok": int((status == "ok").sum()),
            "bad": int((status.notna() & (status != "ok")).sum()),
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "facts": [(key, text_of(value)) for key, value in facts]}


def table_section(name: str, table: pd.DataFrame, figure_names: list[str], shown: dict[str, dict]) -> dict:
    """A report section: its figures, what the table means, the table, links to its files."""
    return {"name": name, "title": tables.TABLE_TITLES[name], "description": tables.TABLE_DESCRIPTIONS[name],
            "figures": figure_views(figure_names, shown), "table": table_view(table)}


def verdict_row(row: pd.Series) -> dict:
    """One scheme of a topology's verdict."""
    def number(value, fmt) -> Cell:
        return MISSING if missing(value) else Cell(format(value, fmt), "num")

    def interval(value, low, high, fmt) -> Cell:
        if missing(value):
            return MISSING
        return Cell(format(value, fmt) + ("" if missing(low) else f" [{format(low, fmt)}–{format(high, fmt)}]"), "num")

    spread = (f"{row['iter_ms']:.1f} [{row['iter_ms_p10']:.1f}–{row['iter_ms_p90']:.1f}]"
              if not missing(row["iter_ms_p10"]) else f"{row['iter_ms']:.1f}")
    return {"rank": "" if missing(row["rank"]) else f"{int(row['rank'])}",
            "colour": scheme_colour(row["framework"], row["mode"]), "series": text_of(row["series"]),
            "synchronous": bool(row["synchronous"]), "launches": f"{int(row['launches'])}",
            "images_per_s": interval(row["images_per_s"], row["images_per_s_low"], row["images_per_s_high"], ".0f"),
            "spread": spread,
            "efficiency": interval(row["efficiency"], row["efficiency_low"], row["efficiency_high"], ".2f"),
            "behind": "" if missing(row["behind_winner_pct"]) or row["rank"] == 1
            else f"−{row['behind_winner_pct']:.0f}%",
            "cause": text_of(row["cause_text"]), "flags": text_of(row["flags"]) if row["flags"] else ""}


def verdict_views(table: pd.DataFrame) -> tuple[list[dict], int]:
    """Per topology the headline and the ranked schemes with their causes, for at most
    `SPELLED_OUT_TOPOLOGIES` evenly chosen topologies; and how many were left out."""
    found = verdict.verdicts(table)
    shown = overview.evenly(found, SPELLED_OUT_TOPOLOGIES)
    return [{"title": item.title, "headline": item.headline,
             "rows": [verdict_row(row) for _, row in item.rows.iterrows()]} for item in shown], len(found) - len(shown)


def matrix_cell_view(cell: overview.MatrixCell | None) -> dict | None:
    """A matrix cell for the page: the winner in its colour, margin, clear mark, the model's pick."""
    if cell is None:
        return None
    return {"winner": cell.winner, "colour": scheme_colour(cell.framework, cell.mode), "margin": cell.margin_text,
            "mark": cell.clear_mark, "is_clear": cell.clear is True,
            "predicted": "" if cell.predicted is None else "◆" if cell.predicted == cell.winner
            else f"◇ {cell.predicted}"}


def matrix_view(table: pd.DataFrame) -> dict:
    """The overview: per model and device a grid of topologies (swept dimensions as its axes),
    each cell the winner; then the win counts per scheme."""
    grids, grids_left_out = overview.verdict_matrix(table, **MATRIX_BUDGET)
    wins = overview.win_counts(table)
    return {"grids": [{"title": g.title, "row_axis": g.row_axis, "column_axis": g.column_axis, "columns": g.columns,
                       "rows": [(row, [matrix_cell_view(g.cells.get((row, c))) for c in g.columns]) for row in g.rows],
                       "rows_left_out": g.rows_left_out, "columns_left_out": g.columns_left_out} for g in grids],
            "grids_left_out": grids_left_out, "key": overview.MATRIX_KEY,
            "wins": [{"series": r["series"], "colour": scheme_colour(r["framework"], r["mode"]), "wins": int(r["wins"]),
                      "clear_wins": int(r["clear"]), "agrees": int(r["model_agrees"]), "predicted": int(r["predicted"])}
                     for _, r in wins.iterrows()]}


def layers_view(table: pd.DataFrame, shown: dict[str, dict]) -> dict:
    """Backward per layer: the figure, then per model a table of layers × scheme and topology."""
    models = []
    for model, rows in table.groupby("model", sort=True):
        wide = rows.assign(column=[f"{tables.series_name(lb, m)} · {t}" for lb, m, t in
                                   zip(rows["framework_label"], rows["mode"], rows["topology"])]) \
            .pivot_table(index=["order", "layer"], columns="column", values="backward_ms", aggfunc="median") \
            .reset_index().drop(columns="order")
        wide.columns = [str(c) if c != "layer" else "layer (backward order)" for c in wide.columns]
        models.append((model, table_view(wide, raw_headers=True)))
    return {"title": tables.TABLE_TITLES["layers"], "description": tables.TABLE_DESCRIPTIONS["layers"],
            "figures": figure_views(["layers"], shown), "models": models}


def failures_view(frame: pd.DataFrame, failures: pd.DataFrame) -> dict:
    """The failures table, then each failed run's error tail."""
    errors = frame.set_index("run_id")["error"] if "error" in frame.columns else pd.Series(dtype=object)
    tails = [(text_of(run_id), "\n".join(str(errors.get(run_id) or "(no error output recorded)")
                                          .rstrip().splitlines()[-ERROR_TAIL_LINES:]))
             for run_id in failures["run_id"]] if len(failures) else []
    return {"count": len(failures), "table": table_view(failures), "tails": tails}


def environment_view(frame: pd.DataFrame, meta: dict) -> dict:
    """Per-framework environment facts, then the campaign's own settings."""
    settings = pd.DataFrame(meta_items({k: v for k, v in meta.items() if k not in ("campaign", "command")}),
                            columns=["setting", "value"])
    return {"table": table_view(environment_table(frame), raw_headers=True),
            "settings": table_view(settings) if len(settings) else None}


def model_view(built: dict[str, pd.DataFrame], shown: dict[str, dict]) -> dict:
    """The performance model: figures, error per scheme, per configuration, calibration."""
    return {"figures": figure_views(("prediction", "timeline"), shown),
            "tables": [{"name": name, "title": tables.TABLE_TITLES[name],
                        "description": tables.TABLE_DESCRIPTIONS[name], "table": table_view(built[name])}
                       for name in ("prediction_summary", "prediction", "calibration")],
            "calibrated": not built["calibration"].empty}


def study_view(frame: pd.DataFrame, built: dict[str, pd.DataFrame] | None = None) -> dict:
    """The study's tables: single-worker throughput and phases; per model, frameworks against
    1, 2, 4 workers and 2, 4 nodes with iteration time, speedup, efficiency."""
    study = {k: v for k, v in (built or {}).items() if k.startswith("study_")} or tables.study_tables(frame)
    return {"single": table_view(study["study_single"], raw_headers=True),
            "scaling": [(name, name[len("study_scaling_"):], table_view(flatten_columns(table), raw_headers=True))
                        for name, table in study.items() if name != "study_single"]}


def noise_view(frame: pd.DataFrame, table: pd.DataFrame) -> dict:
    """The campaign's between-launch noise: the fit's line, the A/A controls (schemes that share
    one one-worker computation: `noise.shared_computation`), each configuration's launches."""
    fitted = noise.campaign_noise(frame)
    return {"line": fitted.describe(), "controls": [c["text"] for c in noise.shared_computation(frame, fitted)],
            "table": table_view(table)}


def sweeps_view(shown: dict[str, dict]) -> list[dict]:
    """The sweep figures drawn, one per dimension the campaign swept (`figures.SWEEPS`)."""
    return figure_views([f"sweep_{name}" for name in figures.SWEEPS], shown)


NAV = (("verdict", "Verdict"), ("noise", "Noise"), ("sweeps", "Sweeps"), ("how-to-read", "How to read this"),
       ("throughput", "Throughput"), ("phases", "Phases"), ("scaling", "Scaling"), ("runs", "Runs"),
       ("layers", "Layers"), ("model", "Model"), ("study", "Study tables"), ("failures", "Failures"),
       ("environment", "Environment"))

# The page's template (and its stylesheet, inlined by it): every value escaped unless marked safe.
TEMPLATES = Environment(loader=FileSystemLoader(Path(__file__).with_name("templates")), autoescape=True,
                        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                        keep_trailing_newline=True)


def render_html(out_dir: Path, frame: pd.DataFrame, meta: dict, built: dict[str, pd.DataFrame],
                made: dict[str, Path]) -> str:
    """The whole page as a string."""
    shown = shown_figures(made)
    spelled_out, left_out = verdict_views(built["verdict"])
    return TEMPLATES.get_template("report.html.j2").render(
        campaign=meta.get("campaign") or out_dir.resolve().name, header=header_view(out_dir, frame, meta),
        page_rows=PAGE_ROWS, nav=NAV, matrix=matrix_view(built["verdict"]), sweeps=sweeps_view(shown),
        noise=noise_view(frame, built["noise"]),
        verdicts=spelled_out, verdicts_left_out=left_out,
        table_sections=[table_section("throughput", built["throughput"], ["throughput", "iteration_spread"], shown),
                        table_section("phases", built["phases"], ["phases"], shown),
                        table_section("scaling", built["scaling"], ["scaling"], shown),
                        table_section("runs", built["runs"], [], shown)],
        layers=layers_view(built["layers"], shown), model=model_view(built, shown), study=study_view(frame, built),
        failures=failures_view(frame, built["failures"]), environment=environment_view(frame, meta))


def _drop_stale_figures(out_dir: Path, made: dict[str, Path]) -> None:
    """Remove figures an earlier build drew that have nothing to show now."""
    for name in figures.FIGURES:
        path = out_dir / "figures" / f"{name}.png"
        if name not in made and path.exists():
            path.unlink()


def with_traces(runs: pd.DataFrame, out_dir: Path) -> pd.DataFrame:
    """The runs table with each run's trace (analysis/trace.py) as a path relative to the
    report, where the run wrote one; no such column where no run did."""
    paths = [f"runs/{run_id}/{trace.TRACE_FILE}" for run_id in runs["run_id"]]
    found = [p if (out_dir / p).exists() else None for p in paths]
    if not any(found):  # a store without run folders (imported, or made elsewhere)
        return runs
    runs = runs.copy()  # the run id stays the last column, as the page's tools expect
    runs.insert(runs.columns.get_loc("run_id"), "trace", found)
    return runs


def build_report(out_dir: str | Path) -> Path:
    """Read the campaign's store, write tables, figures and report.html; return its path.

    Raises StoreError when `out_dir` has no result store.
    """
    out_dir = Path(out_dir)
    with ResultStore.for_campaign(out_dir, create=False) as store:
        try:  # predictions with the campaign's current calibration (stored for every run)
            for problem in trace.update_model_process(out_dir, refresh_predictions(store)):
                print(warning_line(problem), file=sys.stderr)
        except StoreError:
            pass  # a read-only store keeps the predictions it has
        frame = store.campaign_frame()
        meta = store.meta()
        calibrations = store.calibration_frame()
    built = {**tables.build_tables(frame, calibrations), "verdict": verdict.verdict_table(frame),
             "noise": noise.noise_table(frame),
             **tables.study_tables(frame)}
    built["runs"] = with_traces(built["runs"], out_dir)
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
