"""The verdict: per model and topology, which scheme trains fastest, by how much, whether that
is beyond the run-to-run spread, and why each scheme falls short of ideal scaling.

`verdict_table(frame)` is a pure function of the runs frame (`ResultStore.runs_frame()`):
one row per configuration (median over repeated runs), the synchronous schemes ranked by
images/s within each topology (model, device, per-worker batch, nodes, workers per node,
emulated links); asynchronous schemes are listed unranked.  `verdicts(table)` groups it into
one `TopologyVerdict` per topology with its headline sentence, which the report and the
terminal summary print first.

A win is *beyond the spread* when the winner's slowest repeats (p90 of iteration time) still
beat the runner-up's fastest (p10), as images/s: their p10-p90 ranges do not overlap.

Where a multi-worker run's time went (weak scaling: ideally t(N) = t(1), each scheme against
its own one-worker run of the same model, device and per-worker batch), from the profile's
measured phases, in seconds per iteration::

    lost    = t(N) - t(1)                              throughput mode, medians
    compute = (t_f + t_b)(N) - (t_f + t_b)(1)         each worker's forward + backward (mean over
                                                      ranks where their own phases are recorded):
                                                      workers sharing cores or a device
    comm    = t_c(N) * (1 - overlap(N))               communication left exposed after backward
    skew    = arrival_sync(N) - arrival_mean(N)       how much later than the average rank the
                                                      slowest reaches the exchange, per iteration
    io      = (t_io + t_h2d)(N) - (t_io + t_h2d)(1)
    update  = t_u(N) - t_u(1)
    rest    = lost - (compute + comm + skew + io + update)

The cause named first is the largest of the five; the performance model's predicted exposed
communication is quoted beside the measured one where the run has a prediction, and each row
keeps the model's predicted iteration time (`predicted_iter_ms`), from which the verdict matrix
(`analysis.overview`) marks the scheme the model would have picked.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis import tables
from analysis.rendering import missing

Row = Mapping[str, Any]  # one configuration: a dict of `_configs`' columns (a Series reads the same)
TOPOLOGY_KEYS: list[str] = ["model", "device", "batch_per_worker", "nodes", "workers_per_node", "bandwidth",
                            "latency"]
CAUSES: tuple[str, ...] = ("compute", "comm", "skew", "io", "update")
CAUSE_NAMES: dict[str, str] = {"compute": "slower compute", "comm": "exposed communication",
                               "skew": "skew between ranks", "io": "I/O", "update": "update", "rest": "rest"}
# A machine counts as busy when other processes kept at least this many cores busy.
BUSY_CORES = 0.5
# Spread (p90 - p10) / median above which a configuration is flagged as noisy.
NOISY_SPREAD = 0.25
# Efficiency above which weak scaling is "better than ideal": a slow one-worker run.
SUPERLINEAR = 1.05
TIE_PCT = 1.0
# The profiled phases and the throughput-mode loss disagreeing by more than this share of the
# loss is said in the cause.
PLACED_TOLERANCE = 0.25

VERDICT_COLUMNS: list[str] = [
    "model", "device", "batch_per_worker", "nodes", "workers_per_node", "world_size", "bandwidth", "latency",
    "topology", "rank", "framework", "framework_label", "mode", "series", "synchronous", "runs", "images_per_s",
    "iter_ms", "iter_ms_p10", "iter_ms_p90", "behind_winner_pct", "margin_pct", "beyond_spread", "efficiency",
    "baseline_iter_ms", "lost_ms", "compute_ms", "comm_ms", "skew_ms", "io_ms", "update_ms", "rest_ms",
    "compute_ratio", "comm_model_ms", "predicted_iter_ms", "cause", "cause_text", "flags", "threads_per_worker", "baseline_threads",
    "cpu_cores", "ranks_per_host", "oversubscribed", "other_load"]


@dataclass(frozen=True)
class TopologyVerdict:
    """One topology's verdict: a title, the headline, the ranked schemes."""

    title: str
    headline: str
    rows: pd.DataFrame


# --------------------------------------------------------------------------- per run

def _mean_over_ranks(value, phases: tuple[str, ...]) -> float:
    """Mean over ranks of the sum of `phases` in the record's ``rank_phases_s``; NaN without."""
    ranks = [r for r in tables.json_list(value) if isinstance(r, dict)]
    sums = [sum(float(r.get(p) or 0.0) for p in phases) for r in ranks]
    return statistics.fmean(sums) if sums else math.nan


def _run_facts(frame: pd.DataFrame) -> pd.DataFrame:
    """Successful runs with the per-run quantities the verdict reads, in seconds."""
    ok = tables.ok_runs(tables.prepare(frame))
    if ok.empty:
        return ok

    def number(column):
        return tables._numeric(ok, column)

    rank_phases = ok["extra_rank_phases_s"] if "extra_rank_phases_s" in ok.columns else pd.Series(
        [None] * len(ok), index=ok.index)
    compute_mean = pd.Series([_mean_over_ranks(v, ("forward", "backward")) for v in rank_phases], index=ok.index)
    arrival_mean = pd.Series([_mean_over_ranks(v, ("io", "h2d", "forward", "backward")) for v in rank_phases],
                             index=ok.index)
    forward_backward = number("phase_forward_s") + number("phase_backward_s")
    synchronous = number("synchronous")
    return ok.assign(
        t=number("iter_time_median"), t_p10=number("iter_time_p10"), t_p90=number("iter_time_p90"),
        thr=ok["throughput"], compute=compute_mean.fillna(forward_backward),
        io_s=number("phase_io_s").fillna(0.0) + number("phase_h2d_s").fillna(0.0),
        update_s=number("phase_update_s"), comm_s=number("phase_comm_s").fillna(0.0),
        overlap_f=number("overlap").fillna(0.0), arrival_mean=arrival_mean,
        arrival_sync=number("extra_sync_compute_s_before_comm"),
        comm_model=number("extra_prediction_comm_exposed_s"), predicted=number("predicted_iter_time"), threads=number("threads_per_worker"),
        cores=number("cpu_cores"), per_host=number("ranks_per_host"), oversub=number("oversubscribed"),
        other=number("other_load"), sync=synchronous.fillna(1.0))


def _configs(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: medians over its runs (the worst over runs for the flags)."""
    runs = _run_facts(frame)
    if runs.empty:
        return runs
    medians = ["t", "t_p10", "t_p90", "thr", "compute", "io_s", "update_s", "comm_s", "overlap_f", "arrival_mean",
               "arrival_sync", "comm_model", "predicted", "threads", "cores", "per_host"]
    worst = ["oversub", "other"]
    grouped = runs.groupby(tables.CONFIG_KEYS, dropna=False, sort=True)
    table = grouped[medians].median().join(grouped[worst].max()).join(grouped["sync"].min()) \
        .join(grouped["device_kind"].first()).join(grouped["run_id"].size().rename("runs")).reset_index()
    scaling = tables.configs_with_speedup(frame)[tables.CONFIG_KEYS + ["efficiency", "baseline_mode"]]
    return table.merge(scaling, on=tables.CONFIG_KEYS, how="left")


# --------------------------------------------------------------------------- attribution

BASELINE_KEYS = ["model", "device", "batch_per_worker", "framework", "mode"]


def _baselines(configs: pd.DataFrame) -> dict[tuple, Row]:
    """The one-worker configuration of each scheme, model, device and per-worker batch (the
    first where several match), looked up by `_baseline_of`."""
    found: dict[tuple, Row] = {}
    for row in configs[configs["world_size"] == 1].to_dict("records"):
        found.setdefault(tuple(row[k] for k in BASELINE_KEYS), row)
    return found


def _baseline_of(baselines: dict[tuple, Row], row: Row, mode) -> Row | None:
    """The one-worker configuration of the same scheme (the scaling table's choice of mode)."""
    if missing(mode):
        return None
    return baselines.get((row["model"], row["device"], row["batch_per_worker"], row["framework"], mode))


def _difference(now, then) -> float:
    return math.nan if missing(now) or missing(then) else float(now) - float(then)


def attribute(row: Row, baseline: Row | None) -> dict[str, float]:
    """Seconds per iteration lost against the baseline, by cause (see the module docstring);
    causes that need the baseline are NaN without one."""
    base = baseline if baseline is not None else {}
    alone = row["world_size"] <= 1  # no peers: nothing to exchange or wait for
    parts = {"compute": _difference(row["compute"], base.get("compute")),
             "comm": 0.0 if alone else float(row["comm_s"]) * (1.0 - min(1.0, max(0.0, float(row["overlap_f"])))),
             "skew": (max(0.0, float(row["arrival_sync"]) - float(row["arrival_mean"]))
                      if not (missing(row["arrival_sync"]) or missing(row["arrival_mean"]))
                      and not alone else 0.0),
             "io": _difference(row["io_s"], base.get("io_s")),
             "update": _difference(row["update_s"], base.get("update_s"))}
    lost = _difference(row["t"], base.get("t"))
    known = [v for v in parts.values() if not missing(v)]
    parts["rest"] = lost - sum(known) if not missing(lost) else math.nan
    parts["lost"] = lost
    return parts


def _ms(value) -> str:
    return "?" if missing(value) else f"{value * 1e3:.1f} ms"


def _plural(count, word: str) -> str:
    count = int(count)
    return f"{count} {word}{'' if count == 1 else 's'}"


def sharing_text(row: Row, baseline: Row | None) -> str:
    """Why each worker computes slower: how many shared the machine with how many threads."""
    if row["device_kind"] != "cpu" or missing(row["per_host"]) or missing(row["threads"]):
        return f"{_plural(row['workers_per_node'], 'worker')} per node"
    text = (f"{_plural(row['per_host'], 'worker')} × {_plural(row['threads'], 'thread')} on "
            f"{_plural(row['cores'], 'core') if not missing(row['cores']) else '? cores'}")
    if row["oversub"] == 1:
        text += ", oversubscribed"
    if baseline is not None and not missing(baseline["threads"]):
        text += f"; one worker alone had {_plural(baseline['threads'], 'thread')}"
    return text


def busy_text(row: Row) -> str:
    """'other processes kept 1.3 of 2 cores busy', or '' on a quiet machine."""
    if missing(row["other"]) or row["other"] < BUSY_CORES:
        return ""
    cores = "" if missing(row["cores"]) else f" of {int(row['cores'])}"
    return f"other processes kept {row['other']:.1f}{cores} cores busy"


def cause_text(row: Row, baseline: Row | None, parts: dict[str, float], efficiency) -> tuple[str, str]:
    """(cause key, one sentence) for a configuration."""
    if row["world_size"] <= 1:
        return "", "one worker: the baseline of its scheme"
    if baseline is None:
        known = ", ".join(f"{CAUSE_NAMES[c]} {_ms(parts[c])}" for c in ("comm", "skew") if parts[c] > 0)
        return "", ("no one-worker run of this scheme to compare with" + (f"; {known}" if known else ""))
    if not missing(efficiency) and efficiency > SUPERLINEAR:
        reasons = [f"its one-worker run took {baseline['t'] * 1e3:.1f} ms "
                   f"(p10–p90 {baseline['t_p10'] * 1e3:.1f}–{baseline['t_p90'] * 1e3:.1f})"]
        if busy_text(baseline):
            reasons.append(busy_text(baseline) + " during it")
        return "baseline", "faster than ideal: " + "; ".join(reasons) + \
            ", so the baseline is suspect: measure it again"
    ranked = sorted(((parts[c], c) for c in CAUSES if not missing(parts[c])), reverse=True)
    if missing(parts["lost"]) or parts["lost"] <= 0:
        return "", f"no time lost against one worker ({_ms(parts['lost'])} per iteration)"
    lead = f"{_ms(parts['lost'])} more per iteration than one worker"
    if not ranked or ranked[0][0] <= 0:
        return "rest", (f"{lead}, none of it in the profiled phases: the throughput-mode iteration lost it "
                        "outside them (load, noise)")
    top = ranked[0][1]
    pieces = [_cause_piece(top, row, baseline, parts)]
    pieces += [f"{CAUSE_NAMES[c]} {_ms(v)}" for v, c in ranked[1:] if v > 0.1 * parts["lost"]]
    text = f"{lead}; in the profile: " + "; ".join(pieces)
    placed = parts["lost"] - parts["rest"]
    if parts["rest"] < -PLACED_TOLERANCE * parts["lost"]:
        text += (f" (the profiled phases grew by {_ms(placed)}, more than the throughput-mode iteration: "
                 "read them as shares)")
    elif parts["rest"] > PLACED_TOLERANCE * parts["lost"]:
        text += f"; {_ms(parts['rest'])} outside the profiled phases"
    return top, text


def _cause_piece(cause: str, row: Row, baseline: Row, parts: dict[str, float]) -> str:
    """The leading cause with its evidence."""
    value = _ms(parts[cause])
    if cause == "compute":
        ratio = row["compute"] / baseline["compute"] if baseline["compute"] else math.nan
        text = (f"slower compute {value}: forward + backward {ratio:.2f}× the one-worker run "
                f"({sharing_text(row, baseline)})")
        return text + (f"; {busy_text(row)}" if busy_text(row) else "")
    if cause == "comm":
        hidden = f"{100 * float(row['overlap_f']):.0f}% of {_ms(row['comm_s'])} hidden behind backward"
        model = "" if missing(row["comm_model"]) else f"; the model predicts {_ms(row['comm_model'])}"
        return f"exposed communication {value} ({hidden}{model})"
    if cause == "skew":
        return f"skew between ranks {value} (the slowest rank reaches the exchange this much after the average)"
    return f"{CAUSE_NAMES[cause]} {value} more than the one-worker run"


def flags_text(row: Row) -> str:
    """What makes a configuration's numbers less trustworthy, '; '-separated ('' when nothing)."""
    flags = []
    if row["oversub"] == 1:
        flags.append(f"oversubscribed: {_plural(row['per_host'], 'rank')} × {_plural(row['threads'], 'thread')} "
                     f"on {_plural(row['cores'], 'core')}")
    if busy_text(row):
        flags.append("busy machine: " + busy_text(row))
    if not missing(row["t"]) and row["t"] > 0 and not missing(row["t_p90"]):
        spread = (row["t_p90"] - row["t_p10"]) / row["t"]
        if spread > NOISY_SPREAD:
            flags.append(f"noisy: p10–p90 spans {100 * spread:.0f}% of the median")
    return "; ".join(flags)


# --------------------------------------------------------------------------- the table

def verdict_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration, ranked within its topology (see the module docstring)."""
    configs = _configs(frame)
    if configs.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    baselines = _baselines(configs)
    rows = []
    for row in configs.to_dict("records"):  # dicts: a Series per row costs more than the rest of the loop
        efficiency = row["efficiency"]
        baseline = None if row["world_size"] <= 1 else _baseline_of(baselines, row, row["baseline_mode"])
        parts = attribute(row, baseline)
        cause, text = cause_text(row, baseline, parts, efficiency)
        rows.append({
            **{k: row[k] for k in ("model", "device", "batch_per_worker", "nodes", "workers_per_node", "world_size",
                                   "bandwidth", "latency", "framework", "framework_label", "mode", "runs")},
            "topology": tables.topology_short(row["nodes"], row["workers_per_node"]),
            "series": tables.series_name(row["framework_label"], row["mode"]), "synchronous": bool(row["sync"]),
            "images_per_s": row["thr"], "iter_ms": row["t"] * 1e3, "iter_ms_p10": row["t_p10"] * 1e3,
            "iter_ms_p90": row["t_p90"] * 1e3, "efficiency": efficiency,
            "baseline_iter_ms": math.nan if baseline is None else baseline["t"] * 1e3,
            **{f"{name}_ms": parts[name] * 1e3 for name in ("lost", *CAUSES, "rest")},
            "compute_ratio": (row["compute"] / baseline["compute"]
                              if baseline is not None and baseline["compute"] else math.nan),
            "comm_model_ms": row["comm_model"] * 1e3, "predicted_iter_ms": row["predicted"] * 1e3, "cause": cause, "cause_text": text,
            "flags": flags_text(row), "threads_per_worker": row["threads"],
            "baseline_threads": math.nan if baseline is None else baseline["threads"], "cpu_cores": row["cores"],
            "ranks_per_host": row["per_host"], "oversubscribed": row["oversub"], "other_load": row["other"]})
    table = pd.DataFrame(rows)
    return _ranked(table)[VERDICT_COLUMNS]


def _ranked(table: pd.DataFrame) -> pd.DataFrame:
    """Rank the synchronous schemes of each topology by images/s; the winner's row gets the
    margin over the runner-up and whether it is beyond the spread.  Topologies in key order,
    each with its ranked schemes first and its asynchronous ones after."""
    table = table.assign(rank=math.nan, behind_winner_pct=math.nan, margin_pct=math.nan, beyond_spread=None,
                         _topology=table.groupby(TOPOLOGY_KEYS, dropna=False, sort=True).ngroup(),
                         _async=~table["synchronous"].astype(bool))
    ranked = table[~table["_async"]].sort_values(["_topology", "images_per_s"], ascending=[True, False],
                                                 kind="stable")
    by_topology = ranked.groupby("_topology")
    ranked["rank"] = by_topology.cumcount() + 1
    ranked["behind_winner_pct"] = (1 - ranked["images_per_s"] / by_topology["images_per_s"].transform("first")) * 100
    first = ranked[ranked["rank"] == 1]
    second = ranked[ranked["rank"] == 2].set_index("_topology").reindex(first["_topology"])
    second.index = first.index
    contested = second["rank"].notna()
    ranked.loc[first.index[contested], "margin_pct"] = \
        ((first["images_per_s"] / second["images_per_s"] - 1) * 100)[contested]
    # one topology, one per-worker batch: the faster one's slowest repeats still beat the other's fastest
    known = contested & first["iter_ms_p90"].notna() & second["iter_ms_p10"].notna()
    beyond = pd.Series(None, index=first.index, dtype=object)
    beyond[known] = [bool(b) for b in (first["iter_ms_p90"] < second["iter_ms_p10"])[known]]
    ranked.loc[first.index[contested], "beyond_spread"] = beyond[contested]
    ordered = pd.concat([ranked, table[table["_async"]]]).sort_values(["_topology", "_async"], kind="stable")
    return ordered.drop(columns=["_topology", "_async"]).reset_index(drop=True)


# --------------------------------------------------------------------------- headlines

def topology_title(row: pd.Series) -> str:
    """'alexnet-tiny · 1 node × 2 workers · batch 16/worker · cpu-name [· 1Gbit]'."""
    nodes, per_node = int(row["nodes"]), int(row["workers_per_node"])
    parts = [str(row["model"]), f"{_plural(nodes, 'node')} × {_plural(per_node, 'worker')}",
             f"batch {int(row['batch_per_worker'])}/worker", str(row["device"])]
    parts += [str(v) for v in (row["bandwidth"], row["latency"]) if not missing(v) and str(v)]
    return " · ".join(parts)


def headline(rows: pd.DataFrame) -> str:
    """The topology's answer in one sentence."""
    ranked = rows[rows["rank"].notna()].sort_values("rank")
    if ranked.empty:
        return "No synchronous scheme measured here."
    first = ranked.iloc[0]
    if len(ranked) == 1:
        return f"Only {first['series']} was measured here: {first['images_per_s']:.0f} images/s."
    second = ranked.iloc[1]
    if first["margin_pct"] < TIE_PCT:
        lead = (f"{first['series']} and {second['series']} are tied at {first['images_per_s']:.0f} and "
                f"{second['images_per_s']:.0f} images/s")
    else:
        ahead = (f"{first['margin_pct']:.0f}% ahead of" if first["margin_pct"] < 100
                 else f"{first['margin_pct'] / 100 + 1:.1f}× the images/s of")
        lead = (f"{first['series']} is fastest at {first['images_per_s']:.0f} images/s, "
                f"{ahead} {second['series']} ({second['images_per_s']:.0f})")
    if first["beyond_spread"] is True:
        spread = "beyond the run-to-run spread (their p10–p90 iteration times do not overlap)"
    elif first["beyond_spread"] is False:
        spread = "within the run-to-run spread (their p10–p90 iteration times overlap): not a clear win"
    else:
        spread = "the spread of their repeats is unknown"
    return f"{lead}; {spread}."


def verdicts(table: pd.DataFrame) -> list[TopologyVerdict]:
    """One `TopologyVerdict` per topology, in the table's order (model, then topology)."""
    found = []
    if table.empty:
        return found
    for _, rows in table.groupby(TOPOLOGY_KEYS, dropna=False, sort=True):
        rows = rows.sort_values(["rank", "series"], na_position="last")
        found.append(TopologyVerdict(topology_title(rows.iloc[0]), headline(rows), rows))
    return found
