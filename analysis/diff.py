"""`dlcompare diff A B`: two campaigns side by side, configuration by configuration.

    dlcompare diff results/before results/after [--fail-above 5] [--level 0.05] [--out DIR]

Configurations are matched on `MATCH_KEYS`: the scheme (framework and mode), model, topology
(nodes × workers per node), per-worker batch, emulated links and precision.  The device, the
versions and the git revision are shown side by side, not matched: a new driver, framework
version or machine is what an A/B comparison is for.  Configurations only one campaign has are
listed, never dropped silently.

Per matched configuration: the median iteration time in A and in B (over its launches, each
launch's median), the change of B against A in per cent (positive: B is slower) with its
interval, and the test every verdict uses (`analysis.noise`), fitted over the launches of both
campaigns, each with its own rounds: *beyond noise* where the interval excludes no change;
*within noise* otherwise; *too few launches* where neither campaign measured its noise between
launches (every configuration ran once: run them with ``--launches 2`` or more).  What differs
between A and B as a whole (a machine, a driver) is what a diff measures; each campaign's own
drift between its rounds is removed.

Writes ``diff.csv``, ``diff.md`` and ``diff.png`` (the change per configuration with its
spread, in each scheme's colour) under ``--out`` (default ``B/diff``), prints the table, and
with ``--fail-above PCT`` exits 1 when a configuration is slower by more than PCT % and not
within noise (beyond it, or too few launches to tell).  A folder without a store, or two
campaigns with no configuration in common: one line, exit 2.  Nothing stored is changed.
"""

from __future__ import annotations

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

from analysis import figures, noise, tables  # noqa: E402
from analysis.palette import scheme_colour  # noqa: E402
from analysis.rendering import markdown_document, missing  # noqa: E402
from analysis.store import ResultStore, StoreError  # noqa: E402

MATCH_KEYS: list[str] = ["framework", "mode", "model", "nodes", "workers_per_node", "batch_per_worker",
                         "bandwidth", "latency", "dtype"]
VERDICTS = {True: "beyond noise", False: "within noise", None: "too few launches"}
DIFF_COLUMNS = ["scheme", "model", "topology", "batch_per_worker", "links", "a_ms", "b_ms", "change_pct",
                "change_low_pct", "change_high_pct", "a_launches", "b_launches", "p_value", "beyond_noise", "verdict"]


class DiffError(ValueError):
    """Two campaigns that cannot be compared (nothing in common)."""


def _matched_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """A campaign's successful runs with a time, keyed on `MATCH_KEYS` (float32 where unsaid)."""
    ok = tables.ok_runs(tables.prepare(frame))
    ok = ok[pd.to_numeric(ok["iter_time_median"], errors="coerce").notna()]
    ok = ok.assign(dtype=ok["dtype"].fillna("float32") if "dtype" in ok else "float32")
    for column in ("bandwidth", "latency"):
        ok[column] = ok[column].fillna("").astype(str)
    return ok


def configurations(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of a campaign's successful runs: its keys, label, launches."""
    ok = _matched_runs(frame)
    if ok.empty:
        return pd.DataFrame(columns=[*MATCH_KEYS, "framework_label", "launch_times", "key"])
    grouped = ok.groupby(MATCH_KEYS, dropna=False, sort=True)
    table = grouped.agg(framework_label=("framework_label", "first"),
                        launch_times=("iter_time_median", lambda times: [float(t) for t in times])).reset_index()
    return table.assign(key=[noise.config_key(r, MATCH_KEYS) for r in table.to_dict("records")])


def compare(a_key: str, b_key: str, a_times: list[float], b_times: list[float], fitted: noise.Noise,
            level: float = noise.LEVEL) -> dict:
    """B against A: medians over launches (ms), the change in % with its interval, the test."""
    found = noise.compare(f"A:{a_key}", f"B:{b_key}", fitted, level)  # A's throughput over B's: B's time over A's
    a_ms, b_ms = 1e3 * float(np.median(a_times)), 1e3 * float(np.median(b_times))
    return {"a_ms": a_ms, "b_ms": b_ms, "change_pct": 100 * (b_ms / a_ms - 1),
            "change_low_pct": 100 * (found.low - 1), "change_high_pct": 100 * (found.high - 1),
            "a_launches": len(a_times), "b_launches": len(b_times), "p_value": found.p_value,
            "beyond_noise": found.beyond, "verdict": VERDICTS[found.beyond]}


def fit_both(a_frame: pd.DataFrame, b_frame: pd.DataFrame) -> noise.Noise:
    """The between-launch noise of both campaigns' launches, each with its own rounds."""
    rows = [noise.launch_rows(_matched_runs(frame), side, MATCH_KEYS)
            for side, frame in (("A:", a_frame), ("B:", b_frame))]
    return noise.fit(pd.concat(rows, ignore_index=True))


def _label(row) -> str:
    """'PyTorch DDP · alexnet · 1×2 · b16' (with links where shaped)."""
    parts = [tables.series_name(row["framework_label"], row["mode"]), str(row["model"]),
             tables.topology_short(row["nodes"], row["workers_per_node"]), f"b{int(row['batch_per_worker'])}"]
    links = tables.links_text(row["bandwidth"], row["latency"])
    return " · ".join(parts + ([links] if links else []))


def diff_table(a_frame: pd.DataFrame, b_frame: pd.DataFrame,
               level: float = noise.LEVEL) -> tuple[pd.DataFrame, list, list]:
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
    fitted = fit_both(a_frame, b_frame)
    rows = []
    for _, row in both.iterrows():
        found = compare(row["key_a"], row["key_b"], row["launch_times_a"], row["launch_times_b"], fitted, level)
        rows.append({"scheme": tables.series_name(row["framework_label_a"], row["mode"]), "model": row["model"],
                     "topology": tables.topology_short(row["nodes"], row["workers_per_node"]),
                     "batch_per_worker": int(row["batch_per_worker"]),
                     "links": tables.links_text(row["bandwidth"], row["latency"]),
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
    """The change of each configuration (B against A) as a horizontal bar with its interval."""
    labels = [" · ".join(v for v in (r["scheme"], r["model"], r["topology"], f"b{r['batch_per_worker']}", r["links"])
                         if v) for _, r in table.iterrows()]
    fig, (ax,) = figures.new_panels(1)
    fig.set_size_inches(9.0, 1.4 + 0.32 * len(table))
    y = range(len(table))
    colours = [scheme_colour(f, m) for f, m in zip(table["framework"], table["mode"])]
    ax.barh(list(y), table["change_pct"], color=colours, height=0.6,
            xerr=[(table["change_pct"] - table["change_low_pct"]).fillna(0),
                  (table["change_high_pct"] - table["change_pct"]).fillna(0)],
            error_kw={"ecolor": "#333333", "capsize": 3})
    for k, (_, r) in zip(y, table.iterrows()):
        mark = {True: "beyond noise", False: "", None: "?"}[r["beyond_noise"]]
        ax.annotate(mark, (max(r["change_high_pct"] if not missing(r["change_high_pct"]) else r["change_pct"], 0), k), xytext=(4, -3), textcoords="offset points", fontsize=7)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="iteration time, B against A (%; right: B slower), with its interval over launches")
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
    for header in ("Scheme", "Model", "N×W", "Batch", "A ms", "B ms", "Launches", "Change [interval]", "Verdict"):
        grid.add_column(header, justify="right" if header in ("Batch", "A ms", "B ms") else "left")
    for _, r in table.iterrows():
        grid.add_row(r["scheme"], r["model"], f"{r['topology']} {r['links']}".strip(), str(r["batch_per_worker"]),
                     f"{r['a_ms']:.1f}", f"{r['b_ms']:.1f}", f"{r['a_launches']}/{r['b_launches']}",
                     f"{r['change_pct']:+.1f}%" + ("" if missing(r["change_low_pct"]) else
                                                   f" [{r['change_low_pct']:+.1f}, {r['change_high_pct']:+.1f}]"),
                     f"{r['verdict']}" + (f" (p={r['p_value']:.3f})" if not missing(r["p_value"]) else ""))
    console.print(grid)
    for side, labels in (("A", only_a), ("B", only_b)):
        if labels:
            console.print(f"only in {side} ({len(labels)}): {listed(labels)}")
    few = table[table["beyond_noise"].isna()]
    if len(few):
        console.print(f"{len(few)} configuration(s) with too few launches to measure the noise between them: "
                      "run the campaigns with --launches 2 or more")
    environment = Table(title="Environments")
    for header in ("", "A", "B"):
        environment.add_column(header)
    for _, r in sides.iterrows():
        environment.add_row(r["fact"], r["A"], r["B"])
    console.print(environment)


def _runs(folder: str) -> pd.DataFrame:
    with ResultStore.for_campaign(folder, create=False) as store:
        return store.campaign_frame()


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.diff A B``: compare campaign B against campaign A."""
    parser = OneLineParser(prog="python -m analysis.diff", description=__doc__.splitlines()[0])
    parser.add_argument("a", metavar="A", help="the baseline campaign folder")
    parser.add_argument("b", metavar="B", help="the campaign compared with it")
    parser.add_argument("--fail-above", type=float, metavar="PCT",
                        help="exit 1 when a configuration is slower by more than PCT %% and not within noise")
    parser.add_argument("--level", type=float, default=noise.LEVEL, help="the test's level (default 0.05)")
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
