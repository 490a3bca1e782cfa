"""A one-screen terminal summary of a campaign, for the end of ``launchers.compare``.

The verdict matrix first (`analysis.overview`: per topology the winning scheme, its margin,
whether the win is clear, the model's predicted winner), which fits one screen (`SCREEN_LINES`)
for a campaign of any size.  The details follow where they fit on that screen too, and on
request (``--all``, or ``--where nodes=2,batch=64`` for part of the campaign): per topology the
verdict's sentence and where each scheme's lost time went (`analysis.verdict`), then one row per
measured configuration (median over repeated runs) with speedup and efficiency against the
one-worker run, then one row per failed run; everything else lives in the report.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from core.cli import OneLineParser, fail
from core.envs import reexec_in_host_env

if __name__ == "__main__":  # `python3 -m analysis.summary` from any Python: pandas is in the host env
    reexec_in_host_env("analysis.summary", sys.argv[1:])

import pandas as pd  # noqa: E402
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rich.text import Text

from analysis import noise, overview, tables, verdict
from analysis.palette import scheme_colour
from analysis.rendering import missing
from analysis.store import ResultStore, StoreError

# Short headers so that the table fits an 80-column terminal; the caption spells them out.
HEADERS = ("Scheme", "Model", "N×W", "Batch", "img/s", "Iter ms [p10–p90]", "S(N)", "E(N)", "Status")
NUMERIC = {"Batch", "img/s", "S(N)", "E(N)"}
# Columns that may wrap on a narrow terminal; the numbers never do.
WRAPPING = {"Scheme": 11, "Model": 8, "Iter ms [p10–p90]": 13}
SCREEN_LINES = 40  # the overview of any campaign fits this many terminal lines
MATRIX_CELL_WIDTH = 18  # characters per matrix column, for choosing how many fit the terminal
CAPTION = ("Scheme: framework (mode); N×W nodes × workers per node, Batch per worker, img/s over all workers; iteration time median [p10–p90] over "
           "timed repeats; speedup S(N) = N·t(1)/t(N) against the one-worker run, efficiency E(N) = S/N")


def _text(value, fmt: str = "") -> str:
    """A cell: a dash for missing values, else the formatted value (rich markup escaped)."""
    if missing(value):
        return "—"
    return format(value, fmt) if fmt else escape(str(value))


def _workers(nodes, workers_per_node, bandwidth=None, latency=None) -> str:
    """The topology '1×2', with the emulated links where the run crossed them."""
    text = tables.topology_short(nodes, workers_per_node)
    links = [str(v) for v in (bandwidth, latency) if not missing(v) and str(v)]
    return text + (f" ({', '.join(links)})" if links else "")


def _iteration(row) -> str:
    median = _text(row["iter_ms_median"], ".1f")
    if missing(row["iter_ms_p10"]) or missing(row["iter_ms_p90"]):
        return median
    return f"{median} [{row['iter_ms_p10']:.1f}–{row['iter_ms_p90']:.1f}]"


def _efficiency_style(value) -> str:
    """Green near-linear scaling, yellow middling, red poor: readable at a glance.

    Magenta above 1.05: superlinear weak scaling is almost always a noisy baseline run.
    """
    if missing(value):
        return ""
    if value > 1.05:
        return "magenta"
    return "green" if value >= 0.8 else "yellow" if value >= 0.5 else "red"


def _ok_rows(frame: pd.DataFrame) -> list[tuple[list[str], str]]:
    configs = tables.configs_with_speedup(frame)
    rows = []
    for _, row in configs.iterrows():
        status = "ok" if row["runs"] == 1 else f"ok ×{row['runs']}"
        cells = [_text(tables.series_name(row["framework_label"], row["mode"])), _text(row["model"]),
                 _workers(row["nodes"], row["workers_per_node"], row.get("bandwidth"), row.get("latency")),
                 _text(row["batch_per_worker"]), _text(row["images_per_s"], ".1f"), _iteration(row), _text(row["speedup"], ".2f"),
                 _text(row["efficiency"], ".2f"), f"[green]{status}[/]"]
        if _efficiency_style(row["efficiency"]):
            cells[7] = f"[{_efficiency_style(row['efficiency'])}]{cells[7]}[/]"
        rows.append((cells, ""))
    return rows


def _failed_rows(frame: pd.DataFrame) -> list[tuple[list[str], str]]:
    prepared = tables.prepare(frame)
    failed = prepared[prepared["status"].notna() & (prepared["status"] != "ok")]
    return [([_text(tables.series_name(r["framework_label"], r["mode"])), _text(r["model"]),
              _workers(r["nodes"], r["workers_per_node"], r.get("bandwidth"), r.get("latency")),
              _text(r["batch_per_worker"]), "—", "—", "—", "—", f"[bold red]{escape(str(r['status']))}[/]"], "dim")
            for _, r in failed.sort_values(["model", "framework_label", "world_size"]).iterrows()]


def summary_table(frame: pd.DataFrame, title: str = "dlcompare results") -> Table:
    """The campaign at a glance as a rich Table (an empty table says so in its caption)."""
    table = Table(title=escape(title), caption=escape(CAPTION), header_style="bold", title_style="bold",
                  box=box.SIMPLE_HEAD, padding=(0, 0), pad_edge=False,
                  show_edge=False)
    for header in HEADERS:
        table.add_column(escape(header), justify="right" if header in NUMERIC else "left",
                         no_wrap=header not in WRAPPING, min_width=WRAPPING.get(header), overflow="fold")
    rows = _ok_rows(frame) + _failed_rows(frame) if len(frame) else []
    for cells, style in rows:
        table.add_row(*cells, style=style or None)
    if not rows:
        table.caption = "no runs stored yet"
    elif model_line(frame):
        table.caption = escape(CAPTION + "; " + model_line(frame))
    return table


def model_line(frame: pd.DataFrame) -> str:
    """'performance model: median |error| 7.3 % over 6 runs (max 12.0 %)', or '' without
    predictions."""
    if "prediction_error" not in frame.columns or "status" not in frame.columns:
        return ""
    errors = pd.to_numeric(frame.loc[frame["status"] == "ok", "prediction_error"], errors="coerce").dropna().abs()
    if errors.empty:
        return ""
    return (f"performance model: median |predicted - measured| / measured {errors.median() * 100:.1f} % over "
            f"{len(errors)} runs (max {errors.max() * 100:.1f} %)")


def verdict_text(table: pd.DataFrame) -> Text:
    """The verdict table (`verdict.verdict_table`) as terminal text: per topology its title,
    headline, and each scheme's cause and flags (the scheme's name in its fixed colour)."""
    text = Text()
    for item in verdict.verdicts(table):
        text.append(item.title + "\n", style="bold")
        text.append("  " + item.headline + "\n")
        for _, row in item.rows.iterrows():
            alone = row["world_size"] <= 1  # a one-worker run has no loss to explain
            if alone and not row["flags"]:
                continue
            text.append("    ")
            text.append(row["series"], style=f"bold {scheme_colour(row['framework'], row['mode'])}")
            if not alone:
                efficiency = "" if missing(row["efficiency"]) else f" (E = {row['efficiency']:.2f})"
                text.append(f"{efficiency}: {row['cause_text']}")
            text.append("\n")
            if row["flags"]:
                text.append(f"      ⚠ {row['flags']}\n", style="yellow")
    return text


def _letters(table: pd.DataFrame, wins: pd.DataFrame) -> dict[str, str]:
    """A one-letter key per scheme of the verdict table, those with the most `wins` first."""
    names = list(wins["series"])
    names += sorted(set(table.loc[table["synchronous"].astype(bool), "series"]) - set(names))
    return {name: chr(ord("A") + i) if i < 26 else f"{i}" for i, name in enumerate(names)}


def _matrix_cell(cell: overview.MatrixCell | None, letters: dict[str, str]) -> Text:
    """'A +6% ✓ ◆': winner's key, margin, clear mark, the model's agreement (or its pick)."""
    if cell is None:
        return Text("—", style="dim")
    text = Text(letters.get(cell.winner, "?"), style=f"bold {scheme_colour(cell.framework, cell.mode)}")
    text.append(f" {cell.margin_text} {cell.clear_mark}", style="" if cell.clear else "dim")
    if cell.predicted is not None:
        text.append(" ◆" if cell.predicted == cell.winner else f" ◇{letters.get(cell.predicted, '?')}",
                    style="" if cell.predicted == cell.winner else "yellow")
    return text


def matrix_renderables(table: pd.DataFrame, width: int = 80) -> list:
    """The verdict matrix of the verdict table as rich renderables: per model and device a grid,
    then the key, the win counts and what was left out."""
    columns = max(1, min(6, (width - 12) // MATRIX_CELL_WIDTH))
    grids, grids_left_out = overview.verdict_matrix(table, max_columns=columns)
    if not grids:
        return [Text("no successful run to rank yet", style="dim")]
    wins = overview.win_counts(table)
    letters = _letters(table, wins)
    out = []
    for grid in grids:
        # the title as its own line: a table's title wraps at the table's (narrow) width
        out.append(Text(f"{grid.title} — columns: {grid.column_axis}", style="bold"))
        grid_table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False,
                           header_style="bold")
        grid_table.add_column(escape(grid.row_axis), no_wrap=True)
        for column in grid.columns:
            grid_table.add_column(escape(column), no_wrap=True)
        for row in grid.rows:
            grid_table.add_row(escape(row), *(_matrix_cell(grid.cells.get((row, c)), letters) for c in grid.columns))
        out.append(grid_table)
        left = [f"{n} more {what}" for n, what in ((grid.rows_left_out, "rows"), (grid.columns_left_out, "columns")) if n]
        if left:
            out.append(Text(f"  … {' and '.join(left)} evenly left out: narrow with --where", style="dim"))
    if grids_left_out:
        out.append(Text(f"… and {grids_left_out} more model/device grid(s): narrow with --where model=…", style="dim"))
    key = Text("key: ")
    for name, letter in letters.items():
        key.append(letter, style=f"bold {_colour_of(table, name)}")
        key.append(f" {name}  ")
    out.append(key)
    out.append(Text(overview.MATRIX_KEY, style="dim"))
    out.append(Text("wins: " + "; ".join(f"{letters[r['series']]} {r['wins']} ({r['clear']} clear)"
                                         for _, r in wins.iterrows())))
    return out


def _colour_of(table: pd.DataFrame, series: str) -> str:
    row = table[table["series"] == series].iloc[0]
    return scheme_colour(row["framework"], row["mode"])


def _lines(renderables: list, width: int) -> int:
    """How many terminal lines `renderables` take at `width`."""
    probe = Console(file=io.StringIO(), width=width, color_system=None)
    for item in renderables:
        probe.print(item)
    return len(probe.file.getvalue().splitlines())


def detail_renderables(frame: pd.DataFrame, table: pd.DataFrame, title: str) -> list:
    """Per topology the verdict's sentence and causes (from the verdict `table`), then the runs
    table of `frame`."""
    found = verdict_text(table)
    out = [Text("Verdict\n", style="bold underline") + found] if found else []
    return out + [summary_table(frame, title=title)]


def counts_line(frame: pd.DataFrame) -> Text:
    status = frame["status"] if "status" in frame.columns else pd.Series(dtype=object)
    ok = int((status == "ok").sum())
    return Text(f"{len(frame):,} run(s): {ok:,} ok, {len(frame) - ok:,} not", style="bold")


def print_summary(out_dir: str | Path, console: Console | None = None, show_all: bool = False,
                  where: str | None = None) -> int:
    """Print the campaign in `out_dir`: the verdict matrix, then the details where they fit one
    screen or are asked for (`show_all`, or a `where` filter, which narrows everything); returns
    the number of lines printed. StoreError when it has no store, FilterError on a bad filter."""
    out_dir = Path(out_dir)
    with ResultStore.for_campaign(out_dir, create=False) as store:
        frame = store.campaign_frame()
    frame = overview.where(frame, where)
    console = console or Console()
    title = f"dlcompare — {out_dir.resolve().name}" + (f" — where {where}" if where else "")
    head = [Text(title, style="bold"), counts_line(frame), Text(noise.campaign_noise(frame).describe(), style="dim")]
    table = verdict.verdict_table(frame)
    shown = head + [Text("Verdict matrix", style="bold underline")] + matrix_renderables(table, console.width)
    asked = show_all or bool(where)
    # the runs table alone has a line per configuration: past a screen of them, do not build it to measure it
    details = detail_renderables(frame, table, title) if asked or len(table) < SCREEN_LINES else []
    if details and (asked or _lines(shown + details, console.width) <= SCREEN_LINES):
        shown += details
    else:
        shown.append(Text(f"each topology's verdict and causes and the runs table: dlcompare summary {out_dir} --all, "
                          "or --where nodes=…,batch=… for part of it", style="dim"))
    with console.capture() as captured:  # rendered once, for the screen and for the line count
        for item in shown:
            console.print(item)
    output = captured.get()
    console.file.write(output)
    console.file.flush()
    return len(output.splitlines())


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.summary DIR [--all] [--where dim=value,...]``: print a campaign's
    verdict matrix, and its details where they fit or are asked for."""
    parser = OneLineParser(prog="python -m analysis.summary", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", metavar="DIR", help="campaign folder holding results.sqlite")
    parser.add_argument("--all", action="store_true", dest="show_all",
                        help="each topology's verdict and causes and the runs table, however long")
    parser.add_argument("--where", metavar="DIM=VALUE,...",
                        help=f"only the runs matching every term; dimensions: {', '.join(overview.DIMENSIONS)}")
    args = parser.parse_args(argv)
    try:
        print_summary(args.out_dir, show_all=args.show_all, where=args.where)
    except (StoreError, overview.FilterError) as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
