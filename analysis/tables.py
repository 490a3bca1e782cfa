"""The study's tables, computed from the runs frame of `ResultStore.runs_frame()`.

Every table groups by columns of the record (``framework_label``, ``mode``, ``model``,
``world_size`` ...), never by framework names, so a new adapter needs no change here.
Repeated runs of one configuration are summarised by the median over runs (robust to one
slow repeat); their count is kept in a ``runs`` column.

Scaling (weak scaling, a fixed per-worker batch, as the study ran it)::

    speedup     S(N) = N * t_iter(1) / t_iter(N)
    efficiency  E(N) = S(N) / N

where t_iter(1) is the median iteration time of the same framework on one worker with the
same per-worker batch.  N workers process N times the samples of one worker per
iteration, so S(N) is also throughput(N) / throughput(1); E = 1 is perfect scaling.  For
strong scaling (fixed global batch, ``scaling == "strong"``) the baseline is the one-worker
run whose batch equals the global batch and S(N) = t_iter(1) / t_iter(N).  Where no
one-worker baseline was measured the speedup is NaN: a baseline is never extrapolated.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from analysis.record import PHASES

# One measured configuration: the rows that repeated runs of it share.
CONFIG_KEYS: list[str] = ["model", "device", "framework", "framework_label", "mode",
                          "batch_per_worker", "nodes", "world_size"]

TABLE_NAMES: tuple[str, ...] = ("throughput", "phases", "scaling", "failures")

TABLE_TITLES: dict[str, str] = {
    "throughput": "Throughput",
    "phases": "Phase breakdown (profile mode)",
    "scaling": "Scaling: speedup and efficiency",
    "failures": "Failed runs",
}

TABLE_DESCRIPTIONS: dict[str, str] = {
    "throughput": "Images per second over all workers and iteration time in milliseconds: "
                  "median, 10th and 90th percentile over timed repeats (median over runs "
                  "where a configuration ran more than once).",
    "phases": "Seconds per iteration spent in each phase, measured with synchronised timers "
              "(profile mode); overlap is the fraction of communication hidden behind backward.",
    "scaling": "Weak scaling: speedup S(N) = N * t_iter(1) / t_iter(N) against the same "
               "framework's one-worker run with the same per-worker batch; efficiency E = S / N. "
               "NaN where no one-worker baseline was measured.",
    "failures": "Runs that failed or timed out, with the last line of the error.",
}

FAILURE_COLUMNS: list[str] = ["run_id", "framework_label", "mode", "model", "world_size",
                              "status", "error_last_line"]


class TablePaths(NamedTuple):
    """Where one table was written."""

    markdown: Path
    csv: Path


# --------------------------------------------------------------------------- preparation

def prepare(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy with the derived columns every table needs.

    ``framework_label`` falls back to ``framework``; ``device`` is the device name, else
    its kind; ``throughput`` is derived from global batch and iteration time where the
    worker did not report it; ``scaling`` defaults to weak (the study's setting).
    """
    frame = frame.copy()
    for column in CONFIG_KEYS + ["device_name", "device_kind", "status", "scaling", "run_id",
                                 "iter_time_median", "iter_time_p10", "iter_time_p90",
                                 "throughput", "throughput_per_worker", "global_batch", "error"]:
        if column not in frame.columns:
            frame[column] = None
    frame["framework_label"] = _fallback(frame["framework_label"], frame["framework"])
    frame["device"] = _fallback(_fallback(frame["device_name"], frame["device_kind"]),
                                pd.Series("unknown device", index=frame.index))
    frame["scaling"] = _fallback(frame["scaling"], pd.Series("weak", index=frame.index))
    for column in ("iter_time_median", "iter_time_p10", "iter_time_p90", "throughput",
                   "throughput_per_worker"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    global_batch = pd.to_numeric(frame["global_batch"], errors="coerce").astype("float64")
    derived = global_batch / frame["iter_time_median"]
    frame["throughput"] = frame["throughput"].fillna(derived)
    world = pd.to_numeric(frame["world_size"], errors="coerce").astype("float64")
    frame["throughput_per_worker"] = frame["throughput_per_worker"].fillna(frame["throughput"] / world)
    return frame


def _fallback(primary: pd.Series, secondary: pd.Series) -> pd.Series:
    """`primary` where it holds a non-empty value, else `secondary` (as plain objects)."""
    primary = primary.astype(object)
    empty = primary.isna() | (primary.astype(str).str.strip() == "")
    return primary.where(~empty, secondary.astype(object))


def ok_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Only successful runs: failed and timed-out rows have no trustworthy timings."""
    return frame[frame["status"] == "ok"] if "status" in frame.columns else frame.iloc[0:0]


def _group(frame: pd.DataFrame, keys: list[str] = CONFIG_KEYS):
    """Group by configuration, keeping rows whose keys are missing (NaN nodes etc.)."""
    return frame.groupby(keys, dropna=False, sort=True)


# --------------------------------------------------------------------------- tables

THROUGHPUT_COLUMNS: list[str] = CONFIG_KEYS + [
    "global_batch", "runs", "images_per_s", "images_per_s_per_worker",
    "iter_ms_median", "iter_ms_p10", "iter_ms_p90", "spread_pct"]


def _configs(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful runs summarised per configuration (median over repeated runs)."""
    ok = ok_runs(prepare(frame))
    if ok.empty:
        return pd.DataFrame(columns=THROUGHPUT_COLUMNS + ["scaling"])
    ok = ok.assign(iter_ms_median=ok["iter_time_median"] * 1e3, iter_ms_p10=ok["iter_time_p10"] * 1e3,
                   iter_ms_p90=ok["iter_time_p90"] * 1e3)
    table = _group(ok).agg(
        global_batch=("global_batch", "first"), scaling=("scaling", "first"), runs=("run_id", "size"),
        images_per_s=("throughput", "median"), images_per_s_per_worker=("throughput_per_worker", "median"),
        iter_ms_median=("iter_ms_median", "median"), iter_ms_p10=("iter_ms_p10", "median"),
        iter_ms_p90=("iter_ms_p90", "median"),
    ).reset_index()
    # Spread relative to the median: how much one iteration time varies between repeats.
    table["spread_pct"] = (table["iter_ms_p90"] - table["iter_ms_p10"]) / table["iter_ms_median"] * 100
    return table


def throughput_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: images/s (median) and iteration time median with p10-p90 spread."""
    return _configs(frame)[THROUGHPUT_COLUMNS]


def phase_columns(frame: pd.DataFrame, predicted: bool = False) -> list[str]:
    """The runs frame's per-phase columns, study order first, in the order they appear."""
    suffix = "_pred_s" if predicted else "_s"
    found = [c for c in frame.columns if c.startswith("phase_") and c.endswith(suffix)
             and (predicted or not c.endswith("_pred_s"))]
    ordered = [f"phase_{p}{suffix}" for p in PHASES if f"phase_{p}{suffix}" in found]
    return ordered + [c for c in found if c not in ordered]


def phase_name(column: str) -> str:
    """``phase_backward_pred_s`` -> ``backward``."""
    name = column[len("phase_"):]
    for suffix in ("_pred_s", "_s"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def phase_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per configuration measured in profile mode: seconds per phase, their sum, overlap.

    Predicted per-phase columns (``<phase>_pred_s``) appear only when the performance model
    filled some, so the measured and predicted times can be read side by side.
    """
    frame = prepare(frame)
    measured = phase_columns(frame)
    predicted = [c for c in phase_columns(frame, predicted=True)
                 if pd.to_numeric(frame[c], errors="coerce").notna().any()]
    ok = ok_runs(frame)
    if measured:
        ok = ok[ok[measured].notna().any(axis=1)]
    names = [f"{phase_name(c)}_s" for c in measured]
    pred_names = [f"{phase_name(c)}_pred_s" for c in predicted]
    columns = (CONFIG_KEYS + ["runs"] + names + ["phase_sum_s", "profile_iter_s", "overlap"] + pred_names
               + ["predicted_iter_s", "prediction_error"])
    if ok.empty or not measured:
        return pd.DataFrame(columns=columns)
    ok = ok.rename(columns=dict(zip(measured + predicted, names + pred_names)))
    ok = ok.assign(profile_iter_s=_numeric(ok, "profile_iter_time"), overlap=_numeric(ok, "overlap"),
                   predicted_iter_s=_numeric(ok, "predicted_iter_time"),
                   prediction_error=_numeric(ok, "prediction_error"))
    aggregations = {name: (name, "median") for name in
                    names + pred_names + ["profile_iter_s", "overlap", "predicted_iter_s", "prediction_error"]}
    table = _group(ok).agg(runs=("run_id", "size"), **aggregations).reset_index()
    table["phase_sum_s"] = table[names].sum(axis=1, min_count=1)
    return table[columns]


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(math.nan, index=frame.index, dtype="float64")
    return pd.to_numeric(frame[column], errors="coerce").astype("float64")


def speedup(t_one: float, t_n: float, workers: int, scaling: str = "weak") -> float:
    """S(N) = N * t(1) / t(N) for weak scaling, t(1) / t(N) for strong; NaN if unknown."""
    if _missing(t_one) or _missing(t_n) or _missing(workers) or t_n <= 0:
        return math.nan
    return float(t_one / t_n if scaling == "strong" else workers * t_one / t_n)


def efficiency(speedup_n: float, workers: int) -> float:
    """E(N) = S(N) / N: 1.0 when N workers are exactly N times as productive as one."""
    if _missing(speedup_n) or _missing(workers) or workers <= 0:
        return math.nan
    return float(speedup_n / workers)


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


SCALING_COLUMNS: list[str] = ["model", "device", "framework", "framework_label", "mode", "scaling",
                               "batch_per_worker", "nodes", "world_size", "iter_ms_median", "baseline_mode",
                               "baseline_iter_ms", "speedup", "efficiency"]


def configs_with_speedup(frame: pd.DataFrame) -> pd.DataFrame:
    """Every successful configuration (throughput columns) with its speedup and efficiency.

    The baseline is the one-worker (one node) configuration of the same model and device with
    the same per-worker batch (weak) or a batch equal to the global batch (strong): first of
    the same label and mode; failing that, of the same framework under another mode when that
    choice is unambiguous (mode ``single`` if present, else the only one).  The
    ``baseline_mode`` column says which was used; no baseline gives NaN.
    """
    table = _configs(frame)
    extra = ["baseline_mode", "baseline_iter_ms", "speedup", "efficiency"]
    if table.empty:
        return pd.DataFrame(columns=list(table.columns) + extra)
    singles = table[_mask(table["world_size"] == 1) & _mask(table["nodes"].fillna(1) == 1)]
    found = []
    for _, row in table.iterrows():
        baseline = _baseline(singles, row)
        t_one = math.nan if baseline is None else float(baseline["iter_ms_median"])
        s = speedup(t_one, row["iter_ms_median"], row["world_size"], row["scaling"])
        found.append({"baseline_mode": None if baseline is None else baseline["mode"],
                      "baseline_iter_ms": t_one, "speedup": s, "efficiency": efficiency(s, row["world_size"])})
    return pd.concat([table, pd.DataFrame(found, index=table.index, columns=extra)], axis=1)


def scaling_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Speedup S(N) and efficiency E(N) of every configuration (see `configs_with_speedup`)."""
    return configs_with_speedup(frame).reindex(columns=SCALING_COLUMNS)


def _mask(condition: pd.Series) -> pd.Series:
    """A boolean mask in which a comparison with a missing value counts as False."""
    return condition.astype("boolean").fillna(False).astype(bool)


def _baseline(singles: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The one-worker configuration `row` is measured against, or None (see scaling_table)."""
    batch = row["global_batch"] if row["scaling"] == "strong" else row["batch_per_worker"]
    if _missing(batch):
        return None
    same = singles[_mask(singles["model"] == row["model"]) & _mask(singles["device"] == row["device"])
                   & _mask(singles["batch_per_worker"] == batch)]
    exact = same[_mask(same["framework_label"] == row["framework_label"]) & _same(same["mode"], row["mode"])]
    if len(exact):
        return exact.iloc[0]
    others = same[_mask(same["framework"] == row["framework"])]
    single = others[_mask(others["mode"] == "single")]
    if len(single):
        return single.iloc[0]
    return others.iloc[0] if len(others) and others["mode"].nunique(dropna=False) == 1 else None


def _same(series: pd.Series, value) -> pd.Series:
    """Equality that also matches missing with missing (a mode left empty)."""
    if _missing(value):
        return series.isna()
    return _mask(series == value)


def error_last_line(error) -> str:
    """The last non-empty line of an error tail: usually the exception and its message."""
    if _missing(error) or not str(error).strip():
        return ""
    line = [ln.strip() for ln in str(error).splitlines() if ln.strip()][-1]
    return line if len(line) <= 200 else line[:199] + "…"


def failures_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs that did not finish ok: listed apart so that they never skew the medians."""
    prepared = prepare(frame)
    failed = prepared[prepared["status"].notna() & (prepared["status"] != "ok")]
    if failed.empty:
        return pd.DataFrame(columns=FAILURE_COLUMNS)
    failed = failed.assign(error_last_line=[error_last_line(e) for e in failed["error"]])
    return failed[FAILURE_COLUMNS].reset_index(drop=True)


def build_tables(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """All tables of the report, by name (see `TABLE_NAMES`)."""
    return {"throughput": throughput_table(frame), "phases": phase_table(frame),
            "scaling": scaling_table(frame), "failures": failures_table(frame)}


# --------------------------------------------------------------------------- formatting

def float_format(column: str) -> str:
    """A readable format per kind of column (ms with 2 decimals, seconds with 4, ...)."""
    if column.endswith("_pct") or column.startswith("images_per_s"):
        return ".1f"
    if "_ms" in column:
        return ".2f"
    if column.endswith("_s"):
        return ".4f"
    if column in ("speedup", "efficiency", "overlap", "prediction_error"):
        return ".3f"
    return "g"


def display_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Object columns with None for missing values, so that they print as a dash."""
    shown = table.astype(object)
    return shown.where(table.notna(), None)


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table; missing values as an em dash."""
    if table.empty:
        return "_No rows._\n"
    formats = [float_format(c) for c in table.columns]
    return display_frame(table).to_markdown(index=False, floatfmt=formats, missingval="—") + "\n"


def write_tables(frame: pd.DataFrame, out_dir: str | Path) -> dict[str, TablePaths]:
    """Write every table as ``tables/<name>.md`` and ``tables/<name>.csv`` under `out_dir`.

    Markdown is for reading (rounded, with a title and what the table means); CSV keeps full
    precision for further analysis.  Empty tables are written too, so that a campaign's
    folder always has the same files.
    """
    folder = Path(out_dir) / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, table in build_tables(frame).items():
        md = folder / f"{name}.md"
        csv = folder / f"{name}.csv"
        md.write_text(f"# {TABLE_TITLES[name]}\n\n{TABLE_DESCRIPTIONS[name]}\n\n{to_markdown(table)}",
                      encoding="utf-8")
        table.to_csv(csv, index=False)
        written[name] = TablePaths(md, csv)
    return written
