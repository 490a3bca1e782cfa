"""The study's figures, drawn with seaborn/matplotlib on the Agg backend (no display needed).

Each function takes the runs frame of `ResultStore.runs_frame()` and a campaign folder,
writes one PNG (dpi 120) under ``<out_dir>/figures/`` and returns its path, or None when the
frame holds nothing it could plot (empty, only failed runs, no profile phases ...), so that
a report can be built from whatever a campaign has so far.  Beside each PNG,
``<name>.json`` lists the series drawn (name, colour, points) and what the figure left out:
what a reader or a test can check without decoding pixels.

A figure has one panel per model, device and per-worker batch (and, for the throughput bars,
per topology), at most `MAX_PANELS` of them (evenly chosen beyond it, said in the title), and
no side longer than `MAX_PX` pixels, whatever the campaign's size.  A topology is always
(nodes, workers per node), written ``1×2``: runs of different topologies are never averaged
together, and 1 node × 2 workers and 2 nodes × 1 worker are separate series.  Every scheme has the one colour `analysis.palette` gives it, in
every figure of every campaign; schemes are listed as horizontal bars, so that nine of them
stay readable.
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing
import os
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from PIL import Image  # noqa: E402 - matplotlib's own dependency

from analysis import tables, verdict  # noqa: E402
from analysis.overview import evenly  # noqa: E402
from analysis.palette import scheme_colour  # noqa: E402
from analysis.rendering import missing  # noqa: E402
from analysis.units import UnitError, parse_bandwidth, parse_latency  # noqa: E402
from core.cli import interrupts_held, leave_interrupts_to_the_parent  # noqa: E402

DPI = 120
PANEL_SIZE = (6.4, 4.4)
FACET_KEYS = ["model", "device", "batch_per_worker"]
TIMELINE_PANELS = 4
# Bounded at any campaign size: at most this many panels per figure (evenly chosen beyond it,
# the title says how many were left out) and never more pixels than this on either side.
MAX_PANELS = 12
MAX_PX = 4000
PALETTE_COLOURS = 256  # figures are written as palette PNGs
BAR_HEIGHT_IN = 0.34  # inches per horizontal bar
MAX_LAYER_LABELS = 40  # layer names written under the per-layer figure's axis, at most
VISIBLE_SHARE = 0.003  # a phase below this share of the longest stack everywhere is not in the legend
PHASE_COLOURS = dict(zip(("io", "h2d", "forward", "backward", "comm", "update"), sns.color_palette("Set2", 6)))
# Legends sit right of their panel, so that nine schemes never cover the data.
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "frameon": False}
# Line style and marker per node count in the scaling figure: one node solid, several dashed.
NODE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]


# --------------------------------------------------------------------------- helpers

series_name = tables.series_name


def _with_series(table: pd.DataFrame) -> pd.DataFrame:
    """The table with ``series`` (legend name), ``colour`` (the scheme's fixed colour) and
    ``topology`` ('1×2') columns."""
    table = table.copy()
    if "workers_per_node" not in table.columns:
        table["workers_per_node"] = pd.to_numeric(table["world_size"]) // pd.to_numeric(table["nodes"]).fillna(1)
    links = [tables.links_text(b, lat) for b, lat in zip(_column(table, "bandwidth"), _column(table, "latency"))]
    return table.assign(
        series=[series_name(lb, m) for lb, m in zip(table["framework_label"], table["mode"])],
        colour=[scheme_colour(f, m) for f, m in zip(table["framework"], table["mode"])],
        links=links,
        topology=[tables.topology_short(n, w) + (f" · {link}" if link else "")
                  for n, w, link in zip(table["nodes"], table["workers_per_node"], links)])


def _column(table: pd.DataFrame, name: str) -> pd.Series:
    return table[name] if name in table.columns else pd.Series([None] * len(table), index=table.index)


def _colours(table: pd.DataFrame) -> dict[str, str]:
    """series -> colour of a table made by `_with_series`."""
    return dict(zip(table["series"], table["colour"]))


def _topology_order(table: pd.DataFrame) -> list[str]:
    """Topologies (with their emulated links, a run on 1 Gbit/s and one on 10 Gbit/s being two)
    in numeric order: 1×1, 1×2, 1×4, 2×1 · 1Gbit, 2×1 · 10Gbit, 2×2 ..."""
    keys = {}
    for label, n, w, b, lat in zip(table["topology"], table["nodes"], table["workers_per_node"],
                                   _column(table, "bandwidth"), _column(table, "latency")):
        keys[label] = (1 if missing(n) else int(n), 0 if missing(w) else int(w),
                       0.0 if math.isnan(_bandwidth_gbit(b)) else _bandwidth_gbit(b),
                       0.0 if math.isnan(_latency_ms(lat)) else _latency_ms(lat))
    return sorted(keys, key=keys.get)


def topology_words(topology: str) -> str:
    """'1×2' -> '1 node × 2 workers'; '2×1 · 1Gbit 100us' -> '2 nodes × 1 worker, 1Gbit 100us'."""
    shape, _, links = topology.partition(" · ")
    nodes, _, workers = shape.partition("×")
    return (f"{nodes} node{'' if nodes == '1' else 's'} × "
            f"{workers} worker{'' if workers == '1' else 's'}" + (f", {links}" if links else ""))


def _facets(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(panel title, rows) per model, device and per-worker batch."""
    panels = []
    several_batches = table.groupby(["model", "device"], dropna=False)["batch_per_worker"].nunique().max() > 1
    for (model, device, batch), rows in table.groupby(FACET_KEYS, dropna=False, sort=True):
        title = f"{model} on {device}"
        if several_batches and not missing(batch):
            title += f", batch {batch}/worker"
        panels.append((title, rows))
    return panels


def _within_budget(panels: list) -> tuple[list, str]:
    """At most `MAX_PANELS` of `panels`, evenly chosen (the first and the last kept), and the
    note the figure's title carries about the rest ('' when all fit)."""
    kept = evenly(panels, MAX_PANELS)
    left_out = len(panels) - len(kept)
    return kept, (f"{len(kept)} of {len(panels)} panels, evenly chosen; the tables hold all" if left_out else "")


def _figure(n_panels: int, cols: int = 2, panel_size: tuple[float, float] = PANEL_SIZE):
    """A figure with one axes per panel, at most `cols` per row."""
    cols = max(1, min(n_panels, cols))
    rows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_size[0] * cols, panel_size[1] * rows), squeeze=False,
                             layout="constrained")
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig, out_dir: str | Path, name: str, title: str, series: list[dict] | None = None,
          note: str = "") -> Path:
    """Write the PNG (its title with `note`, where panels were left out) and its ``.json`` list
    of series; return the PNG's path."""
    folder = Path(out_dir) / "figures"
    path = save_figure(fig, folder / f"{name}.png", f"{title}\n({note})" if note else title)
    (folder / f"{name}.json").write_text(json.dumps({"series": series or [], "left_out": note}, default=float,
                                                    indent=1), encoding="utf-8")
    return path


def new_panels(n_panels: int):
    """(figure, axes): one axes per panel in the report's layout, for figures drawn outside
    this module (the what-if's) in the report's style."""
    return _figure(n_panels)


def save_figure(fig, path: str | Path, title: str) -> Path:
    """Title and write `fig` as the report's PNGs are written (dpi, white), and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    # however many panels, never more than MAX_PX on a side: a larger figure is drawn finer
    dpi = min(DPI, MAX_PX / max(fig.get_size_inches()))
    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=dpi, facecolor="white")  # constrained layout: laid out in this one draw
    plt.close(fig)
    with Image.open(drawn) as image:
        palette_image(image).save(path, format="PNG", optimize=True, dpi=(dpi, dpi))
    return path


def palette_image(image):
    """`image` in its `PALETTE_COLOURS` most frequent colours, each pixel the nearest of them:
    a chart's flat areas (bars, bands, the background) keep their exact colour, so a scheme's
    colour can still be found in the pixels, and the file is about a third of the RGB one."""
    rgb = image.convert("RGB")
    counted = sorted(rgb.getcolors(maxcolors=rgb.width * rgb.height), reverse=True)[:PALETTE_COLOURS]
    entries = [channel for _, colour in counted for channel in colour]
    palette = Image.new("P", (1, 1))
    palette.putpalette(entries + entries[:3] * (PALETTE_COLOURS - len(counted)))
    return rgb.quantize(palette=palette, dither=Image.Dither.NONE)


def _series_entry(name: str, colour, points) -> dict:
    """One drawn series for the sidecar: name, '#rrggbb' colour, [[x, y], ...]."""
    return {"name": name, "colour": matplotlib.colors.to_hex(colour),
            "points": [[x, None if missing(y) else float(y)] for x, y in points]}


def _wrap(text: str, width: int = 16) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _workers(value) -> str:
    return "?" if missing(value) else str(int(value))


def _scheme_legend(ax, colours: dict[str, str], **kwargs):
    """A legend with one colour patch per scheme."""
    handles = [Line2D([], [], color=c, linewidth=6, label=n) for n, c in colours.items()]
    return ax.legend(handles=handles, **kwargs)


# --------------------------------------------------------------------------- figures

def throughput_bars(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Images/s as horizontal bars, one per scheme (fastest on top, in its colour), one panel
    per model and topology; the panels of a model share their x axis."""
    table = tables.throughput_table(frame)
    table = table[table["images_per_s"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table)
    panels = []  # (facet index, title, rows)
    for index, (title, rows) in enumerate(_facets(table)):
        for topology in _topology_order(rows):
            panels.append((index, f"{title}\n{topology_words(topology)}", rows[rows["topology"] == topology]))
    panels, note = _within_budget(panels)
    cols = min(3, len(panels))
    most = max(len(rows) for _, _, rows in panels)
    fig, axes = _figure(len(panels), cols, (5.0, max(2.4, 1.2 + BAR_HEIGHT_IN * most)))
    limits = {index: float(rows["images_per_s"].max()) for index, _, rows in panels}
    for index, _, rows in panels:
        limits[index] = max(limits[index], float(rows["images_per_s"].max()))
    drawn = []
    for ax, (index, title, rows) in zip(axes, panels):
        rows = rows.sort_values("images_per_s", ascending=True)
        y = range(len(rows))
        bars = ax.barh(list(y), rows["images_per_s"], color=rows["colour"], height=0.7)
        ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
        ax.set_yticks(list(y), [_wrap(s, 22) for s in rows["series"]], fontsize=8)
        ax.set(title=title, xlabel="images / s (all workers)", xlim=(0, limits[index] * 1.18))
        ax.title.set_fontsize(10)
        ax.grid(axis="x", alpha=0.3)
        drawn += [_series_entry(f"{r['series']} · {r['topology']}", r["colour"], [[r["topology"], r["images_per_s"]]])
                  for _, r in rows.iterrows()]
    return _save(fig, out_dir, "throughput", "Training throughput (higher is better)", drawn, note)


def phase_bars(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Per scheme and topology, the profile's phases stacked (milliseconds, communication run
    after backward), the overlapped profile iteration as a black tick on the stack, and just
    below it a grey bar: the throughput-mode iteration, the time the other figures use."""
    table = tables.phase_table(frame)
    phase_cols = [c for c in table.columns if c.endswith("_ms") and not c.endswith("_pred_ms")
                  and c not in ("phase_sum_ms", "profile_iter_ms", "predicted_iter_ms", "iter_ms")]
    if table.empty or not phase_cols:
        return None
    # a phase too short to see anywhere (h2d on a CPU, comm with one worker) stays out of the legend
    largest = pd.to_numeric(table["phase_sum_ms"], errors="coerce").max()
    visible = {c for c in phase_cols
               if pd.to_numeric(table[c], errors="coerce").fillna(0).abs().max() > VISIBLE_SHARE * largest}
    table = _with_series(table)
    panels, note = _within_budget(_facets(table))
    most = max(len(rows) for _, rows in panels)
    fig, axes = _figure(len(panels), 1, (11.0, 1.6 + 0.5 * most))
    for ax, (title, rows) in zip(axes, panels):
        order = {t: i for i, t in enumerate(_topology_order(rows))}
        rows = rows.assign(_t=[order[t] for t in rows["topology"]]).sort_values(["_t", "series"], ascending=False)
        y = list(range(len(rows)))
        left = pd.Series(0.0, index=rows.index)
        for column in phase_cols:
            name = column[: -len("_ms")]
            values = pd.to_numeric(rows[column], errors="coerce").fillna(0.0).astype(float)
            ax.barh(y, values, left=left, color=PHASE_COLOURS.get(name, "#999999"), height=0.5,
                    label=name if column in visible else "_nolegend_")
            left = left + values
        below = [v - 0.36 for v in y]
        ax.barh(below, pd.to_numeric(rows["iter_ms"], errors="coerce"), height=0.16, color="#4d4d4d",
                label="iteration, throughput mode")
        profile = pd.to_numeric(rows["profile_iter_ms"], errors="coerce")
        if profile.notna().any():
            ax.scatter(profile, y, marker="|", s=420, linewidths=2.5, color="black", zorder=3,
                       label="iteration, profile (overlapped)")
        labels = [f"{s}  ·  {t}" for s, t in zip(rows["series"], rows["topology"])]
        ax.set_yticks(y, labels, fontsize=8)
        for tick, colour in zip(ax.get_yticklabels(), rows["colour"]):
            tick.set_color(colour)
        ax.set(title=title, xlabel="milliseconds per iteration", ylim=(-0.7, len(rows) - 0.4))
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=8, **OUTSIDE)
    drawn = [_series_entry(f"{r['series']} · {r['topology']}", r["colour"],
                           [[c[: -len("_ms")], r[c]] for c in phase_cols] + [["iteration", r["iter_ms"]]])
             for _, rows in panels for _, r in rows.iterrows()]
    return _save(fig, out_dir, "phases", "Where an iteration's time goes (profile mode) and the iteration itself",
                 drawn, note)


def scaling_curves(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Speedup against the number of workers: one line per scheme (its colour) and node count
    (solid: one node, dashed and other markers: several), so 1 node × 2 workers and 2 nodes ×
    1 worker are two points on two lines; ideal linear scaling dashed grey."""
    table = tables.scaling_table(frame)
    table = table[table["speedup"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table)
    colours = _colours(table)
    node_counts = sorted({int(n) for n in table["nodes"]})
    styles = {n: NODE_STYLES[min(i, len(NODE_STYLES) - 1)] for i, n in enumerate(node_counts)}
    panels, note = _within_budget(_facets(table))
    fig, axes = _figure(len(panels))
    drawn = []
    for ax, (title, rows) in zip(axes, panels):
        workers = sorted(int(w) for w in rows["world_size"].dropna().unique())
        top = max(workers + [2])
        ceiling = 1.5 * top  # a wildly superlinear point (a slow baseline) must not flatten the rest
        ax.plot([1, top], [1, top], linestyle="--", color="grey", linewidth=1.2)
        for (name, nodes, links), line in rows.sort_values("world_size").groupby(["series", "nodes", "links"],
                                                                                 sort=True):
            style, marker = styles[int(nodes)]
            speedup = line["speedup"].astype(float)
            ax.plot(line["world_size"].astype(float), speedup.clip(upper=ceiling), marker=marker,
                    linestyle=style, color=colours[name], linewidth=2, markersize=7)
            for world, value in zip(line["world_size"], speedup):
                if value > ceiling:
                    ax.annotate(f"S = {value:.1f} ↑", (float(world), ceiling), textcoords="offset points",
                                xytext=(6, -12), fontsize=8, color=colours[name])
            nodes_text = f"{int(nodes)} node{'' if int(nodes) == 1 else 's'}" + (f" {links}" if links else "")
            drawn.append(_series_entry(f"{name} · {nodes_text}", colours[name],
                                       [[int(w), s] for w, s in zip(line["world_size"], line["speedup"])]))
        ax.set_xticks(sorted(set(workers) | {1}))
        ax.set(title=title, xlabel="workers N (all nodes)", ylabel="speedup S(N) = N·t(1) / t(N)",
               xlim=(0.8, top + 0.2), ylim=(0, max(top + 0.3, min(ceiling, rows["speedup"].max()) * 1.05)))
        ax.grid(alpha=0.3)
        nodes_here = sorted({int(n) for n in rows["nodes"]})
        topology = ax.legend(handles=[Line2D([], [], color="black", linestyle=styles[n][0], marker=styles[n][1],
                                             label=f"{n} node{'' if n == 1 else 's'}") for n in nodes_here]
                             + [Line2D([], [], color="grey", linestyle="--", label="ideal (S = N)")],
                             fontsize=8, title="topology", title_fontsize=8, loc="lower left",
                             bbox_to_anchor=(1.01, 0.0), frameon=False)
        ax.add_artist(topology)
        _scheme_legend(ax, {n: colours[n] for n in sorted(rows["series"].unique())}, fontsize=8,
                       title="scheme", title_fontsize=8, **OUTSIDE)
    return _save(fig, out_dir, "scaling", "Weak scaling (fixed per-worker batch)", drawn, note)


# --------------------------------------------------------------------------- sweeps

@dataclass(frozen=True)
class Sweep:
    """A numeric dimension a campaign can sweep, drawn as an x axis."""

    column: str  # the verdict table's column
    axis: str  # the x axis label
    min_values: int  # fewer distinct values than this: the bars and the matrix show it
    log: bool  # a log x axis (links span decades)
    implied: tuple[str, ...] = ()  # columns the x value and the facet fix between them


# Workers and nodes need three values: with two, the scaling figure and the bars show them.
SWEEPS: dict[str, Sweep] = {
    "batch": Sweep("batch_per_worker", "per-worker batch", 2, False),
    "workers": Sweep("world_size", "workers N (all nodes)", 3, False, ("workers_per_node",)),
    "nodes": Sweep("nodes", "nodes", 3, False, ("world_size",)),
    "bandwidth": Sweep("bandwidth", "link bandwidth (Gbit/s, emulated)", 2, True),
    "latency": Sweep("latency", "link latency (ms, emulated)", 2, True),
}
# What a column of a sweep figure may be split by: the swept dimensions the x axis leaves.
# (The number of workers is the topology's nodes × workers per node, or the x axis itself.)
SWEPT_COLUMNS = ("batch_per_worker", "nodes", "workers_per_node", "bandwidth", "latency")
SWEEP_METRICS = (("images_per_s", "images / s (all workers)"), ("efficiency", "efficiency E = S / N"),
                 ("comm_ms", "exposed communication (ms)"))
SWEEP_PANEL = (4.6, 3.1)


def _bandwidth_gbit(text) -> float:
    """'1Gbit' -> 1.0, '200Mbit' -> 0.2 (Gbit/s); NaN for an unshaped run."""
    if missing(text) or not str(text).strip():
        return math.nan
    try:
        return parse_bandwidth(str(text)) * 8 / 1e9
    except UnitError:
        return math.nan


def _latency_ms(text) -> float:
    """'5ms' -> 5.0, '200us' -> 0.2; NaN for an unshaped run."""
    if missing(text) or not str(text).strip():
        return math.nan
    try:
        return parse_latency(str(text)) * 1e3
    except UnitError:
        return math.nan


def _sweep_x(column: str, values: pd.Series) -> pd.Series:
    """The x value of each row: links as numbers, missing where a run was not shaped."""
    if column == "bandwidth":
        return values.map(_bandwidth_gbit)
    if column == "latency":
        return values.map(_latency_ms)
    return pd.to_numeric(values, errors="coerce")


def sweep_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The verdict table (one row per configuration) with what a sweep figure draws: the band
    of throughput and efficiency (their interval over launches, `analysis.noise`; the p10-p90
    of the repeats where a configuration ran in one launch), and the model's prediction of the
    three."""
    table = verdict.verdict_table(frame)
    if table.empty:
        return table
    iter_ms, p10, p90 = (pd.to_numeric(table[c], errors="coerce") for c in ("iter_ms", "iter_ms_p10", "iter_ms_p90"))
    predicted = pd.to_numeric(table["predicted_iter_ms"], errors="coerce")
    one_worker = pd.to_numeric(table["world_size"], errors="coerce") == 1
    baseline = pd.to_numeric(table["baseline_iter_ms"], errors="coerce").where(~one_worker, iter_ms)
    throughput = pd.to_numeric(table["images_per_s"], errors="coerce")
    efficiency = pd.to_numeric(table["efficiency"], errors="coerce").where(~one_worker, 1.0)
    images = throughput * iter_ms  # images per iteration (× 1000): the global batch, whatever the time
    return _with_series(table.assign(
        images_per_s=throughput, efficiency=efficiency, comm_ms=pd.to_numeric(table["comm_ms"], errors="coerce"),
        images_per_s_low=_band(table, "images_per_s_low", throughput * iter_ms / p90),
        images_per_s_high=_band(table, "images_per_s_high", throughput * iter_ms / p10),
        efficiency_low=_band(table, "efficiency_low", efficiency * iter_ms / p90),
        efficiency_high=_band(table, "efficiency_high", efficiency * iter_ms / p10),
        images_per_s_pred=images / predicted, efficiency_pred=baseline / predicted,
        comm_ms_pred=pd.to_numeric(table["comm_model_ms"], errors="coerce")))


def _band(table: pd.DataFrame, column: str, within_launch: pd.Series) -> pd.Series:
    """The verdict's interval over launches where it has one, else the within-launch band."""
    between = pd.to_numeric(table[column], errors="coerce")
    return between.where(between.notna(), within_launch)


def swept(table: pd.DataFrame) -> list[str]:
    """The `SWEEPS` the campaign swept: a dimension with at least its `min_values` distinct
    values within one model, device and combination of the other dimensions."""
    found = []
    for name, sweep in SWEEPS.items():
        x = _sweep_x(sweep.column, table[sweep.column])
        rest = _facet_columns(table, sweep)
        counts = table.assign(_x=x).dropna(subset=["_x"]).groupby(["model", "device", *rest], dropna=False)["_x"]
        if x.notna().any() and counts.nunique().max() >= sweep.min_values:
            found.append(name)
    return found


def _facet_columns(table: pd.DataFrame, sweep: Sweep) -> list[str]:
    """The swept columns the x axis leaves that vary in `table`: a column of panels each."""
    left = [c for c in SWEPT_COLUMNS if c != sweep.column and c not in sweep.implied]
    return [c for c in left if table[c].astype(str).nunique() > 1]


def _facet_title(model, device, columns: list[str], values: tuple) -> str:
    parts = [f"{model} on {device}"]
    for column, value in zip(columns, values):
        if column == "batch_per_worker":
            parts.append(f"batch {_workers(value)}/worker")
        elif column == "nodes":
            parts.append(f"{_workers(value)} node{'' if str(value) == '1' else 's'}")
        elif column == "workers_per_node":
            parts.append(f"{_workers(value)} worker{'' if str(value) == '1' else 's'}/node")
        elif missing(value) or not str(value):
            parts.append(f"{column} unshaped")
        else:
            parts.append(str(value))
    if "bandwidth unshaped" in parts and "latency unshaped" in parts:
        parts = [p for p in parts if p not in ("bandwidth unshaped", "latency unshaped")] + ["no emulated link"]
    return "\n".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]


def _scheme_difference(rows: pd.DataFrame) -> float:
    """How far apart the schemes are in a facet: the median over x of fastest / slowest."""
    spread = rows.groupby("_x")["images_per_s"].agg(lambda v: v.max() / v.min() if v.min() > 0 else math.nan)
    return float(spread.median()) if spread.notna().any() else 0.0


def _sweep_facets(table: pd.DataFrame, sweep: Sweep) -> tuple[list[tuple[str, pd.DataFrame]], str]:
    """(title, rows) per column of panels, at most `MAX_PANELS` // 3 of them: beyond it those
    where the schemes differ most, in their own order; and the note on what was left out."""
    columns = _facet_columns(table, sweep)
    keys = ["model", "device", *columns]
    facets = [(_facet_title(key[0], key[1], columns, key[2:]), rows)
              for key, rows in table.groupby(keys, dropna=False, sort=True) if rows["_x"].nunique() >= 2]
    budget = MAX_PANELS // len(SWEEP_METRICS)
    if len(facets) <= budget:
        return facets, ""
    ranked = sorted(range(len(facets)), key=lambda i: -_scheme_difference(facets[i][1]))[:budget]
    return ([facets[i] for i in sorted(ranked)],
            f"{budget} of {len(facets)} columns: where the schemes differ most; the tables hold all")


def sweep_lines(frame: pd.DataFrame, out_dir: str | Path, dimension: str) -> Path | None:
    """Throughput, efficiency and exposed communication (rows of panels) against a swept
    dimension: one line per scheme in its colour with its band (`sweep_table`), the model's
    prediction dashed with hollow markers; one column of panels per combination of the
    dimensions left.  None where the campaign did not sweep `dimension` (see `swept`)."""
    sweep = SWEEPS[dimension]
    table = sweep_table(frame)
    if table.empty or dimension not in swept(table):
        return None
    table = table.assign(_x=_sweep_x(sweep.column, table[sweep.column])).dropna(subset=["_x"])
    facets, note = _sweep_facets(table, sweep)
    colours = _colours(table)
    fig, grid = plt.subplots(len(SWEEP_METRICS), len(facets), squeeze=False, layout="constrained",
                             figsize=(SWEEP_PANEL[0] * len(facets) + 2.2, SWEEP_PANEL[1] * len(SWEEP_METRICS)))
    drawn = []
    for col, (title, rows) in enumerate(facets):
        for row, (metric, label) in enumerate(SWEEP_METRICS):
            ax = grid[row, col]
            drawn += _sweep_panel(ax, rows, metric, colours, title)
            ax.set(xlabel=sweep.axis if row == len(SWEEP_METRICS) - 1 else "", ylabel=label if col == 0 else "")
            if row == 0:
                ax.set_title(title, fontsize=9)
            _sweep_axis(ax, sorted(rows["_x"].unique()), sweep.log)
    _scheme_legend(grid[0, -1], {n: colours[n] for n in sorted(colours)}, fontsize=8, title="scheme",
                   title_fontsize=8, **OUTSIDE)
    grid[1, -1].legend(handles=[Line2D([], [], color="black", marker="o", label="measured (band: interval over launches)"),
                                Line2D([], [], color="black", marker="o", markerfacecolor="white", linestyle="--",
                                       label="predicted by the model")], fontsize=8, **OUTSIDE)
    return _save(fig, out_dir, f"sweep_{dimension}", f"Against {sweep.axis}: measured and predicted", drawn, note)


def _sweep_panel(ax, rows: pd.DataFrame, metric: str, colours: dict[str, str], facet: str) -> list[dict]:
    """One metric of one facet: per scheme its measured line and band and its prediction."""
    drawn = []
    for name, line in rows.sort_values("_x").groupby("series", sort=True):
        x = line["_x"].astype(float)
        colour = colours[name]
        ax.plot(x, line[metric], marker="o", markersize=4, linewidth=1.8, color=colour)
        if f"{metric}_low" in line.columns:
            ax.fill_between(x, line[f"{metric}_low"], line[f"{metric}_high"], color=colour, alpha=0.15, linewidth=0)
        drawn.append({**_series_entry(f"{name} · {facet} · {metric}", colour, zip(x, line[metric])),
                      "scheme": name, "facet": facet, "metric": metric, "kind": "measured"})
        predicted = line[f"{metric}_pred"]
        if predicted.notna().any():
            ax.plot(x, predicted, marker="o", markersize=4, markerfacecolor="white", linestyle="--", linewidth=1.2,
                    color=colour)
            drawn.append({**_series_entry(f"{name} · {facet} · {metric} predicted", colour, zip(x, predicted)),
                          "scheme": name, "facet": facet, "metric": metric, "kind": "predicted"})
    # nothing to show (one worker's exchange, a rounding error of the model's): a plain 0–1 axis
    largest = pd.concat([rows[metric], rows[f"{metric}_pred"]]).abs().max()
    ax.set_ylim(0, 1) if missing(largest) or largest < 1e-6 else ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")
    return drawn


def _sweep_axis(ax, values: list[float], log: bool) -> None:
    """A log axis for links, and for a batch or worker count spanning more than 8×; the swept
    values as ticks while there are few enough to read."""
    if log or (values[0] > 0 and values[-1] / values[0] > 8):
        ax.set_xscale("log", base=10 if log else 2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    if len(values) <= 10:
        ax.set_xticks(values, [f"{v:g}" for v in values], fontsize=8)
        ax.minorticks_off()


def iteration_spread(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Median iteration time as a point with p10-p90 error bars, per scheme (its colour), at
    each topology."""
    table = tables.throughput_table(frame)
    table = table[table["iter_ms_median"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table)
    colours = _colours(table)
    panels, note = _within_budget(_facets(table))
    fig, axes = _figure(len(panels))
    drawn = []
    for ax, (title, rows) in zip(axes, panels):
        topologies = _topology_order(rows)
        position = {t: i for i, t in enumerate(topologies)}
        names = sorted(rows["series"].unique())
        width = 0.7 / max(len(names), 1)
        for k, name in enumerate(names):
            line = rows[rows["series"] == name]
            x = [position[t] - 0.35 + width * (k + 0.5) for t in line["topology"]]
            median = line["iter_ms_median"].astype(float)
            low = (median - line["iter_ms_p10"].astype(float)).clip(lower=0).fillna(0)
            high = (line["iter_ms_p90"].astype(float) - median).clip(lower=0).fillna(0)
            ax.errorbar(x, median, yerr=[low, high], fmt="o", capsize=4, markersize=6,
                        color=colours[name], label=name)
            drawn.append(_series_entry(name, colours[name], zip(line["topology"], median)))
        ax.set_xticks(range(len(topologies)), [topology_words(t).replace(" × ", "\n× ") for t in topologies],
                      fontsize=8)
        ax.set(title=title, xlabel="", ylabel="iteration time (ms): median, p10–p90")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, **OUTSIDE)
    return _save(fig, out_dir, "iteration_spread", "Iteration time and its spread (lower is better)", drawn, note)


def prediction_scatter(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Model-predicted against measured iteration time; points on the diagonal are exact."""
    ok = tables.ok_runs(tables.prepare(frame))
    if ok.empty or "predicted_iter_time" not in ok.columns:
        return None
    ok = ok.assign(predicted=pd.to_numeric(ok["predicted_iter_time"], errors="coerce") * 1e3,
                   measured=ok["iter_time_median"] * 1e3)
    ok = ok[ok["predicted"].notna() & ok["measured"].notna()]
    if ok.empty:
        return None
    # one point per configuration (median over repeated runs)
    ok = (ok.groupby(tables.CONFIG_KEYS, dropna=False, sort=True)[["measured", "predicted"]].median().reset_index())
    ok = _with_series(ok)
    colours = _colours(ok)
    panels, note = _within_budget(_facets(ok))
    fig, axes = _figure(len(panels))
    drawn = []
    for ax, (title, rows) in zip(axes, panels):
        top = float(max(rows["predicted"].max(), rows["measured"].max())) * 1.1
        ax.fill_between([0, top], [0, top * 0.85], [0, top * 1.15], color="grey", alpha=0.12, label="±15 %")
        ax.plot([0, top], [0, top], linestyle="--", color="grey", linewidth=1.2, label="exact")
        for name, points in rows.groupby("series", sort=True):
            ax.scatter(points["measured"], points["predicted"], color=colours[name], s=50, label=name)
            drawn.append(_series_entry(name, colours[name], zip(points["measured"], points["predicted"])))
            if len(rows) <= 16:  # beyond that the labels would overlap (and cost their layout)
                for _, p in points.iterrows():
                    ax.annotate(p["topology"], (p["measured"], p["predicted"]),
                                textcoords="offset points", xytext=(5, -10), fontsize=8)
        ax.set(title=title, xlabel="measured iteration time (ms)", ylabel="predicted iteration time (ms)",
               xlim=(0, top), ylim=(0, top))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, **OUTSIDE)
    return _save(fig, out_dir, "prediction", "Performance model: predicted vs measured (labels: nodes × workers)",
                 drawn, note)


def timeline_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs the overlap timeline shows: successful multi-worker runs with a predicted
    schedule, of the model with most such runs, at its largest topology (most workers, then
    most nodes), one per series (framework and mode), at most `TIMELINE_PANELS`."""
    ok = tables.ok_runs(tables.prepare(frame))
    column = "extra_prediction_timeline_transfers"
    if ok.empty or column not in ok.columns:
        return ok.iloc[0:0]
    world = pd.to_numeric(ok["world_size"], errors="coerce")
    has_schedule = pd.Series([bool(tables.json_list(v)) for v in ok[column]], index=ok.index)
    ok = ok[(world > 1) & has_schedule]
    if ok.empty:
        return ok
    model = ok["model"].value_counts().index[0]
    ok = _with_series(ok[ok["model"] == model])
    size = [(float(w), float(n)) for w, n in zip(ok["world_size"], ok["nodes"])]
    ok = ok[[s == max(size) for s in size]]
    ok = ok.sort_values(["series", "started_at"] if "started_at" in ok.columns else ["series"])
    return ok.groupby("series", sort=True).head(1).head(TIMELINE_PANELS)


def overlap_timeline(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """One predicted iteration per scheme: forward, backward layer by layer and, beneath it,
    the gradient transfers as the model schedules them (WFBP: a transfer starts when its
    gradient is final and the previous one has ended), then the update; the dashed line is
    the measured iteration time."""
    runs = timeline_runs(frame)
    if runs.empty:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.1 * len(runs) + 0.7), squeeze=False, layout="constrained")
    layer_colors = sns.color_palette("Blues", 6)[2:]
    transfer_colors = sns.color_palette("Oranges", 6)[2:]
    drawn = []
    for ax, (_, run) in zip(axes[:, 0], runs.iterrows()):
        layers = tables.json_list(run.get("extra_prediction_timeline_layers"))
        transfers = tables.json_list(run.get("extra_prediction_timeline_transfers"))
        start = float(run.get("extra_prediction_timeline_backward_start") or 0.0) * 1e3
        end = float(run.get("extra_prediction_timeline_iteration_end") or 0.0) * 1e3
        update = float(run.get("phase_update_pred_s") or 0.0) * 1e3
        ax.broken_barh([(0, start)], (2.1, 0.8), facecolors="#b8b8b8")
        ax.text(start / 2, 2.5, "I/O + forward", ha="center", va="center", fontsize=10)
        if layers:  # one call per row: hundreds of bars stay cheap to draw
            ax.broken_barh([(t0 * 1e3, (t1 - t0) * 1e3) for _, t0, t1 in layers], (2.1, 0.8),
                           facecolors=[layer_colors[k % len(layer_colors)] for k in range(len(layers))])
        for name, t0, t1 in sorted(layers, key=lambda item: item[2] - item[1], reverse=True)[:4]:
            if (t1 - t0) * 1e3 > 0.05 * max(end, 1e-9):
                ax.text((t0 + t1) / 2 * 1e3, 2.5, str(name), ha="center", va="center", fontsize=9)
        if transfers:
            ax.broken_barh([(t0 * 1e3, max((t1 - t0) * 1e3, end * 0.002)) for t0, t1, _, _ in transfers], (1.1, 0.8),
                           facecolors=[transfer_colors[k % len(transfer_colors)] for k in range(len(transfers))])
        if update > 0:
            ax.broken_barh([(end - update, update)], (2.1, 0.8), facecolors="#6a9955")
        measured = run.get("iter_time_median")
        if not missing(measured):
            ax.axvline(float(measured) * 1e3, color="black", linestyle="--", linewidth=1.2)
            ax.text(float(measured) * 1e3, 3.05, " measured", fontsize=9, va="bottom")
        ax.set_yticks([1.5, 2.5], ["transfers", "compute"], fontsize=10)
        ax.set_ylim(0.9, 3.4)
        ax.set_xlim(0, max(end, float(measured or 0) * 1e3) * 1.03)
        scheme = run.get("extra_prediction_scheme_name") or ""
        ax.set_title(f"{run['series']} — {run['model']}, {topology_words(run['topology'])}: {scheme} "
                     f"({len(transfers)} transfer{'' if len(transfers) == 1 else 's'}, "
                     f"{100 * float(run.get('extra_prediction_hidden_fraction') or 0):.0f}% "
                     "hidden)", fontsize=11, loc="left", color=run["colour"])
        ax.grid(axis="x", alpha=0.3)
        drawn.append(_series_entry(f"{run['series']} · {run['topology']}", run["colour"],
                                   [["iteration_end_ms", end], ["measured_ms", float(measured or 0) * 1e3]]))
    axes[-1, 0].set_xlabel("milliseconds from the start of the iteration (predicted)", fontsize=10)
    return _save(fig, out_dir, "timeline", "Overlap timeline of one iteration: backward per layer, transfers beneath",
                 drawn)


def layer_lines(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Backward milliseconds per layer with parameters (backward order, left to right), one
    panel per model: each scheme at its smallest topology (solid) and, where it ran more, at
    its largest (dashed): compute slowed by workers sharing the machine shows as a gap."""
    table = tables.layer_table(frame)
    if table.empty:
        return None
    table = _with_series(table)
    models = sorted(table["model"].unique())
    most = max(table.groupby("model")["layer"].nunique())
    fig, axes = _figure(len(models), 1, (max(9.0, 0.17 * most + 3), 4.8))
    drawn = []
    for ax, model in zip(axes, models):
        rows = table[table["model"] == model]
        layers = rows.drop_duplicates("layer").sort_values("order")["layer"].tolist()
        position = {layer: i for i, layer in enumerate(layers)}
        for name, scheme in rows.groupby("series", sort=True):
            order = _topology_order(scheme)
            for topology, style in ((order[0], "-"), (order[-1], "--")) if len(order) > 1 else ((order[0], "-"),):
                line = scheme[scheme["topology"] == topology].sort_values("order")
                ax.plot([position[x] for x in line["layer"]], line["backward_ms"], linestyle=style, marker=".",
                        color=line["colour"].iloc[0], linewidth=1.6, label=f"{name} · {topology}")
                drawn.append(_series_entry(f"{name} · {topology}", line["colour"].iloc[0],
                                           zip(line["layer"], line["backward_ms"])))
        every = math.ceil(len(layers) / MAX_LAYER_LABELS)  # the names of all are in the layers table
        ax.set_xticks(range(0, len(layers), every), layers[::every], rotation=90, fontsize=7)
        ax.set(title=f"{model}: backward per layer (first computed on the left)", ylabel="milliseconds",
               xlim=(-0.5, len(layers) - 0.5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, **OUTSIDE)
    return _save(fig, out_dir, "layers", "Backward time per layer", drawn)


FIGURES = {
    "throughput": throughput_bars,
    "phases": phase_bars,
    "scaling": scaling_curves,
    "iteration_spread": iteration_spread,
    "prediction": prediction_scatter,
    "timeline": overlap_timeline,
    "layers": layer_lines,
    **{f"sweep_{name}": partial(sweep_lines, dimension=name) for name in SWEEPS},
}
# Drawn only for the campaigns that have what they show: a sweep figure for each dimension the
# campaign swept; every other figure any campaign with a successful profiled run has.
OPTIONAL_FIGURES = frozenset(f"sweep_{name}" for name in SWEEPS)


_SHARED_FRAME: pd.DataFrame | None = None  # what forked figure workers draw from


def _draw_shared(name: str, out_dir: str) -> str | None:
    path = FIGURES[name](_SHARED_FRAME, out_dir)
    return None if path is None else str(path)


def make_figures(frame: pd.DataFrame, out_dir: str | Path, workers: int | None = None) -> dict[str, Path]:
    """Every figure that has something to show, by name (see `FIGURES`).

    Figures are independent, so on a machine with several CPUs they are drawn by forked
    worker processes (one figure each; the frame is inherited, not copied through a pipe):
    matplotlib's text layout is the report's main cost.  `workers=1`, a platform without
    fork, or any failure of the pool draws them one after another in this process. The
    workers leave Ctrl-C to this process, which stops the pool and passes it on.
    """
    global _SHARED_FRAME
    workers = min(len(FIGURES), os.cpu_count() or 1) if workers is None else workers
    if workers > 1 and len(frame) and "fork" in multiprocessing.get_all_start_methods():
        _SHARED_FRAME = frame
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                     initializer=leave_interrupts_to_the_parent) as pool:
                try:
                    with interrupts_held():  # the pool forks its workers on the first submit
                        futures = {name: pool.submit(_draw_shared, name, str(out_dir))
                                   for name in FIGURES}
                    drawn = {name: future.result() for name, future in futures.items()}
                except BaseException:  # Ctrl-C: wait only for the figures being drawn
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
            return {name: Path(path) for name, path in drawn.items() if path is not None}
        except Exception:  # noqa: BLE001 - fall back to drawing here
            pass
        finally:
            _SHARED_FRAME = None
    made = {}
    for name, draw in FIGURES.items():
        path = draw(frame, out_dir)
        if path is not None:
            made[name] = path
    return made

