"""A one-screen terminal summary of a campaign, for the end of ``launchers.compare``.

The verdict first (`analysis.verdict`: per model and topology the fastest scheme, its margin,
and where each scheme's lost time went), then one row per measured configuration (median over
repeated runs) with speedup and efficiency against the one-worker run, then one row per failed
run; details live in the report.
"""

from __future__ import annotations

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

from analysis import tables, verdict
from analysis.palette import scheme_colour
from analysis.rendering import missing
from analysis.store import ResultStore, StoreError

# Short headers so that the table fits an 80-column terminal; the caption spells them out.
HEADERS = ("Scheme", "Model", "N×W", "Batch", "img/s", "Iter ms [p10–p90]", "S(N)", "E(N)", "Status")
NUMERIC = {"Batch", "img/s", "S(N)", "E(N)"}
# Columns that may wrap on a narrow terminal; the numbers never do.
WRAPPING = {"Scheme": 11, "Model": 8, "Iter ms [p10–p90]": 13}
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


def verdict_text(frame: pd.DataFrame) -> Text:
    """The verdict as terminal text: per topology its title, headline, and each scheme's cause
    and flags (the scheme's name in its fixed colour)."""
    text = Text()
    for item in verdict.verdicts(verdict.verdict_table(frame)):
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


def print_summary(out_dir: str | Path, console: Console | None = None) -> Table:
    """Print the verdict and the summary table of the campaign in `out_dir`; StoreError when it
    has no store."""
    out_dir = Path(out_dir)
    with ResultStore.for_campaign(out_dir, create=False) as store:
        frame = store.runs_frame()
    console = console or Console()
    found = verdict_text(frame) if len(frame) else Text()
    if found:
        console.print(Text("Verdict\n", style="bold underline") + found)
    table = summary_table(frame, title=f"dlcompare — {out_dir.resolve().name}")
    console.print(table)
    return table


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.summary DIR``: print a campaign's summary table."""
    parser = OneLineParser(prog="python -m analysis.summary", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", metavar="DIR", help="campaign folder holding results.sqlite")
    args = parser.parse_args(argv)
    try:
        print_summary(args.out_dir)
    except StoreError as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
