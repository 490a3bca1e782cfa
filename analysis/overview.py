"""The campaign at one glance, whatever its size: the verdict matrix, and the `--where` filter
that narrows a campaign to the part a user asks about.

`verdict_matrix(table)` lays the verdict table (`analysis.verdict.verdict_table`) out as one
grid per model and device: one cell per topology, the cell naming the winning scheme, its
margin over the runner-up, whether the win is beyond the between-launch noise, and the scheme the
performance model predicted to win.  Of the topology's swept dimensions, the topology
(nodes × workers per node) is one axis and the rest (per-worker batch, emulated bandwidth and
latency) the other; the axis with more values runs down, so a sweep of 200 batch sizes is 200
rows, not 200 columns.  A grid larger than its budget keeps evenly spaced rows and columns (the
first and the last always) and says how many it left out, so that the overview of any campaign
fits one screen; the rest is reached with a filter.

`where(frame, text)` keeps the runs matching ``dim=value[,dim=value...]``; an unknown
dimension, or a value no run has, is a `FilterError` naming what exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import tables, verdict
from analysis.rendering import missing
from analysis.units import UnitError, parse_bandwidth, parse_latency
from core.cli import listed

# The dimensions a filter may name: the user's word -> the runs frame's column.
DIMENSIONS: dict[str, str] = {
    "model": "model", "device": "device", "batch": "batch_per_worker", "nodes": "nodes",
    "workers": "workers_per_node", "world": "world_size", "bandwidth": "bandwidth", "latency": "latency",
    "framework": "framework", "mode": "mode", "scheme": "series", "status": "status"}
# The topology's own axis, and the dimensions that make up the other one (TOPOLOGY_KEYS less
# model and device, which get a grid each).
TOPOLOGY_AXIS = ("nodes", "workers_per_node")
OTHER_AXIS = ("batch_per_worker", "bandwidth", "latency")
# A cell's clear mark, and the key that explains the marks wherever the matrix is drawn.
CLEAR_MARKS = {True: "✓", False: "~", None: "?"}
MATRIX_KEY = ("winner, margin over the runner-up, ✓ beyond the between-launch noise, ~ within it (not a clear win), "
              "? untestable (one launch); "
              "◆ the model predicted this winner, ◇X it predicted X")
AXIS_WORDS = {"nodes": "nodes", "workers_per_node": "workers/node", "batch_per_worker": "batch/worker",
              "bandwidth": "bandwidth", "latency": "latency"}


class FilterError(ValueError):
    """A `--where` that names an unknown dimension or a value no run has."""


@dataclass(frozen=True)
class MatrixCell:
    """One topology's answer: the winner, its margin, whether it is clear, the model's pick."""

    winner: str
    framework: str
    mode: object
    margin_pct: float
    clear: bool | None
    predicted: str | None

    @property
    def margin_text(self) -> str:
        """'+6%' over the runner-up, or 'only' where no other scheme ranked."""
        return "only" if missing(self.margin_pct) else f"+{self.margin_pct:.0f}%"

    @property
    def clear_mark(self) -> str:
        """✓ beyond the between-launch noise, ~ within it, ? untestable."""
        return CLEAR_MARKS[self.clear]


@dataclass
class MatrixGrid:
    """The verdict matrix of one model on one device."""

    title: str
    row_axis: str
    column_axis: str
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], MatrixCell] = field(default_factory=dict)
    rows_left_out: int = 0
    columns_left_out: int = 0


# --------------------------------------------------------------------------- sorting and labels

def _order_key(column: str, value):
    """Numbers by value, links by their rate or delay, missing first: axes read in order."""
    if missing(value) or str(value) == "":
        return (0, 0.0, "")
    try:
        if column == "bandwidth":
            return (1, parse_bandwidth(str(value)), str(value))
        if column == "latency":
            return (1, parse_latency(str(value)), str(value))
        return (1, float(value), str(value))
    except (TypeError, ValueError, UnitError):
        return (2, 0.0, str(value))


def _label(columns: tuple[str, ...], values: tuple) -> str:
    """'1×2' for the topology axis; 'b16 · 1Gbit' for the other (only what varies)."""
    if columns == TOPOLOGY_AXIS:
        return tables.topology_short(*values)
    parts = []
    for column, value in zip(columns, values):
        if missing(value) or str(value) == "":
            parts.append("unshaped" if column == "bandwidth" else "—")
        else:
            parts.append(f"b{int(value)}" if column == "batch_per_worker" else str(value))
    return " · ".join(parts) or "—"


def evenly(items: list, budget: int) -> list:
    """At most `budget` of `items`, evenly spaced, the first and the last always kept."""
    if len(items) <= budget:
        return list(items)
    if budget <= 1:
        return items[:1]
    picks = sorted({int(round(i)) for i in np.linspace(0, len(items) - 1, budget)})
    return [items[i] for i in picks]


# --------------------------------------------------------------------------- the matrix

def topology_cells(table: pd.DataFrame) -> pd.Series:
    """Each row's topology's `MatrixCell` (None where no synchronous scheme ranked there), in one
    pass over the verdict table.  The model's pick is the synchronous scheme with the shortest
    predicted iteration (one topology: one global batch, so the shortest iteration is the
    highest throughput); None without predictions."""
    topology = table.groupby(verdict.TOPOLOGY_KEYS, dropna=False, sort=True).ngroup()
    predicted = pd.to_numeric(table["predicted_iter_ms"], errors="coerce").where(table["synchronous"].astype(bool))
    known = predicted.notna()
    picks = {t: str(table.at[i, "series"]) for t, i in predicted[known].groupby(topology[known]).idxmin().items()}
    cells = {}
    winners = table[table["rank"] == 1]
    for i, first in zip(winners.index, winners.to_dict("records")):
        clear = first["beyond_noise"] if isinstance(first["beyond_noise"], bool) else None
        cells[topology[i]] = MatrixCell(str(first["series"]), str(first["framework"]), first["mode"],
                                        float(first["margin_pct"]), clear, picks.get(topology[i]))
    return pd.Series([cells.get(t) for t in topology], index=table.index, dtype=object)


def _varying(table: pd.DataFrame, columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(c for c in columns if table[c].astype(str).nunique() > 1)


def _grid(title: str, table: pd.DataFrame, max_rows: int, max_columns: int) -> MatrixGrid:
    """One model and device (its rows of the verdict table, with their `_cell`): cells keyed by
    (row label, column label), axes in value order."""
    other = _varying(table, OTHER_AXIS) or ("batch_per_worker",)
    keyed = table.assign(
        _topology=[_label(TOPOLOGY_AXIS, (n, w)) for n, w in zip(table["nodes"], table["workers_per_node"])],
        _other=[_label(other, tuple(row)) for row in table[list(other)].itertuples(index=False)])

    def ordered(label_column: str, columns: tuple[str, ...]) -> list[str]:
        firsts = keyed.drop_duplicates(label_column)
        keys = {row[label_column]: tuple(_order_key(c, row[c]) for c in columns) for _, row in firsts.iterrows()}
        return sorted(keys, key=keys.get)

    topologies, others = ordered("_topology", TOPOLOGY_AXIS), ordered("_other", other)
    other_words = " · ".join(AXIS_WORDS[c] for c in other)
    down_is_topology = len(topologies) >= len(others)
    row_labels, column_labels = (topologies, others) if down_is_topology else (others, topologies)
    axes = ("nodes×workers", other_words) if down_is_topology else (other_words, "nodes×workers")
    kept_rows, kept_columns = evenly(row_labels, max_rows), evenly(column_labels, max_columns)
    grid = MatrixGrid(title, axes[0], axes[1], kept_rows, kept_columns,
                      rows_left_out=len(row_labels) - len(kept_rows),
                      columns_left_out=len(column_labels) - len(kept_columns))
    for (topology, rest), rows in keyed.groupby(["_topology", "_other"], sort=False):
        key = (topology, rest) if down_is_topology else (rest, topology)
        if key[0] in kept_rows and key[1] in kept_columns:
            found = rows["_cell"].iloc[0]
            if found is not None:
                grid.cells[key] = found
    return grid


def verdict_matrix(table: pd.DataFrame, max_rows: int = 24, max_columns: int = 4,
                   max_grids: int = 3) -> tuple[list[MatrixGrid], int]:
    """The grids of the verdict table (`max_grids` at most, the row budget shared between them)
    and how many grids were left out."""
    if table.empty:
        return [], 0
    groups = list(table.assign(_cell=topology_cells(table)).groupby(["model", "device"], dropna=False, sort=True))
    shown = groups[:max_grids]
    # each grid beyond the first also spends about four lines on its title, header and notes
    per_grid = max(3, (max_rows - 4 * (len(shown) - 1)) // len(shown))
    grids = [_grid(f"{model} on {device}", rows, per_grid, max_columns) for (model, device), rows in shown]
    return grids, len(groups) - len(shown)


def win_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per scheme: topologies won, of them clearly, and where the model predicted the winner."""
    one_per_topology = table.assign(_cell=topology_cells(table)).drop_duplicates(verdict.TOPOLOGY_KEYS) \
        if len(table) else table.assign(_cell=None)
    cells = [c for c in one_per_topology["_cell"] if c is not None]
    counts = pd.DataFrame([{"series": c.winner, "framework": c.framework, "mode": c.mode, "clear": c.clear is True,
                            "model_agrees": c.predicted == c.winner, "predicted": c.predicted is not None}
                           for c in cells])
    if counts.empty:
        return pd.DataFrame(columns=["series", "framework", "mode", "wins", "clear", "model_agrees", "predicted"])
    grouped = counts.groupby("series", sort=False)
    return (grouped.agg(framework=("framework", "first"), mode=("mode", "first"), wins=("series", "size"),
                        clear=("clear", "sum"), model_agrees=("model_agrees", "sum"), predicted=("predicted", "sum"))
            .reset_index().sort_values("wins", ascending=False))


# --------------------------------------------------------------------------- --where

def _parse_where(text: str) -> list[tuple[str, str]]:
    """'nodes=2,batch=64' -> [('nodes', '2'), ('batch', '64')] (a FilterError on a bad term)."""
    terms = []
    for part in str(text).split(","):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise FilterError(f"--where wants dim=value[,dim=value...], got {part.strip()!r} "
                              f"(dimensions: {', '.join(DIMENSIONS)})")
        if name not in DIMENSIONS:
            raise FilterError(f"--where: unknown dimension {name!r} (known: {', '.join(DIMENSIONS)})")
        terms.append((name, value))
    return terms


def _matches(column: str, values: pd.Series, wanted: str) -> pd.Series:
    """Rows whose value is `wanted`: numbers and links compared by value ('1Gbit' = '1000Mbit')."""
    key = _order_key(column, wanted)
    if key[0] == 1:
        return pd.Series([_order_key(column, v)[:2] == key[:2] for v in values], index=values.index)
    return values.astype(str) == wanted


def where(frame: pd.DataFrame, text: str | None) -> pd.DataFrame:
    """The runs matching every ``dim=value`` of `text` (all runs for None or '')."""
    if not text:
        return frame
    prepared = tables.prepare(frame)
    prepared["series"] = [tables.series_name(label, mode)
                          for label, mode in zip(prepared["framework_label"], prepared["mode"])]
    keep = pd.Series(True, index=prepared.index)
    for name, value in _parse_where(text):
        column = DIMENSIONS[name]
        hit = _matches(column, prepared[column], value)
        if not hit.any():
            present = sorted({str(v) for v in prepared[column] if not missing(v) and str(v) != ""},
                             key=lambda v: _order_key(column, v))
            raise FilterError(f"--where: no run has {name}={value} ({name} values: {listed(present, 6) or 'none'})")
        keep &= hit
    if not keep.any():
        raise FilterError(f"--where: no run matches {text}")
    return frame.loc[keep[keep].index]
