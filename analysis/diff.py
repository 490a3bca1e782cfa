"""`dlcompare diff A B`: two campaigns side by side, configuration by configuration.

    dlcompare diff results/before results/after [--fail-above 5] [--level 0.05] [--out DIR]

Configurations are matched on `MATCH_KEYS`: the scheme (framework and mode), model, topology
(nodes × workers per node), per-worker batch, emulated links and precision.  The device, the
versions and the git revision are shown side by side, not matched: a new driver, framework
version or machine is what an A/B comparison is for.  Configurations only one campaign has are
listed, never dropped silently.

Per matched configuration: the median iteration time in A and in B (over every timed repeat
of every run of it), the change of B against A in per cent (positive: B is slower), the
10th-90th percentile of the ratios of B's repeats to A's, and a two-sided Mann-Whitney U test
(`scipy.stats.mannwhitneyu`) of the two sets of repeat times at `--level`: *beyond noise* where
p < level; *within noise* otherwise; *too few repeats* where no outcome could reach the level
(with 3 repeats each the smallest two-sided p is 0.1; 4 each are needed for 0.05).  The
repeats are within-launch samples: a difference between two launches of the same code (the
machine's state) also shows as "beyond noise", so a CI gate should compare campaigns measured
under the same conditions.

Writes ``diff.csv``, ``diff.md`` and ``diff.png`` (the change per configuration with its
spread, in each scheme's colour) under ``--out`` (default ``B/diff``), prints the table, and
with ``--fail-above PCT`` exits 1 when a configuration is slower by more than PCT % and not
within noise (beyond it, or too few repeats to tell).  A folder without a store, or two
campaigns with no configuration in common: one line, exit 2.  Nothing stored is changed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from core.cli import EXIT_FAILED, OneLineParser, fail, listed
from core.envs import reexec_in_host_env

if __name__ == "__main__":  # `python3 -m analysis.diff` from any Python: pandas is in the host env
    reexec_in_host_env("analysis.diff", sys.argv[1:])

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from scipy import stats  # noqa: E402

from analysis import figures, tables  # noqa: E402
from analysis.palette import scheme_colour  # noqa: E402
from analysis.rendering import markdown_document, missing  # noqa: E402
from analysis.store import ResultStore, StoreError  # noqa: E402

MATCH_KEYS: list[str] = ["framework", "mode", "model", "nodes", "workers_per_node", "batch_per_worker",
                         "bandwidth", "latency", "dtype"]
LEVEL = 0.05
VERDICTS = {True: "beyond noise", False: "within noise", None: "too few repeats"}
DIFF_COLUMNS = ["scheme", "model", "topology", "batch_per_worker", "links", "a_ms", "b_ms", "change_pct",
                "change_p10_pct", "change_p90_pct", "a_repeats", "b_repeats", "p_value", "beyond_noise", "verdict"]


class DiffError(ValueError):
    """Two campaigns that cannot be compared (nothing in common)."""


def _repeats(frame: pd.DataFrame) -> pd.Series:
    """Each run's timed repeats (seconds per iteration); its median alone for a record without."""
    column = frame["extra_repeat_times"] if "extra_repeat_times" in frame.columns else [None] * len(frame)
    return pd.Series([[float(t) for t in tables.json_list(times)] or [float(median)]
                      for times, median in zip(column, frame["iter_time_median"])], index=frame.index)


def configurations(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of a campaign's successful runs: its keys and all its repeats."""
    ok = tables.ok_runs(tables.prepare(frame))
    ok = ok[pd.to_numeric(ok["iter_time_median"], errors="coerce").notna()]
    if ok.empty:
        return pd.DataFrame(columns=[*MATCH_KEYS, "framework_label", "repeats"])
    ok = ok.assign(repeats=_repeats(ok), dtype=ok["dtype"].fillna("float32") if "dtype" in ok else "float32")
    for column in ("bandwidth", "latency"):
        ok[column] = ok[column].fillna("").astype(str)
    grouped = ok.groupby(MATCH_KEYS, dropna=False, sort=True)
    return grouped.agg(framework_label=("framework_label", "first"),
                       repeats=("repeats", lambda lists: [t for times in lists for t in times])).reset_index()


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the exact rank test can give for samples of these sizes."""
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def compare(a: list[float], b: list[float], level: float = LEVEL) -> dict:
    """B against A: medians (ms), change in %, its p10-p90 over repeat pairs, the rank test."""
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratios = (b_arr[:, None] / a_arr[None, :]).ravel()
    testable = smallest_p(len(a), len(b)) < level
    p_value = float(stats.mannwhitneyu(a_arr, b_arr, alternative="two-sided").pvalue) if testable else math.nan
    beyond = (p_value < level) if testable else None
    return {"a_ms": 1e3 * float(np.median(a_arr)), "b_ms": 1e3 * float(np.median(b_arr)),
            "change_pct": 100 * (float(np.median(b_arr)) / float(np.median(a_arr)) - 1),
            "change_p10_pct": 100 * (float(np.percentile(ratios, 10)) - 1),
            "change_p90_pct": 100 * (float(np.percentile(ratios, 90)) - 1),
            "a_repeats": len(a), "b_repeats": len(b), "p_value": p_value, "beyond_noise": beyond,
            "verdict": VERDICTS[beyond]}


def _label(row) -> str:
    """'PyTorch DDP · alexnet · 1×2 · b16' (with links where shaped)."""
    parts = [tables.series_name(row["framework_label"], row["mode"]), str(row["model"]),
             tables.topology_short(row["nodes"], row["workers_per_node"]), f"b{int(row['batch_per_worker'])}"]
    links = " ".join(v for v in (row["bandwidth"], row["latency"]) if v)
    return " · ".join(parts + ([links] if links else []))


def diff_table(a_frame: pd.DataFrame, b_frame: pd.DataFrame, level: float = LEVEL) -> tuple[pd.DataFrame, list, list]:
    """The matched configurations' comparison (`DIFF_COLUMNS` plus `beyond_noise`, `framework`),
    and the labels of those only A and only B have.  DiffError when none match."""
    a, b = configurations(a_frame), configurations(b_frame)
    merged = a.merge(b, on=MATCH_KEYS, how="outer", suffixes=("_a", "_b"), indicator=True)
    only = {side: [_label(r.rename(lambda c, s=suffix: c.removesuffix(s)))
                   for _, r in merged[merged["_merge"] == side].iterrows()]
            for side, suffix in (("left_only", "_a"), ("right_only", "_b"))}
    both = merged[merged["_merge"] == "both"]
    if both.empty:
        raise DiffError(f"no configuration in common: A has {listed(only['left_only']) or 'none'}; "
                        f"B has {listed(only['right_only']) or 'none'}")
    rows = []
    for _, row in both.iterrows():
        found = compare(row["repeats_a"], row["repeats_b"], level)
        rows.append({"scheme": tables.series_name(row["framework_label_a"], row["mode"]), "model": row["model"],
                     "topology": tables.topology_short(row["nodes"], row["workers_per_node"]),
                     "batch_per_worker": int(row["batch_per_worker"]),
                     "links": " ".join(v for v in (row["bandwidth"], row["latency"]) if v),
                     "framework": row["framework"], "mode": row["mode"], **found})
    return pd.DataFrame(rows), only["left_only"], only["right_only"]


def environment_sides(a_frame: pd.DataFrame, b_frame: pd.DataFrame) -> pd.DataFrame:
    """What differs around the runs, A beside B: device, versions, Python, git revision."""
    def facts(frame: pd.DataFrame) -> dict[str, str]:
        prepared = tables.prepare(frame) if len(frame) else frame
        found = {}
        for name, columns in (("device", ["device"]), ("python", ["env_python"]), ("git revision", ["git_revision"])):
            values = sorted({str(v) for c in columns if c in prepared.columns for v in prepared[c] if not missing(v)})
            found[name] = ", ".join(values) or "—"
        for column in sorted(c for c in prepared.columns if c.startswith("env_") and c != "env_python"):
            values = sorted({str(v) for v in prepared[column] if not missing(v)})
            if values and not column.endswith("_threads"):
                found[column.removeprefix("env_")] = ", ".join(values)
        return found
    a, b = facts(a_frame), facts(b_frame)
    keys = list(dict.fromkeys([*a, *b]))
    return pd.DataFrame([{"fact": k, "A": a.get(k, "—"), "B": b.get(k, "—")} for k in keys])


def regressions(table: pd.DataFrame, above_pct: float) -> pd.DataFrame:
    """Configurations slower by more than `above_pct` % and not within noise."""
    return table[(table["change_pct"] > above_pct) & (table["beyond_noise"] != False)]  # noqa: E712


def draw(table: pd.DataFrame, path: Path) -> Path:
    """The change of each configuration (B against A) as a horizontal bar with its p10-p90."""
    labels = [" · ".join(v for v in (r["scheme"], r["model"], r["topology"], f"b{r['batch_per_worker']}", r["links"])
                         if v) for _, r in table.iterrows()]
    fig, (ax,) = figures.new_panels(1)
    fig.set_size_inches(9.0, 1.4 + 0.32 * len(table))
    y = range(len(table))
    colours = [scheme_colour(f, m) for f, m in zip(table["framework"], table["mode"])]
    ax.barh(list(y), table["change_pct"], color=colours, height=0.6,
            xerr=[table["change_pct"] - table["change_p10_pct"], table["change_p90_pct"] - table["change_pct"]],
            error_kw={"ecolor": "#333333", "capsize": 3})
    for k, (_, r) in zip(y, table.iterrows()):
        mark = {True: "beyond noise", False: "", None: "?"}[r["beyond_noise"]]
        ax.annotate(mark, (max(r["change_p90_pct"], 0), k), xytext=(4, -3), textcoords="offset points", fontsize=7)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="iteration time, B against A (%; right: B slower), p10–p90 of repeat ratios")
    ax.grid(axis="x", alpha=0.3)
    return figures.save_figure(fig, path, "B against A, per configuration")


def write_files(table: pd.DataFrame, sides: pd.DataFrame, out: Path) -> list[Path]:
    """diff.csv, diff.md (the table, then the environments side by side) and diff.png."""
    out.mkdir(parents=True, exist_ok=True)
    shown = table[DIFF_COLUMNS]
    shown.to_csv(out / "diff.csv", index=False)
    (out / "diff.md").write_text(markdown_document("B against A", shown, "Change: B's median iteration time "
                                                   "against A's, in per cent (positive: B is slower).")
                                 + "\n" + markdown_document("Environments", sides), encoding="utf-8")
    return [out / "diff.csv", out / "diff.md", draw(table, out / "diff.png")]


def print_diff(table: pd.DataFrame, sides: pd.DataFrame, only_a: list, only_b: list, console: Console) -> None:
    """The comparison table, what only one side has, and the environments side by side."""
    grid = Table(title="B against A (iteration time; + is slower)")
    for header in ("Scheme", "Model", "N×W", "Batch", "A ms", "B ms", "Change [p10–p90]", "Verdict"):
        grid.add_column(header, justify="right" if header in ("Batch", "A ms", "B ms") else "left")
    for _, r in table.iterrows():
        grid.add_row(r["scheme"], r["model"], f"{r['topology']} {r['links']}".strip(), str(r["batch_per_worker"]),
                     f"{r['a_ms']:.1f}", f"{r['b_ms']:.1f}",
                     f"{r['change_pct']:+.1f}% [{r['change_p10_pct']:+.1f}, {r['change_p90_pct']:+.1f}]",
                     f"{r['verdict']}" + (f" (p={r['p_value']:.3f})" if not missing(r["p_value"]) else ""))
    console.print(grid)
    for side, labels in (("A", only_a), ("B", only_b)):
        if labels:
            console.print(f"only in {side} ({len(labels)}): {listed(labels)}")
    few = table[table["beyond_noise"].isna()]
    if len(few):
        console.print(f"{len(few)} configuration(s) with too few repeats for the rank test at this level: "
                      "run them with --repeats 4 or more")
    environment = Table(title="Environments")
    for header in ("", "A", "B"):
        environment.add_column(header)
    for _, r in sides.iterrows():
        environment.add_row(r["fact"], r["A"], r["B"])
    console.print(environment)


def _runs(folder: str) -> pd.DataFrame:
    with ResultStore.for_campaign(folder, create=False) as store:
        return store.runs_frame()


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.diff A B``: compare campaign B against campaign A."""
    parser = OneLineParser(prog="python -m analysis.diff", description=__doc__.splitlines()[0])
    parser.add_argument("a", metavar="A", help="the baseline campaign folder")
    parser.add_argument("b", metavar="B", help="the campaign compared with it")
    parser.add_argument("--fail-above", type=float, metavar="PCT",
                        help="exit 1 when a configuration is slower by more than PCT %% and not within noise")
    parser.add_argument("--level", type=float, default=LEVEL, help="the rank test's level (default 0.05)")
    parser.add_argument("--out", metavar="DIR", help="where diff.csv, diff.md and diff.png go (default B/diff)")
    args = parser.parse_args(argv)
    if not 0 < args.level < 1:
        return fail(f"--level must be between 0 and 1, got {args.level}")
    try:
        a_frame, b_frame = _runs(args.a), _runs(args.b)
        table, only_a, only_b = diff_table(a_frame, b_frame, args.level)
    except (StoreError, DiffError) as exc:
        return fail(exc)
    sides = environment_sides(a_frame, b_frame)
    console = Console()
    print_diff(table, sides, only_a, only_b, console)
    written = write_files(table, sides, Path(args.out) if args.out else Path(args.b) / "diff")
    console.print("written: " + ", ".join(str(p) for p in written))
    if args.fail_above is not None:
        slower = regressions(table, args.fail_above)
        if len(slower):
            labels = [f"{r['scheme']} {r['topology']} b{r['batch_per_worker']} {r['change_pct']:+.1f}%"
                      for _, r in slower.iterrows()]
            print(f"regression: {len(slower)} configuration(s) slower by more than {args.fail_above:g}%: "
                  f"{listed(labels)}", file=sys.stderr)
            return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
