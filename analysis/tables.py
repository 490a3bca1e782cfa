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

import json
import math
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from core import schemes as catalogue
from analysis.record import PHASES
from analysis.rendering import flatten_columns, markdown_document, missing, to_latex
from analysis.rendering import to_markdown  # noqa: F401 (analysis.whatif prints with tables.to_markdown)

# One measured configuration: the rows that repeated runs of it share.
# The topology is (nodes, workers per node): 1 node x 2 workers and 2 nodes x 1 worker are
# different configurations with the same world size, never merged.
CONFIG_KEYS: list[str] = ["model", "device", "framework", "framework_label", "mode",
                          "batch_per_worker", "nodes", "workers_per_node", "world_size", "bandwidth", "latency"]

TABLE_NAMES: tuple[str, ...] = ("throughput", "phases", "scaling", "runs", "layers", "prediction",
                                "prediction_summary", "calibration", "failures")

TABLE_TITLES: dict[str, str] = {
    "verdict": "Verdict",
    "noise": "Noise between launches",
    "throughput": "Throughput",
    "phases": "Phase breakdown (profile mode)",
    "scaling": "Scaling: speedup and efficiency",
    "runs": "Runs: the machine each saw, and the loss",
    "layers": "Backward time per layer",
    "prediction": "Performance model: predicted against measured",
    "prediction_summary": "Performance model: error per scheme",
    "calibration": "Calibration of the communication model",
    "failures": "Failed runs",
}

TABLE_DESCRIPTIONS: dict[str, str] = {
    "noise": "Per configuration: its launches' median iteration times in milliseconds, in launch order, and its own "
             "between-launch coefficient of variation (sd of log time, %), beside the campaign's pooled noise that "
             "the verdict's test uses (analysis.noise).",
    "verdict": "Per model and topology (nodes x workers per node): the synchronous schemes ranked by images/s; "
               "scheme as the command line spells it (FRAMEWORK:MODE); launches, images/s (the median over launches) "
               "with its interval, each configuration's own between-launch CV; the winner's margin over the next "
               "with its interval, the test's p and whether it is beyond the between-launch noise (analysis.noise: "
               "true, false, or empty where one launch cannot test it), and where it is not, the launches each that "
               "would resolve it; for each scheme the efficiency and the speedup (with their interval) against "
               "its own one-worker run (the baseline column names it) and where the lost time per iteration "
               "went, in milliseconds: slower compute "
               "(forward and backward of each worker against the one-worker run), communication left exposed "
               "after backward, skew (waiting for the slowest rank), I/O, update, and the rest that the profile "
               "does not place.",
    "throughput": "Images per second over all workers and iteration time in milliseconds: "
                  "median, 10th and 90th percentile over timed repeats (median over runs "
                  "where a configuration ran more than once).",
    "phases": "Milliseconds per iteration spent in each phase, measured with synchronised timers "
              "(profile mode) with communication run after backward; profile_iter_ms is the profile iteration "
              "with communication run the framework's own way (overlapped where it overlaps), iter_ms the "
              "throughput-mode iteration (no extra synchronisation); overlap is the fraction of communication "
              "hidden behind backward.",
    "scaling": "Weak scaling: speedup S(N) = N * t_iter(1) / t_iter(N) against the same "
               "framework's one-worker run with the same per-worker batch; efficiency E = S / N. "
               "NaN where no one-worker baseline was measured.",
    "runs": "Every run: the threads each worker used, the machine's cores and how many ranks shared one machine "
            "(oversubscribed: ranks x threads above the cores on a CPU run), the 1-minute load average when its "
            "timed loops began and ended, the cores other processes kept busy meanwhile, the largest peak memory "
            "of its ranks in MiB (device memory where the framework tracks it on a GPU, else the resident set), "
            "the loss at the first "
            "and last timed iteration (it should fall, or at least not explode), and the run's wall time.",
    "layers": "Milliseconds of backward per layer with parameters, in backward order (the time from the previous "
              "such layer's gradient being final to this one's), per scheme and topology (median over runs); "
              "source: measured per layer by the framework's hooks, or the measured backward split by the "
              "layers' FLOPs.",
    "prediction": "Per configuration: measured iteration time (throughput mode, median) and the model's "
                  "prediction, error = (predicted - measured) / measured; the communication phase measured "
                  "after backward and predicted; the predicted communication left exposed after backward; the "
                  "measured and predicted share of communication hidden behind backward; the basis (calibrated "
                  "alpha-beta, or the run's own measured communication when no calibration is stored) and the "
                  "source of the per-layer backward times (hooks, or the backward split by FLOPs); and the "
                  "prediction from the one-worker profile instead of the run's own.",
    "prediction_summary": "Median and largest |error| of the model per framework and mode, over all runs and over "
                          "the runs with more than one worker (where the aggregation scheme matters).",
    "calibration": "alpha (milliseconds per message), beta (seconds per byte, also as a link speed) and gamma (seconds "
                   "per byte summed) per transport, from T(n) = a + b n fitted to the collective's time for 1 KB .. "
                   "64 MB messages (python -m launchers.calibrate) and inverted with the algorithm's "
                   "coefficients (ring: a = 2(p-1) alpha, b = 2(p-1)/p beta + (p-1)/p gamma).",
    "failures": "Runs that failed or timed out, with the last line of the error.",
}

FAILURE_COLUMNS: list[str] = ["run_id", "framework_label", "mode", "model", "nodes", "workers_per_node",
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
    for column in ("bandwidth", "latency"):  # emulated links; "" where none was shaped
        frame[column] = frame[column].astype(object).where(frame[column].notna(), "")
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
    nodes = pd.to_numeric(frame["nodes"], errors="coerce").astype("float64")
    frame["nodes"] = nodes.fillna(1.0).astype("Int64")
    per_node = pd.to_numeric(frame["workers_per_node"], errors="coerce").astype("float64")
    frame["workers_per_node"] = per_node.fillna((world / frame["nodes"].astype("float64")).round()).astype("Int64")
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
    """Per configuration measured in profile mode: milliseconds per phase, their sum, the
    overlapped profile iteration, the throughput-mode iteration, overlap.

    Predicted per-phase columns (``<phase>_pred_ms``) appear only when the performance model
    filled some, so the measured and predicted times can be read side by side.
    """
    frame = prepare(frame)
    measured = phase_columns(frame)
    predicted = [c for c in phase_columns(frame, predicted=True)
                 if pd.to_numeric(frame[c], errors="coerce").notna().any()]
    ok = ok_runs(frame)
    if measured:
        ok = ok[ok[measured].notna().any(axis=1)]
    names = [f"{phase_name(c)}_ms" for c in measured]
    pred_names = [f"{phase_name(c)}_pred_ms" for c in predicted]
    columns = (CONFIG_KEYS + ["runs"] + names + ["phase_sum_ms", "profile_iter_ms", "iter_ms", "overlap"]
               + pred_names + ["predicted_iter_ms", "prediction_error"])
    if ok.empty or not measured:
        return pd.DataFrame(columns=columns)
    in_ms = {new: _numeric(ok, old) * 1e3 for old, new in zip(measured + predicted, names + pred_names)}
    ok = ok.assign(**in_ms, profile_iter_ms=_numeric(ok, "profile_iter_time") * 1e3,
                   iter_ms=_numeric(ok, "iter_time_median") * 1e3, overlap=_numeric(ok, "overlap"),
                   predicted_iter_ms=_numeric(ok, "predicted_iter_time") * 1e3,
                   prediction_error=_numeric(ok, "prediction_error"))
    aggregations = {name: (name, "median") for name in
                    names + pred_names + ["profile_iter_ms", "iter_ms", "overlap", "predicted_iter_ms",
                                          "prediction_error"]}
    table = _group(ok).agg(runs=("run_id", "size"), **aggregations).reset_index()
    table["phase_sum_ms"] = table[names].sum(axis=1, min_count=1)
    return table[columns]


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(math.nan, index=frame.index, dtype="float64")
    return pd.to_numeric(frame[column], errors="coerce").astype("float64")


def speedup(t_one: float, t_n: float, workers: int, scaling: str = "weak") -> float:
    """S(N) = N * t(1) / t(N) for weak scaling, t(1) / t(N) for strong; NaN if unknown."""
    if missing(t_one) or missing(t_n) or missing(workers) or t_n <= 0:
        return math.nan
    return float(t_one / t_n if scaling == "strong" else workers * t_one / t_n)


def efficiency(speedup_n: float, workers: int) -> float:
    """E(N) = S(N) / N: 1.0 when N workers are exactly N times as productive as one."""
    if missing(speedup_n) or missing(workers) or workers <= 0:
        return math.nan
    return float(speedup_n / workers)


SCALING_COLUMNS: list[str] = ["model", "device", "framework", "framework_label", "mode", "scaling",
                               "batch_per_worker", "nodes", "workers_per_node", "world_size", "iter_ms_median", "baseline_mode",
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
    by_key: dict = {}  # (model, device, batch) -> the one-worker rows that may serve as baseline
    for _, single in singles.iterrows():
        by_key.setdefault((single["model"], single["device"], single["batch_per_worker"]), []).append(single)
    found = []
    for _, row in table.iterrows():
        batch = row["global_batch"] if row["scaling"] == "strong" else row["batch_per_worker"]
        candidates = [] if missing(batch) else by_key.get((row["model"], row["device"], batch), [])
        baseline = _baseline_among(candidates, row)
        t_one = math.nan if baseline is None else float(baseline["iter_ms_median"])
        s = speedup(t_one, row["iter_ms_median"], row["world_size"], row["scaling"])
        found.append({"baseline_mode": None if baseline is None else baseline["mode"],
                      "baseline_iter_ms": t_one, "speedup": s, "efficiency": efficiency(s, row["world_size"])})
    return pd.concat([table, pd.DataFrame(found, index=table.index, columns=extra)], axis=1)


def scaling_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Speedup S(N) and efficiency E(N) of every configuration (see `configs_with_speedup`)."""
    return configs_with_speedup(frame).reindex(columns=SCALING_COLUMNS)


RUNS_COLUMNS: list[str] = ["scheme", "model", "topology", "batch_per_worker", "threads_per_worker", "cpu_cores",
                           "ranks_per_host", "oversubscribed", "load_avg_start", "load_avg_end", "other_load",
                           "peak_memory_mib", "peak_memory_kind", "loss_first", "loss_last", "duration_s", "run_id"]


def topology_short(nodes, workers_per_node) -> str:
    """'1×2': nodes × workers per node, how every figure and the verdict name a topology."""
    nodes = 1 if missing(nodes) else int(nodes)
    return f"{nodes}×{'?' if missing(workers_per_node) else int(workers_per_node)}"


def links_text(bandwidth, latency) -> str:
    """'1Gbit 100us' for a run on emulated links, '' for one without."""
    return " ".join(str(v) for v in (bandwidth, latency) if not missing(v) and str(v).strip())


def runs_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Every successful run with the machine it saw (threads, cores, sharing, load) and its
    first and last loss: what tells a slow or odd run apart from a slow scheme."""
    ok = ok_runs(prepare(frame))
    if ok.empty:
        return pd.DataFrame(columns=RUNS_COLUMNS)
    ok = ok.assign(topology=[topology_short(n, w) for n, w in zip(ok["nodes"], ok["workers_per_node"])],
                   scheme=[series_name(lb, m) for lb, m in zip(ok["framework_label"], ok["mode"])],
                   oversubscribed=_numeric(ok, "oversubscribed").map(
                       lambda v: None if missing(v) else ("yes" if v else "no")),
                   peak_memory_mib=_numeric(ok, "extra_peak_memory_bytes") / 2**20,
                   peak_memory_kind=ok["extra_peak_memory_kind"] if "extra_peak_memory_kind" in ok else None)
    for column in RUNS_COLUMNS:
        if column not in ok.columns:
            ok[column] = None
    return ok[RUNS_COLUMNS].sort_values(["model", "scheme", "topology"]).reset_index(drop=True)


LAYER_COLUMNS: list[str] = ["model", "framework", "framework_label", "mode", "nodes", "workers_per_node", "topology",
                            "layer", "order", "backward_ms", "source"]


def layer_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Long table of backward milliseconds per layer with parameters (backward order), median
    over the runs of each configuration, from the records' ``layer_backward_s``."""
    ok = ok_runs(prepare(frame))
    column = "extra_layer_backward_s"
    if ok.empty or column not in ok.columns:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    rows = []
    fields = ["model", "framework", "framework_label", "mode", "nodes", "workers_per_node"]
    sources = ok["extra_layer_backward_source"] if "extra_layer_backward_source" in ok.columns \
        else pd.Series(None, index=ok.index)
    for run, layers, source in zip(ok[fields].to_dict("records"), ok[column], sources):
        run = {**run, "topology": topology_short(run["nodes"], run["workers_per_node"]),
               "source": None if missing(source) else source}
        for order, item in enumerate(json_list(layers)):
            if isinstance(item, (list, tuple)) and len(item) == 2 and not missing(item[1]):
                rows.append({**run, "layer": str(item[0]), "order": order, "backward_ms": float(item[1]) * 1e3})
    if not rows:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    long = pd.DataFrame(rows)
    keys = ["model", "framework", "framework_label", "mode", "nodes", "workers_per_node", "topology", "layer"]
    table = long.groupby(keys, dropna=False, sort=False).agg(
        order=("order", "min"), backward_ms=("backward_ms", "median"), source=("source", "first")).reset_index()
    return table.sort_values(["model", "framework_label", "mode", "topology", "order"])[LAYER_COLUMNS] \
        .reset_index(drop=True)


def json_list(value) -> list:
    """A list stored as JSON text (how the store flattens the record's lists), or []."""
    if isinstance(value, list):
        return value
    if missing(value) or not str(value).strip():
        return []
    try:
        decoded = json.loads(value)
    except ValueError:
        return []
    return decoded if isinstance(decoded, list) else []


def _mask(condition: pd.Series) -> pd.Series:
    """A boolean mask in which a comparison with a missing value counts as False."""
    return condition.astype("boolean").fillna(False).astype(bool)


def _baseline_among(candidates: list, row: pd.Series) -> pd.Series | None:
    """`_baseline` over one-worker rows already of the same model, device and batch (plain
    Python: scaling tables of large campaigns call this once per configuration)."""
    def same(a, b) -> bool:
        return (missing(a) and missing(b)) or (not missing(a) and not missing(b) and a == b)

    exact = [c for c in candidates if same(c["framework_label"], row["framework_label"]) and same(c["mode"], row["mode"])]
    if exact:
        return exact[0]
    others = [c for c in candidates if same(c["framework"], row["framework"])]
    single = [c for c in others if same(c["mode"], "single")]
    if single:
        return single[0]
    modes = {None if missing(c["mode"]) else c["mode"] for c in others}
    return others[0] if others and len(modes) == 1 else None


def _baseline(singles: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The one-worker configuration `row` is measured against, or None (see scaling_table)."""
    batch = row["global_batch"] if row["scaling"] == "strong" else row["batch_per_worker"]
    if missing(batch):
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
    if missing(value):
        return series.isna()
    return _mask(series == value)


def error_last_line(error) -> str:
    """The last non-empty line of an error tail: usually the exception and its message."""
    if missing(error) or not str(error).strip():
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


def build_tables(frame: pd.DataFrame, calibrations: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """All tables of the report, by name (see `TABLE_NAMES`); `calibrations` is the store's
    `calibration_frame()`."""
    return {"throughput": throughput_table(frame), "phases": phase_table(frame),
            "scaling": scaling_table(frame), "runs": runs_table(frame), "layers": layer_table(frame),
            "prediction": prediction_table(frame),
            "prediction_summary": prediction_summary(frame), "calibration": calibration_table(calibrations),
            "failures": failures_table(frame)}


def write_tables(frame: pd.DataFrame, out_dir: str | Path, calibrations: pd.DataFrame | None = None,
                 built: dict[str, pd.DataFrame] | None = None) -> dict[str, TablePaths]:
    """Write every table as ``tables/<name>.md`` and ``tables/<name>.csv`` under `out_dir`,
    and the study's tables (`write_study_tables`) also as LaTeX.

    Markdown is for reading (rounded, with a title and what the table means); CSV keeps full
    precision for further analysis.  Empty tables are written too, so that a campaign's
    folder always has the same files.  `built`: tables already computed by `build_tables`.
    """
    folder = Path(out_dir) / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    built = built or build_tables(frame, calibrations)
    write_study_tables(frame, out_dir, {k: v for k, v in built.items() if k.startswith("study_")} or None)
    for name, table in built.items():
        if name.startswith("study_"):
            continue
        md = folder / f"{name}.md"
        csv = folder / f"{name}.csv"
        md.write_text(markdown_document(TABLE_TITLES[name], table, TABLE_DESCRIPTIONS[name]),
                      encoding="utf-8")
        table.to_csv(csv, index=False)
        written[name] = TablePaths(md, csv)
    return written


# --------------------------------------------------------------------------- the performance model

PREDICTION_COLUMNS: list[str] = [
    "model", "device", "framework", "framework_label", "mode", "batch_per_worker", "nodes", "workers_per_node",
    "world_size", "runs", "measured_ms", "predicted_ms", "error_pct", "comm_measured_ms", "comm_predicted_ms",
    "comm_exposed_pred_ms", "overlap", "hidden_pred", "basis", "layer_source", "from_1_worker_ms",
    "from_1_worker_error_pct"]

PREDICTION_SUMMARY_COLUMNS: list[str] = [
    "framework_label", "mode", "runs", "median_abs_error_pct", "median_error_pct", "max_abs_error_pct",
    "multi_worker_runs", "multi_worker_median_abs_error_pct", "calibrated_runs", "from_1_worker_median_abs_error_pct"]

CALIBRATION_TABLE_COLUMNS: list[str] = [
    "framework", "mode", "transport", "algorithm", "device_kind", "nodes", "world_size", "alpha_ms",
    "beta_ns_per_byte", "link_gbit_s", "gamma_ns_per_byte", "kappa", "kappa_c", "fit_a_ms", "fit_b_ns_per_byte",
    "rel_rmse_pct", "n_sizes", "repeats", "measured_at", "windows", "drift_a_pct", "drift_b_pct"]


def prediction_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: measured and predicted iteration time and their relative error
    (predicted - measured) / measured, the communication phase measured (separated, after
    backward) and predicted, the predicted exposed communication, measured and predicted
    share hidden behind backward, the basis of the prediction (calibrated, measured comm, single
    worker) and where the per-layer backward times came from; the prediction from the
    one-worker profile (what-if) and its error where the campaign has that run."""
    frame = prepare(frame)
    ok = ok_runs(frame)
    predicted = _numeric(ok, "predicted_iter_time")
    ok = ok[predicted.notna()]
    if ok.empty:
        return pd.DataFrame(columns=PREDICTION_COLUMNS)
    ok = ok.assign(
        measured_ms=ok["iter_time_median"] * 1e3, predicted_ms=_numeric(ok, "predicted_iter_time") * 1e3,
        error_pct=_numeric(ok, "prediction_error") * 100, comm_measured_ms=_numeric(ok, "phase_comm_s") * 1e3,
        comm_predicted_ms=_numeric(ok, "phase_comm_pred_s") * 1e3,
        comm_exposed_pred_ms=_numeric(ok, "extra_prediction_comm_exposed_s") * 1e3,
        overlap=_numeric(ok, "overlap"), hidden_pred=_numeric(ok, "extra_prediction_hidden_fraction"),
        basis=_text(ok, "extra_prediction_basis"), layer_source=_text(ok, "extra_prediction_layer_source"),
        from_1_worker_ms=_numeric(ok, "extra_prediction_from_single_worker_s") * 1e3,
        from_1_worker_error_pct=_numeric(ok, "extra_prediction_from_single_worker_error") * 100)
    numbers = ["measured_ms", "predicted_ms", "error_pct", "comm_measured_ms", "comm_predicted_ms",
               "comm_exposed_pred_ms", "overlap", "hidden_pred", "from_1_worker_ms", "from_1_worker_error_pct"]
    aggregations = {name: (name, "median") for name in numbers}
    table = _group(ok).agg(runs=("run_id", "size"), basis=("basis", "first"), layer_source=("layer_source", "first"),
                           **aggregations).reset_index()
    return table[PREDICTION_COLUMNS]


def _text(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(None, index=frame.index, dtype=object)
    return frame[column].astype(object).where(frame[column].notna(), None)


def prediction_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per framework and mode: the median and largest |relative error| of the model over all
    runs, the same over runs with more than one worker (where the scheme matters), how many
    of those were calibrated, and the median |error| of the one-worker-profile prediction."""
    frame = prepare(frame)
    ok = ok_runs(frame)
    ok = ok[_numeric(ok, "prediction_error").notna()]
    if ok.empty:
        return pd.DataFrame(columns=PREDICTION_SUMMARY_COLUMNS)
    rows = []
    for (label, mode), runs in ok.groupby(["framework_label", "mode"], dropna=False, sort=True):
        error = _numeric(runs, "prediction_error") * 100
        multi = runs[pd.to_numeric(runs["world_size"], errors="coerce") > 1]
        multi_error = _numeric(multi, "prediction_error") * 100
        basis = _text(multi, "extra_prediction_basis")
        single = (_numeric(multi, "extra_prediction_from_single_worker_error") * 100).abs()
        rows.append({"framework_label": label, "mode": mode, "runs": len(runs),
                     "median_abs_error_pct": error.abs().median(), "median_error_pct": error.median(),
                     "max_abs_error_pct": error.abs().max(), "multi_worker_runs": len(multi),
                     "multi_worker_median_abs_error_pct": multi_error.abs().median() if len(multi) else math.nan,
                     "calibrated_runs": int(basis.fillna("").str.startswith("calibrated").sum()),
                     "from_1_worker_median_abs_error_pct": single.median() if single.notna().any() else math.nan})
    return pd.DataFrame(rows, columns=PREDICTION_SUMMARY_COLUMNS)


def calibration_table(calibrations: pd.DataFrame | None) -> pd.DataFrame:
    """The stored calibrations (`ResultStore.calibration_frame`) in readable units: link-level
    alpha (ms), beta (ns/B and as a link speed), gamma, the contention shares kappa (of its
    pace backward loses beside a transfer) and kappa_c (a transfer beside backward), the
    fitted whole-collective
    T(n) = a + b n with its relative rms error.  A calibration pooled from several (`compare
    --calibrate` calibrates before and after its runs) shows how many, and how far the last
    one's own a and b moved from the first's (drift, %)."""
    if calibrations is None or calibrations.empty:
        return pd.DataFrame(columns=CALIBRATION_TABLE_COLUMNS)
    c = calibrations
    windows = c["windows"] if "windows" in c else pd.Series([[]] * len(c), index=c.index)

    def drift(key):
        return windows.map(lambda w: (w[-1][key] / w[0][key] - 1) * 100
                           if len(w) > 1 and w[0][key] > 0 else float("nan"))

    table = pd.DataFrame({
        "framework": c["framework"], "mode": c["mode"], "transport": c["transport"], "algorithm": c["algorithm"],
        "device_kind": c["device_kind"], "nodes": c["nodes"], "world_size": c["world_size"],
        "alpha_ms": c["alpha_s"] * 1e3, "beta_ns_per_byte": c["beta_s_per_byte"] * 1e9,
        "link_gbit_s": (8 / c["beta_s_per_byte"] / 1e9).where(c["beta_s_per_byte"] > 0),
        "gamma_ns_per_byte": c["gamma_s_per_byte"] * 1e9, "kappa": c["contention"].fillna(0.0),
        "kappa_c": c["transfer_contention"].fillna(0.0), "fit_a_ms": c["fit_a_s"] * 1e3,
        "fit_b_ns_per_byte": c["fit_b_s_per_byte"] * 1e9, "rel_rmse_pct": c["rel_rmse"] * 100,
        "n_sizes": c["n_sizes"], "repeats": c["repeats"], "measured_at": c["measured_at"],
        "windows": windows.map(lambda w: max(1, len(w))), "drift_a_pct": drift("fit_a_s"),
        "drift_b_pct": drift("fit_b_s_per_byte")})
    return table[CALIBRATION_TABLE_COLUMNS]


# --------------------------------------------------------------------------- the study's tables

STUDY_TOPOLOGIES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (1, 4), (2, 2), (4, 4))  # (nodes, workers)


def topology_label(nodes, world_size) -> str:
    """'1 worker', '4 workers', '2 nodes', '2 nodes (8 workers)'."""
    nodes = 1 if missing(nodes) else int(nodes)
    world = 0 if missing(world_size) else int(world_size)
    if nodes <= 1:
        return f"{world} worker" + ("" if world == 1 else "s")
    return f"{nodes} nodes" + ("" if world == nodes else f" ({world} workers)")


FRAMEWORK_BY_LABEL = {facts.label: name for name, facts in catalogue.FRAMEWORKS.items()}


def series_name(label, mode) -> str:
    """How a scheme is named in tables and legends, from a record's framework label and mode:
    the scheme catalogue's label ('PyTorch DDP', 'TensorFlow (ps)', 'CNTK-style'); for a
    framework the catalogue lacks, the label with its mode."""
    label = "" if missing(label) else str(label)
    mode = None if missing(mode) or not str(mode) else str(mode)
    if label in FRAMEWORK_BY_LABEL:
        return catalogue.label_of(FRAMEWORK_BY_LABEL[label], mode, label)
    if mode is None:
        return label or "?"
    return f"{label} ({mode})" if label else mode


def study_scaling_tables(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The study's multi-worker table per model: frameworks as rows; as columns the
    topologies 1, 2, 4 workers and 2, 4 nodes (plus any other measured), each with iteration
    time (ms), speedup S and efficiency E.  Columns are a two-level index (topology,
    quantity); unmeasured cells are NaN."""
    configs = configs_with_speedup(frame)
    out = {}
    if configs.empty:
        return out
    configs = configs.assign(topology=[topology_label(n, w) for n, w in zip(configs["nodes"], configs["world_size"])],
                             framework_row=[series_name(lb, m) for lb, m in zip(configs["framework_label"], configs["mode"])])
    for model, rows in configs.groupby("model", sort=True):
        several = rows.groupby("framework_row")[["batch_per_worker", "device"]].nunique().max().max() > 1
        measured = sorted({(1 if missing(n) else int(n), int(w)) for n, w in zip(rows["nodes"], rows["world_size"])})
        order = [topology_label(n, w) for n, w in STUDY_TOPOLOGIES]
        order += [t for t in (topology_label(n, w) for n, w in measured) if t not in order]
        index_keys = ["framework_row"] + (["batch_per_worker", "device"] if several else [])
        table = {}
        for key, group in rows.groupby(index_keys, sort=True, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            cells = {}
            for topology in order:
                hit = group[group["topology"] == topology]
                first = hit.iloc[0] if len(hit) else None
                cells[(topology, "ms")] = math.nan if first is None else float(first["iter_ms_median"])
                cells[(topology, "S")] = math.nan if first is None else float(first["speedup"])
                cells[(topology, "E")] = math.nan if first is None else float(first["efficiency"])
            table[key] = cells
        wide = pd.DataFrame.from_dict(table, orient="index")
        wide.columns = pd.MultiIndex.from_tuples(wide.columns, names=["topology", ""])
        wide.index = pd.MultiIndex.from_tuples(list(table), names=["framework"] + index_keys[1:]) \
            if len(index_keys) > 1 else pd.Index([k[0] for k in table], name="framework")
        out[model] = wide
    return out


STUDY_SINGLE_COLUMNS: list[str] = ["model", "framework", "device", "batch_per_worker", "images_per_s", "iter_ms",
                                   "io_ms", "h2d_ms", "forward_ms", "backward_ms", "update_ms"]


def study_single_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The study's single-worker table: per model and framework, throughput (images/s),
    iteration time and the per-phase breakdown in milliseconds (profile mode)."""
    throughput = throughput_table(frame)
    phases = phase_table(frame)
    if throughput.empty:
        return pd.DataFrame(columns=STUDY_SINGLE_COLUMNS)
    single = throughput[_mask(throughput["world_size"] == 1)]
    keys = ["model", "device", "framework_label", "mode", "batch_per_worker"]
    if not phases.empty:
        phases = phases[_mask(phases["world_size"] == 1)]
        keep = [c for c in ("io_ms", "h2d_ms", "forward_ms", "backward_ms", "update_ms") if c in phases.columns]
        single = single.merge(phases[keys + keep], on=keys, how="left")
    rows = []
    for _, row in single.iterrows():
        item = {"model": row["model"], "framework": series_name(row["framework_label"], row["mode"]),
                "device": row["device"], "batch_per_worker": row["batch_per_worker"],
                "images_per_s": row["images_per_s"], "iter_ms": row["iter_ms_median"]}
        for phase in ("io", "h2d", "forward", "backward", "update"):
            value = row.get(f"{phase}_ms")
            item[f"{phase}_ms"] = math.nan if missing(value) else float(value)
        rows.append(item)
    return pd.DataFrame(rows, columns=STUDY_SINGLE_COLUMNS).sort_values(["model", "framework"]).reset_index(drop=True)


STUDY_FORMATS = {"ms": ".1f", "S": ".2f", "E": ".2f", "images_per_s": ".1f", "iter_ms": ".1f", "io_ms": ".2f",
                 "h2d_ms": ".2f", "forward_ms": ".1f", "backward_ms": ".1f", "update_ms": ".2f"}


def study_tables(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``study_single`` and ``study_scaling_<model>`` (see `write_study_tables`)."""
    found = {"study_single": study_single_table(frame)}
    found.update({f"study_scaling_{model}": table for model, table in study_scaling_tables(frame).items()})
    return found


def write_study_tables(frame: pd.DataFrame, out_dir: str | Path,
                       computed: dict[str, pd.DataFrame] | None = None) -> dict[str, dict[str, Path]]:
    """The study's tables as Markdown, CSV and LaTeX under ``tables/``: ``study_single``
    (single-worker throughput and phases) and ``study_scaling_<model>`` per model;
    `computed`: the `study_tables` already built."""
    folder = Path(out_dir) / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    computed = computed if computed is not None else study_tables(frame)
    tables_ = {"study_single": (computed["study_single"],
                                "Single worker: throughput (images/s), iteration time and phases (ms)")}
    for name, table in computed.items():
        if name == "study_single":
            continue
        model = name[len("study_scaling_"):]
        tables_[name] = (table, f"{model}: iteration time (ms), speedup S and efficiency E per topology "
                                "(weak scaling)")
    for old in folder.glob("study_scaling_*"):
        if old.stem not in tables_:
            old.unlink()
    for name, (table, caption) in tables_.items():
        flat = flatten_columns(table) if name != "study_single" else table
        paths = {"md": folder / f"{name}.md", "csv": folder / f"{name}.csv", "tex": folder / f"{name}.tex"}
        paths["md"].write_text(markdown_document(caption, flat, formats=STUDY_FORMATS), encoding="utf-8")
        flat.to_csv(paths["csv"], index=False)
        paths["tex"].write_text(to_latex(table, caption, STUDY_FORMATS), encoding="utf-8")
        written[name] = paths
    return written

