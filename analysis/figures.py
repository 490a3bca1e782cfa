"""The study's figures, drawn with seaborn/matplotlib on the Agg backend (no display needed).

Each function takes the runs frame of `ResultStore.runs_frame()` and a campaign folder,
writes one PNG (dpi 120) under ``<out_dir>/figures/`` and returns its path, or None when the
frame holds nothing it could plot (empty, only failed runs, no profile phases ...), so that
a report can be built from whatever a campaign has so far.  A figure has one panel per
model, device and per-worker batch; panel titles name the model and device.  A series is a
framework label (plus its mode where the label does not already say it), with the same
colour in every figure.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import textwrap
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis import tables  # noqa: E402
from analysis.units import UnitError, parse_bandwidth  # noqa: E402

DPI = 120
PANEL_SIZE = (6.4, 4.4)
FACET_KEYS = ["model", "device", "batch_per_worker"]
FIGURE_NAMES = ("throughput", "phases", "scaling", "bandwidth", "iteration_spread", "prediction", "timeline")
# Drawn only for campaigns that have what they show: `bandwidth` needs multi-node runs on
# emulated links (--cluster emulated --bandwidth); every other figure any campaign with a
# successful profiled run has.
OPTIONAL_FIGURES = frozenset({"bandwidth"})
TIMELINE_PANELS = 4


# --------------------------------------------------------------------------- helpers

def series_name(label, mode) -> str:
    """How a series is named in legends: the label, plus the mode unless the label says it."""
    label = "" if tables._missing(label) else str(label)
    if tables._missing(mode) or not str(mode) or str(mode).lower() in label.lower():
        return label or "?"
    return f"{label} ({mode})" if label else str(mode)


def _with_series(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(series=[series_name(lb, m) for lb, m in zip(table["framework_label"], table["mode"])])


def _palette(names) -> dict[str, tuple]:
    """Stable colours: the same series gets the same colour in every figure of a campaign."""
    names = sorted(set(names))
    return dict(zip(names, sns.color_palette("colorblind", max(len(names), 1))))


def _facets(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(panel title, rows) per model, device and per-worker batch."""
    panels = []
    several_batches = table.groupby(["model", "device"], dropna=False)["batch_per_worker"].nunique().max() > 1
    for (model, device, batch), rows in table.groupby(FACET_KEYS, dropna=False, sort=True):
        title = f"{model} on {device}"
        if several_batches and not tables._missing(batch):
            title += f", batch {batch}/worker"
        panels.append((title, rows))
    return panels


def _figure(n_panels: int):
    """A figure with one axes per panel, at most two per row."""
    cols = min(n_panels, 2)
    rows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL_SIZE[0] * cols, PANEL_SIZE[1] * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig, out_dir: str | Path, name: str, title: str) -> Path:
    return save_figure(fig, Path(out_dir) / "figures" / f"{name}.png", title)


def new_panels(n_panels: int):
    """(figure, axes): one axes per panel in the report's layout, for figures drawn outside
    this module (the what-if's) in the report's style."""
    return _figure(n_panels)


def save_figure(fig, path: str | Path, title: str) -> Path:
    """Title, lay out and write `fig` as the report's PNGs are written (dpi, white), close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, facecolor="white")  # tight_layout above: one draw, not two
    plt.close(fig)
    return path


def _wrap(text: str, width: int = 16) -> str:
    return "\n".join(textwrap.wrap(str(text), width)) or str(text)


def _workers(value) -> str:
    return "?" if tables._missing(value) else str(int(value))


# --------------------------------------------------------------------------- figures

def throughput_bars(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Images/s per framework side by side, one bar per world size (hue), a panel per model."""
    table = tables.throughput_table(frame)
    table = table[table["images_per_s"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table).assign(workers=lambda t: [_workers(w) for w in t["world_size"]])
    hue_order = sorted(table["workers"].unique(), key=lambda w: (w == "?", int(w) if w != "?" else 0))
    colors = dict(zip(hue_order, sns.color_palette("crest", len(hue_order))))
    panels = _facets(table)
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        order = sorted(rows["series"].unique())
        sns.barplot(data=rows, x="series", y="images_per_s", hue="workers", order=order,
                    hue_order=[w for w in hue_order if w in set(rows["workers"])], palette=colors,
                    errorbar=None, ax=ax)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.0f", fontsize=8, padding=2)
        ax.set_xticks(range(len(order)), [_wrap(s) for s in order])
        ax.set(title=title, xlabel="", ylabel="images / s (all workers)")
        ax.legend(title="workers", fontsize=9)
        ax.margins(y=0.12)
    return _save(fig, out_dir, "throughput", "Training throughput (higher is better)")


def phase_bars(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Stacked per-phase seconds per framework and world size (profile mode).

    A black bar marks the measured profile iteration time: where it is below the stack,
    that much communication was hidden behind backward.
    """
    table = tables.phase_table(frame)
    phase_cols = [c for c in table.columns if c.endswith("_s") and not c.endswith("_pred_s")
                  and c not in ("phase_sum_s", "profile_iter_s", "predicted_iter_s")]
    if table.empty or not phase_cols:
        return None
    table = _with_series(table)
    names = [c[: -len("_s")] for c in phase_cols]
    colors = dict(zip(names, sns.color_palette("Set2", len(names))))
    panels = _facets(table)
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        rows = rows.sort_values(["series", "world_size"])
        labels = [f"{_wrap(s, 14)}\nN={_workers(w)}" for s, w in zip(rows["series"], rows["world_size"])]
        x = range(len(rows))
        bottom = pd.Series(0.0, index=rows.index)
        for column, name in zip(phase_cols, names):
            values = pd.to_numeric(rows[column], errors="coerce").fillna(0.0).astype(float) * 1e3
            ax.bar(x, values, bottom=bottom, color=colors[name], label=name, width=0.7)
            bottom = bottom + values
        profile = pd.to_numeric(rows["profile_iter_s"], errors="coerce").astype(float) * 1e3
        if profile.notna().any():
            ax.scatter(x, profile, marker="_", s=900, linewidths=2.5, color="black", zorder=3,
                       label="iteration (profile)")
        ax.set_xticks(list(x), labels, fontsize=8, rotation=90 if len(rows) > 8 else 0)
        ax.set(title=title, xlabel="", ylabel="milliseconds per iteration")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        ax.margins(y=0.1)
    return _save(fig, out_dir, "phases", "Where an iteration's time goes (profile mode)")


def scaling_curves(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Speedup against workers, one line per framework/mode, ideal linear scaling dashed."""
    table = tables.scaling_table(frame)
    table = table[table["speedup"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table)
    colors = _palette(table["series"])
    panels = _facets(table)
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        workers = sorted(int(w) for w in rows["world_size"].dropna().unique())
        top = max(workers + [2])
        ax.plot([1, top], [1, top], linestyle="--", color="grey", linewidth=1.2, label="ideal (S = N)")
        for name, line in rows.sort_values("world_size").groupby("series", sort=True):
            ax.plot(line["world_size"].astype(float), line["speedup"].astype(float), marker="o",
                    color=colors[name], linewidth=2, label=name)
        ax.set_xticks(sorted(set(workers) | {1}))
        ax.set(title=title, xlabel="workers N", ylabel="speedup S(N) = N·t(1) / t(N)",
               xlim=(0.8, top + 0.2), ylim=(0, top + 0.3))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    return _save(fig, out_dir, "scaling", "Weak scaling (fixed per-worker batch)")


def _bandwidth_gbit(text) -> float:
    """'1Gbit' -> 1.0, '200Mbit' -> 0.2 (Gbit/s); NaN for an unshaped run."""
    if tables._missing(text) or not str(text).strip():
        return math.nan
    try:
        return parse_bandwidth(str(text)) * 8 / 1e9
    except UnitError:
        return math.nan


def bandwidth_curves(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Efficiency against the emulated link's bandwidth, one colour per scheme: measured
    (solid, filled) and the performance model's prediction (dashed, hollow) from the same
    one-worker baseline; one panel per model, device, batch and node count x workers."""
    table = tables.configs_with_speedup(frame)
    if table.empty or "bandwidth" not in table.columns:
        return None
    table = table.assign(gbit=[_bandwidth_gbit(b) for b in table["bandwidth"]])
    table = table[table["gbit"].notna() & table["efficiency"].notna()]
    if table.empty:
        return None
    predicted = tables.ok_runs(tables.prepare(frame))
    predicted = (predicted.assign(pred=pd.to_numeric(predicted.get("predicted_iter_time"), errors="coerce") * 1e3)
                 .groupby(tables.CONFIG_KEYS, dropna=False, sort=True)["pred"].median().reset_index())
    table = table.merge(predicted, on=tables.CONFIG_KEYS, how="left")
    table = table.assign(pred_efficiency=table["baseline_iter_ms"] / table["pred"])
    table = _with_series(table)
    colors = _palette(table["series"])
    panels = []
    for title, rows in _facets(table):
        for (nodes, world), sub in rows.groupby(["nodes", "world_size"], sort=True):
            panels.append((f"{title}, {int(nodes)} nodes x {int(world) // max(int(nodes), 1)}", sub))
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        for name, line in rows.sort_values("gbit").groupby("series", sort=True):
            x = line["gbit"].astype(float)
            ax.plot(x, line["efficiency"].astype(float), marker="o", color=colors[name], linewidth=2,
                    label=f"{name} measured")
            if line["pred_efficiency"].notna().any():
                ax.plot(x, line["pred_efficiency"].astype(float), marker="o", markerfacecolor="white",
                        linestyle="--", color=colors[name], linewidth=1.5, label=f"{name} predicted")
        ax.set_xscale("log")
        ax.set(title=title, xlabel="link bandwidth (Gbit/s, emulated)", ylabel="efficiency E = S / N",
               ylim=(0, max(1.05, float(rows[["efficiency", "pred_efficiency"]].max().max()) * 1.05)))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return _save(fig, out_dir, "bandwidth", "Efficiency against link bandwidth: measured and predicted")


def iteration_spread(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """Median iteration time as a point with p10-p90 error bars, per framework and world size."""
    table = tables.throughput_table(frame)
    table = table[table["iter_ms_median"].notna()] if len(table) else table
    if table.empty:
        return None
    table = _with_series(table)
    colors = _palette(table["series"])
    panels = _facets(table)
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        workers = sorted({_workers(w) for w in rows["world_size"]}, key=lambda w: (w == "?", len(w), w))
        position = {w: i for i, w in enumerate(workers)}
        names = sorted(rows["series"].unique())
        width = 0.6 / max(len(names), 1)
        for k, name in enumerate(names):
            line = rows[rows["series"] == name]
            x = [position[_workers(w)] - 0.3 + width * (k + 0.5) for w in line["world_size"]]
            median = line["iter_ms_median"].astype(float)
            low = (median - line["iter_ms_p10"].astype(float)).clip(lower=0).fillna(0)
            high = (line["iter_ms_p90"].astype(float) - median).clip(lower=0).fillna(0)
            ax.errorbar(x, median, yerr=[low, high], fmt="o", capsize=5, markersize=7,
                        color=colors[name], label=name)
        ax.set_xticks(range(len(workers)), workers)
        ax.set(title=title, xlabel="workers N", ylabel="iteration time (ms): median, p10–p90")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=9)
    return _save(fig, out_dir, "iteration_spread", "Iteration time and its spread (lower is better)")


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
    colors = _palette(ok["series"])
    panels = _facets(ok)
    fig, axes = _figure(len(panels))
    for ax, (title, rows) in zip(axes, panels):
        top = float(max(rows["predicted"].max(), rows["measured"].max())) * 1.1
        ax.fill_between([0, top], [0, top * 0.85], [0, top * 1.15], color="grey", alpha=0.12, label="±15 %")
        ax.plot([0, top], [0, top], linestyle="--", color="grey", linewidth=1.2, label="exact")
        for name, points in rows.groupby("series", sort=True):
            ax.scatter(points["measured"], points["predicted"], color=colors[name], s=50, label=name)
            if len(rows) <= 16:  # beyond that the labels would overlap (and cost their layout)
                for _, p in points.iterrows():
                    ax.annotate(f"N={_workers(p['world_size'])}", (p["measured"], p["predicted"]),
                                textcoords="offset points", xytext=(5, -10), fontsize=8)
        ax.set(title=title, xlabel="measured iteration time (ms)", ylabel="predicted iteration time (ms)",
               xlim=(0, top), ylim=(0, top))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    return _save(fig, out_dir, "prediction", "Performance model: predicted vs measured")


def _json_list(value) -> list:
    if isinstance(value, list):
        return value
    if tables._missing(value) or not str(value).strip():
        return []
    try:
        decoded = json.loads(value)
    except ValueError:
        return []
    return decoded if isinstance(decoded, list) else []


def timeline_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The runs the overlap timeline shows: successful multi-worker runs with a predicted
    schedule, of the model with most such runs, at its largest world size, one per series
    (framework and mode), at most `TIMELINE_PANELS`."""
    ok = tables.ok_runs(tables.prepare(frame))
    column = "extra_prediction_timeline_transfers"
    if ok.empty or column not in ok.columns:
        return ok.iloc[0:0]
    world = pd.to_numeric(ok["world_size"], errors="coerce")
    has_schedule = pd.Series([bool(_json_list(v)) for v in ok[column]], index=ok.index)
    ok = ok[(world > 1) & has_schedule]
    if ok.empty:
        return ok
    model = ok["model"].value_counts().index[0]
    ok = ok[ok["model"] == model]
    ok = ok[pd.to_numeric(ok["world_size"], errors="coerce") == pd.to_numeric(ok["world_size"], errors="coerce").max()]
    ok = _with_series(ok).sort_values(["series", "started_at"] if "started_at" in ok.columns else ["series"])
    return ok.groupby("series", sort=True).head(1).head(TIMELINE_PANELS)


def overlap_timeline(frame: pd.DataFrame, out_dir: str | Path) -> Path | None:
    """One predicted iteration per scheme: forward, backward layer by layer and, beneath it,
    the gradient transfers as the model schedules them (WFBP: a transfer starts when its
    gradient is final and the previous one has ended), then the update; the dashed line is
    the measured iteration time."""
    runs = timeline_runs(frame)
    if runs.empty:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.3 * len(runs) + 0.6), squeeze=False)
    layer_colors = sns.color_palette("Blues", 6)[2:]
    transfer_colors = sns.color_palette("Oranges", 6)[2:]
    for ax, (_, run) in zip(axes[:, 0], runs.iterrows()):
        layers = _json_list(run.get("extra_prediction_timeline_layers"))
        transfers = _json_list(run.get("extra_prediction_timeline_transfers"))
        start = float(run.get("extra_prediction_timeline_backward_start") or 0.0) * 1e3
        end = float(run.get("extra_prediction_timeline_iteration_end") or 0.0) * 1e3
        update = float(run.get("phase_update_pred_s") or 0.0) * 1e3
        ax.broken_barh([(0, start)], (2.1, 0.8), facecolors="#b8b8b8")
        ax.text(start / 2, 2.5, "I/O + forward", ha="center", va="center", fontsize=8)
        if layers:  # one call per row: hundreds of bars stay cheap to draw
            ax.broken_barh([(t0 * 1e3, (t1 - t0) * 1e3) for _, t0, t1 in layers], (2.1, 0.8),
                           facecolors=[layer_colors[k % len(layer_colors)] for k in range(len(layers))])
        for name, t0, t1 in sorted(layers, key=lambda item: item[2] - item[1], reverse=True)[:4]:
            if (t1 - t0) * 1e3 > 0.04 * max(end, 1e-9):
                ax.text((t0 + t1) / 2 * 1e3, 2.5, str(name), ha="center", va="center", fontsize=7)
        if transfers:
            ax.broken_barh([(t0 * 1e3, max((t1 - t0) * 1e3, end * 0.002)) for t0, t1, _, _ in transfers], (1.1, 0.8),
                           facecolors=[transfer_colors[k % len(transfer_colors)] for k in range(len(transfers))])
        if update > 0:
            ax.broken_barh([(end - update, update)], (2.1, 0.8), facecolors="#6a9955")
        measured = run.get("iter_time_median")
        if not tables._missing(measured):
            ax.axvline(float(measured) * 1e3, color="black", linestyle="--", linewidth=1.2)
            ax.text(float(measured) * 1e3, 3.05, " measured", fontsize=8, va="bottom")
        ax.set_yticks([1.5, 2.5], ["transfers", "compute"])
        ax.set_ylim(0.9, 3.4)
        ax.set_xlim(0, max(end, float(measured or 0) * 1e3) * 1.03)
        scheme = run.get("extra_prediction_scheme_name") or ""
        ax.set_title(f"{run['series']} — {run['model']}, {_workers(run['world_size'])} workers: {scheme} "
                     f"({len(transfers)} transfer{'' if len(transfers) == 1 else 's'}, "
                     f"{100 * float(run.get('extra_prediction_hidden_fraction') or 0):.0f}% "
                     "hidden)", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("milliseconds from the start of the iteration (predicted)")
    return _save(fig, out_dir, "timeline", "Overlap timeline of one iteration: backward per layer, transfers beneath")


FIGURES = {
    "throughput": throughput_bars,
    "phases": phase_bars,
    "scaling": scaling_curves,
    "bandwidth": bandwidth_curves,
    "iteration_spread": iteration_spread,
    "prediction": prediction_scatter,
    "timeline": overlap_timeline,
}


_SHARED_FRAME: pd.DataFrame | None = None  # what forked figure workers draw from


def _draw_shared(name: str, out_dir: str) -> str | None:
    path = FIGURES[name](_SHARED_FRAME, out_dir)
    return None if path is None else str(path)


def make_figures(frame: pd.DataFrame, out_dir: str | Path, workers: int | None = None) -> dict[str, Path]:
    """Every figure that has something to show, by name (see `FIGURES`).

    Figures are independent, so on a machine with several CPUs they are drawn by forked
    worker processes (one figure each; the frame is inherited, not copied through a pipe):
    matplotlib's text layout is the report's main cost.  `workers=1`, a platform without
    fork, or any failure of the pool draws them one after another in this process.
    """
    global _SHARED_FRAME
    workers = min(len(FIGURES), os.cpu_count() or 1) if workers is None else workers
    if workers > 1 and len(frame) and "fork" in multiprocessing.get_all_start_methods():
        _SHARED_FRAME = frame
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                futures = {name: pool.submit(_draw_shared, name, str(out_dir)) for name in FIGURES}
                drawn = {name: future.result() for name, future in futures.items()}
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

