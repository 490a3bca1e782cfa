"""`dlcompare tune`: measure only what the performance model says can win.

    dlcompare tune --frameworks torch,cntk-style,caffe-mpi-style --model alexnet-tiny \\
        --workers 1,2 --batch-size 8,16 --top 2 --out results/tune

The search space is schemes x per-worker batch x workers per node x nodes.  Steps:

1. **Profile**: every scheme's one-worker run at each batch (`dlcompare run --workers 1`) and
   the calibration of each scheme's collective at the largest worker count (`dlcompare
   calibrate`), stored in --out; what is stored already is not measured again.
2. **Predict** every point of the space from those (`analysis.predict.candidates` and
   `analysis.whatif.evaluate`: each scheme on its own one-worker profile, on its calibrated
   link), in milliseconds.
3. **Measure** the predicted top-k (`--top`) and each scheme's predicted best, each point a
   `dlcompare run` into --out (its launches as the campaign's, so each point is tested against
   the between-launch noise).
4. **Report** ``tables/tune.csv`` and ``tune.md`` (every point: predicted images/s and rank,
   measured images/s with its interval where measured, on the Pareto frontier of measured
   images/s against peak memory or not), ``figures/tune.png`` (measured against predicted), the
   measured winner, how many points it did not run against the full grid, and whether the
   model's first pick was the measured best (or within the between-launch noise of it:
   `analysis.noise.compare`).  The campaign's own report covers every measured run.

Flags `tune` does not know (``--iterations``, ``--launches``, ``--repeats``, ``--cluster`` ...)
go to every `dlcompare run` unchanged.  Bad input (an unknown scheme or model, ``--top`` below
1, a space the model cannot predict): one line, exit 2.  A failed measurement: exit 1 with
what was stored kept.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.cli import EXIT_FAILED, EXIT_USAGE, OneLineParser, fail
from core.envs import REPO_ROOT, reexec_in_host_env

if __name__ == "__main__":  # pandas, the model: the launcher's environment
    reexec_in_host_env("launchers.tune", sys.argv[1:])

import pandas as pd  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from analysis import figures, noise, tables, verdict  # noqa: E402
from analysis import predict as prediction  # noqa: E402
from analysis import whatif  # noqa: E402
from analysis.calibration import lookup  # noqa: E402
from analysis.palette import scheme_colour  # noqa: E402
from analysis.rendering import markdown_document, missing  # noqa: E402
from analysis.store import ResultStore, StoreError  # noqa: E402
from launchers import plan as planning  # noqa: E402

POINT_KEYS = ["scheme", "batch_per_worker", "nodes", "workers_per_node"]
TUNE_COLUMNS = [*POINT_KEYS, "world_size", "predicted_images_per_s", "predicted_rank", "chosen", "measured",
                "images_per_s", "images_per_s_low", "images_per_s_high", "peak_memory_mib", "pareto"]


class TuneError(ValueError):
    """A search space that cannot be tuned; one line."""


def build_parser(prog: str = "python -m launchers.tune") -> OneLineParser:
    parser = OneLineParser(prog=prog, description=__doc__.splitlines()[0].strip("`"))
    parser.add_argument("--frameworks", default="torch", help="schemes, comma list of FRAMEWORK[:MODE]")
    parser.add_argument("--model", default="alexnet-tiny", help="one model (python -m models list)")
    parser.add_argument("--workers", default="1,2", help="workers per node, comma list (default: %(default)s)")
    parser.add_argument("--nodes", default="1", help="node counts, comma list (default: 1; above 1 needs --cluster)")
    parser.add_argument("--batch-size", default=None, help="per-worker batches, comma list (default: the model's)")
    parser.add_argument("--top", type=int, default=2,
                        help="measure the predicted top-k and each scheme's predicted best (default: %(default)s)")
    parser.add_argument("--out", default="results/tune", help="the campaign folder (default: %(default)s)")
    return parser


# --------------------------------------------------------------------------- the space

def space(args) -> tuple[list[tuple], str, list[int], list[int], list[int]]:
    """(schemes as (framework, mode), model, batches, workers, nodes), checked (UsageError)."""
    frameworks = [(info.name, mode) for info, mode in planning.parse_frameworks(args.frameworks)]
    models = planning.parse_models(args.model)
    if len(models) != 1:
        raise planning.UsageError("tune searches one model at a time: --model names one")
    batches = (planning.positive_ints(args.batch_size, "--batch-size") if args.batch_size
               else [planning.default_batch(models[0], "cpu")])
    return (frameworks, models[0], batches, planning.positive_ints(args.workers, "--workers"),
            planning.positive_ints(args.nodes, "--nodes"))


def grid_size(frameworks, batches, workers, nodes) -> int:
    return len(frameworks) * len(batches) * len(workers) * len(nodes)


# --------------------------------------------------------------------------- running

def dlcompare(module: str, arguments: list[str]) -> int:
    """`python -m MODULE ARGUMENTS` from the repository, its progress on this terminal."""
    return subprocess.run([sys.executable, "-m", module, *arguments], cwd=REPO_ROOT).returncode


def run_points(out: Path, points: list[tuple], model: str, passthrough: list[str], what: str) -> None:
    """One `dlcompare run` per point (framework, mode, batch, nodes, workers) into `out`;
    TuneError naming the first that failed (its record is stored with the reason)."""
    for framework, mode, batch, nodes, workers in points:
        code = dlcompare("launchers.compare", ["--frameworks", f"{framework}:{mode}", "--model", model,
                                               "--batch-size", str(batch), "--nodes", str(nodes),
                                               "--workers", str(workers), "--out", str(out), *passthrough])
        if code != 0:
            raise RuntimeError(f"{what}: dlcompare run of {framework}:{mode} b{batch} {nodes}×{workers} "
                               f"exited {code} (what it measured is stored in {out})")


def calibrate(out: Path, frameworks, workers: list[int], passthrough: list[str]) -> None:
    """The calibration of each scheme at the largest worker count, where none is stored."""
    most = max(workers)
    if most < 2:
        return
    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        fits = store.calibration_fits()
    missing_ones = [f"{fw}:{mode}" for fw, mode in frameworks
                    if not any(f.framework == fw and f.mode == mode and f.world_size == most for f in fits)]
    if missing_ones:
        cluster = [a for i, a in enumerate(passthrough) if a == "--cluster" or (i and passthrough[i - 1] == "--cluster")]
        code = dlcompare("launchers.calibrate", ["--frameworks", ",".join(missing_ones), "--workers", str(most),
                                                 "--max-bytes", "16M", "--out", str(out), *cluster])
        if code != 0:
            raise RuntimeError(f"calibration of {', '.join(missing_ones)} exited {code}")


# --------------------------------------------------------------------------- predicting

def predicted(out: Path, frameworks, model: str, batches, workers, nodes) -> pd.DataFrame:
    """Every point of the space with its predicted images/s and rank (TuneError where the
    stored profiles or calibration cannot predict it)."""
    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        records, fits = store.records(), store.calibration_fits()
    schemes = [f"{fw}:{mode}" for fw, mode in frameworks]
    rows = []
    for batch in batches:
        try:
            candidates = prediction.candidates(records, fits, model, batch, schemes, None, None, "ring")
            found = whatif.evaluate(candidates, nodes, workers, [None], [None], model)
        except (prediction.PredictError, whatif.WhatIfError) as error:
            raise TuneError(f"batch {batch}: {error}") from None
        rows += [{"scheme": row["scheme"], "batch_per_worker": batch, "nodes": row["nodes"],
                  "workers_per_node": row["workers_per_node"], "world_size": row["world_size"],
                  "predicted_images_per_s": batch * row["world_size"] / row["iter_time_s"]} for row in found]
    table = pd.DataFrame(rows)
    if table.empty:
        raise TuneError("the model predicts no point of this space")
    table = table.sort_values("predicted_images_per_s", ascending=False, kind="stable").reset_index(drop=True)
    return table.assign(predicted_rank=range(1, len(table) + 1))


def chosen(table: pd.DataFrame, top: int) -> pd.Series:
    """The predicted top-k, and each scheme's predicted best."""
    best = table.groupby("scheme")["predicted_rank"].transform("min") == table["predicted_rank"]
    return (table["predicted_rank"] <= top) | best


# --------------------------------------------------------------------------- the answer

def measured(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The campaign's verdict rows with the key the noise fit knows each by, and its runs frame."""
    with ResultStore.for_campaign(out, create=False, read_only=True) as store:
        frame = store.campaign_frame()
    rows = verdict.verdict_table(frame)
    return rows.assign(config_key=[noise.config_key(r) for r in rows.to_dict("records")]), frame


def pareto(table: pd.DataFrame) -> pd.Series:
    """Measured points no other measured point beats on images/s without more peak memory."""
    done = table[table["measured"]]
    front = pd.Series(False, index=table.index)
    for index, row in done.iterrows():
        memory = row["peak_memory_mib"] if not missing(row["peak_memory_mib"]) else 0.0
        beaten = ((done["images_per_s"] > row["images_per_s"])
                  & (done["peak_memory_mib"].fillna(0.0) <= memory)).any()
        front[index] = not beaten
    return front


def answer(table: pd.DataFrame, rows: pd.DataFrame, frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The space with what was measured, and the sentence: the measured winner and whether the
    model's first pick was it."""
    keyed = rows.assign(**{key: rows[key].astype(int) for key in ("batch_per_worker", "nodes", "workers_per_node")})
    merged = table.merge(keyed[[*POINT_KEYS, "images_per_s", "images_per_s_low", "images_per_s_high",
                                "peak_memory_mib", "config_key", "series"]],
                         on=POINT_KEYS, how="left")
    merged["measured"] = merged["images_per_s"].notna()
    merged["pareto"] = pareto(merged)
    done = merged[merged["measured"]].sort_values("images_per_s", ascending=False)
    if done.empty:
        return merged, "nothing of the space was measured"
    winner, first = done.iloc[0], merged.iloc[0]
    name = f"{winner['series']} b{winner['batch_per_worker']} {tables.topology_short(winner['nodes'], winner['workers_per_node'])}"
    text = (f"measured winner: {name} at {winner['images_per_s']:.0f} images/s; "
            f"{int(merged['measured'].sum())} of {len(merged)} points measured ({len(merged) - int(merged['measured'].sum())} "
            "not run); ")
    if not first["measured"]:
        return merged, text + "the model's first pick was not measured"
    if first["config_key"] == winner["config_key"]:
        return merged, text + "the model's first pick was the measured best"
    images = (winner["batch_per_worker"] * winner["world_size"]) / (first["batch_per_worker"] * first["world_size"])
    test = noise.compare(winner["config_key"], first["config_key"], noise.campaign_noise(frame), images_ratio=images)
    how = {True: "beyond the between-launch noise", False: "within the between-launch noise",
           None: "untestable with one launch each"}[test.beyond]
    return merged, (text + f"the model's first pick ({first['scheme']} b{first['batch_per_worker']}) measured "
                    f"{first['images_per_s']:.0f}, {test.margin_pct:.0f}% {test.interval_text()} behind: {how}")


def draw(table: pd.DataFrame, path: Path) -> Path:
    """Measured against predicted images/s, each scheme in its colour, the first pick ringed."""
    done = table[table["measured"]]
    fig, (ax,) = figures.new_panels(1)
    fig.set_size_inches(8.0, 6.0)
    for scheme, points in done.groupby("scheme", sort=True):
        framework, mode = scheme.split(":", 1)
        ax.scatter(points["predicted_images_per_s"], points["images_per_s"], color=scheme_colour(framework, mode),
                   s=40, label=scheme, zorder=3,
                   edgecolor=["black" if rank == 1 else "none" for rank in points["predicted_rank"]])
        for _, row in points.iterrows():
            ax.annotate(f"b{row['batch_per_worker']} {row['nodes']}×{row['workers_per_node']}",
                        (row["predicted_images_per_s"], row["images_per_s"]), xytext=(4, 3),
                        textcoords="offset points", fontsize=7)
    top = max(done["predicted_images_per_s"].max(), done["images_per_s"].max()) * 1.1 if len(done) else 1.0
    ax.plot([0, top], [0, top], color="#999999", linewidth=1, linestyle="--")
    ax.set(xlabel="predicted images/s", ylabel="measured images/s", xlim=(0, top), ylim=(0, top))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return figures.save_figure(fig, path, "measured against predicted (ringed: the first pick)")


def write(table: pd.DataFrame, sentence: str, out: Path) -> list[Path]:
    shown = table[TUNE_COLUMNS]
    (out / "tables").mkdir(parents=True, exist_ok=True)
    shown.to_csv(out / "tables" / "tune.csv", index=False)
    (out / "tables" / "tune.md").write_text(markdown_document(
        "Tune", shown, "Every point of the space: the model's predicted images/s and rank, which were measured "
        f"(the top-k and each scheme's best), what they measured, and the Pareto frontier against peak memory. "
        f"{sentence}."), encoding="utf-8")
    return [out / "tables" / "tune.csv", out / "tables" / "tune.md", draw(table, out / "figures" / "tune.png")]


def print_table(table: pd.DataFrame, console: Console) -> None:
    grid = Table(title="tune: predicted, then measured where chosen")
    for header in ("#", "scheme", "batch", "N×W", "predicted img/s", "measured img/s", "pareto"):
        grid.add_column(header, justify="left" if header == "scheme" else "right")
    for _, r in table.iterrows():
        grid.add_row(str(r["predicted_rank"]), r["scheme"], str(r["batch_per_worker"]),
                     tables.topology_short(r["nodes"], r["workers_per_node"]), f"{r['predicted_images_per_s']:.0f}",
                     "" if not r["measured"] else f"{r['images_per_s']:.0f} [{r['images_per_s_low']:.0f}–"
                                                  f"{r['images_per_s_high']:.0f}]" if not missing(r["images_per_s_low"])
                     else f"{r['images_per_s']:.0f}", "✓" if r["pareto"] else "")
    console.print(grid)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, passthrough = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.top < 1:
        return fail(f"--top must be at least 1, got {args.top}", EXIT_USAGE)
    out = Path(args.out).resolve()
    console = Console()
    try:
        frameworks, model, batches, workers, nodes = space(args)
        profiles = [(fw, mode, batch, 1, 1) for fw, mode in frameworks for batch in batches]
        run_points(out, profiles, model, passthrough, "profile")
        calibrate(out, frameworks, workers, passthrough)
        table = predicted(out, frameworks, model, batches, workers, nodes)
        table["chosen"] = chosen(table, args.top)
        points = [(*row["scheme"].split(":", 1), row["batch_per_worker"], row["nodes"], row["workers_per_node"])
                  for _, row in table[table["chosen"] & (table["world_size"] > 1)].iterrows()]
        run_points(out, points, model, passthrough, "measure")
        rows, frame = measured(out)
        table, sentence = answer(table, rows, frame)
    except (planning.UsageError, TuneError) as error:
        return fail(error, EXIT_USAGE)
    except StoreError as error:
        return fail(error, error.exit_code)
    except RuntimeError as error:
        return fail(error, EXIT_FAILED)
    print_table(table, console)
    written = write(table, sentence, out)
    console.print(sentence, soft_wrap=True)
    console.print(f"grid {grid_size(frameworks, batches, workers, nodes)} points; written: "
                  + ", ".join(str(p) for p in written), soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
