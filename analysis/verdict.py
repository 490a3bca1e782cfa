"""The verdict: per model and topology, which scheme trains fastest, by how much, whether that
is beyond the noise between launches, and why each scheme falls short of ideal scaling.

`verdict_table(frame)` is a pure function of the runs frame (`ResultStore.runs_frame()`):
one row per configuration (the median over its launches of each launch's median), the
synchronous schemes ranked by images/s within each topology (model, device, per-worker batch,
nodes, workers per node, emulated links); asynchronous schemes are listed unranked.
`verdicts(table)` groups it into one `TopologyVerdict` per topology with its headline
sentence, which the report and the terminal summary print first.

A win is *clear* (``beyond_noise``) when the winner's launches against the runner-up's pass
`analysis.noise.compare` at `noise.LEVEL`: the interval of the throughput ratio, from the
between-launch noise pooled over the campaign, excludes 1.  The margin is printed with that
interval; with too few launches to decide, the headline says how many would.  Efficiency
E(N) = t(1)/t(N) carries the same kind of interval (`efficiency_low`, `efficiency_high`).  The
p10-p90 of one launch's repeats is the *within-launch* spread: it flags an unsteady launch
and never decides a win.

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

from analysis import noise as launch_noise
from analysis import tables
from analysis.rendering import missing
from core import schemes as catalogue

Row = Mapping[str, Any]  # one configuration: a dict of `_configs`' columns (a Series reads the same)
TOPOLOGY_KEYS: list[str] = ["model", "device", "batch_per_worker", "nodes", "workers_per_node", "bandwidth",
                            "latency"]
CAUSES: tuple[str, ...] = ("compute", "comm", "skew", "io", "update")
CAUSE_NAMES: dict[str, str] = {"compute": "slower compute", "comm": "exposed communication",
                               "skew": "skew between ranks", "io": "I/O", "update": "update", "rest": "rest"}
# A machine counts as busy when other processes kept at least this many cores busy.
BUSY_CORES = 0.5
# Within-launch spread (p90 - p10) / median above which a configuration is flagged as unsteady.
NOISY_SPREAD = 0.25
# Peak memory above this share of the device's (or, for the ranks sharing a machine, of its
# memory) is flagged: a larger batch would not fit, and allocator pressure slows steps.
MEMORY_SHARE = 0.9
# Efficiency above which weak scaling is "better than ideal": a slow one-worker run.
SUPERLINEAR = 1.05
TIE_PCT = 1.0
# The profiled phases and the throughput-mode loss disagreeing by more than this share of the
# loss is said in the cause.
PLACED_TOLERANCE = 0.25

VERDICT_COLUMNS: list[str] = [
    "model", "device", "batch_per_worker", "nodes", "workers_per_node", "world_size", "bandwidth", "latency",
    "topology", "rank", "framework", "framework_label", "mode", "scheme", "series", "synchronous", "launches",
    "images_per_s", "images_per_s_low", "images_per_s_high", "launch_cv_pct", "iter_ms", "iter_ms_p10",
    "iter_ms_p90", "behind_winner_pct", "margin_pct", "margin_low_pct", "margin_high_pct", "p_value",
    "beyond_noise", "launches_to_resolve", "efficiency", "efficiency_low", "efficiency_high", "speedup", "speedup_low",
    "speedup_high", "baseline", "baseline_iter_ms", "lost_ms", "compute_ms", "comm_ms", "skew_ms", "io_ms", "update_ms", "rest_ms",
    "compute_ratio", "comm_model_ms", "predicted_iter_ms", "cause", "cause_text", "flags", "threads_per_worker", "baseline_threads",
    "cpu_cores", "ranks_per_host", "oversubscribed", "other_load", "peak_memory_mib"]


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
        other=number("other_load"), sync=synchronous.fillna(1.0), peak=number("extra_peak_memory_bytes"),
        memory=number("extra_memory_total_bytes"),
        memory_kind=ok["extra_peak_memory_kind"] if "extra_peak_memory_kind" in ok else None,
        steady=pd.Series([{True: 1.0, False: 0.0}.get(v, math.nan) if isinstance(v, bool) else math.nan
                          for v in (ok["extra_warmup_steady"] if "extra_warmup_steady" in ok else [None] * len(ok))],
                         index=ok.index))


def _configs(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: medians over its launches (the worst over launches for the
    flags) and ``launch_times``, each launch's median iteration time."""
    runs = _run_facts(frame)
    if runs.empty:
        return runs
    medians = ["t", "t_p10", "t_p90", "thr", "compute", "io_s", "update_s", "comm_s", "overlap_f", "arrival_mean",
               "arrival_sync", "comm_model", "predicted", "threads", "cores", "per_host", "memory"]
    worst = ["oversub", "other", "peak"]
    grouped = runs.groupby(tables.CONFIG_KEYS, dropna=False, sort=True)
    table = grouped[medians].median().join(grouped[worst].max()).join(grouped[["sync", "steady"]].min()) \
        .join(grouped[["device_kind", "memory_kind"]].first()).join(grouped["run_id"].size().rename("launches")) \
        .reset_index()
    scaling = tables.configs_with_speedup(frame)[tables.CONFIG_KEYS + ["efficiency", "baseline_mode"]]
    launches = launch_noise.launch_times(frame)
    table = table.merge(scaling, on=tables.CONFIG_KEYS, how="left").merge(launches, on=tables.CONFIG_KEYS, how="left")
    table["launch_times"] = [times if isinstance(times, list) else [] for times in table["launch_times"]]
    return table


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


def memory_text(row: Row) -> str:
    """'a rank's peak held 93% of the device's 80.0 GiB' (device memory), or 'the 2 ranks on a
    machine held up to 91% of its 24.0 GiB' (resident sets), past `MEMORY_SHARE`; else ''."""
    peak, total = row.get("peak"), row.get("memory")
    if missing(peak) or missing(total) or not total:
        return ""
    if row.get("memory_kind") == "device":
        share = peak / total
        text = f"a rank's peak held {100 * share:.0f}% of the device's {total / 2**30:.1f} GiB"
    else:
        ranks = 1 if missing(row["per_host"]) else int(row["per_host"])
        share = ranks * peak / total
        text = f"the {_plural(ranks, 'rank')} on a machine held up to {100 * share:.0f}% of its {total / 2**30:.1f} GiB"
    return text if share > MEMORY_SHARE else ""


def flags_text(row: Row) -> str:
    """What makes a configuration's numbers less trustworthy, '; '-separated ('' when nothing)."""
    flags = []
    if row["oversub"] == 1:
        flags.append(f"oversubscribed: {_plural(row['per_host'], 'rank')} × {_plural(row['threads'], 'thread')} "
                     f"on {_plural(row['cores'], 'core')}")
    if busy_text(row):
        flags.append("busy machine: " + busy_text(row))
    if memory_text(row):
        flags.append("memory: " + memory_text(row))
    if row.get("steady") == 0:
        flags.append("not steady: a launch's step time still fell when its warm-up reached its cap")
    if not missing(row["t"]) and row["t"] > 0 and not missing(row["t_p90"]):
        spread = (row["t_p90"] - row["t_p10"]) / row["t"]
        if spread > NOISY_SPREAD:
            flags.append(f"unsteady launch: its repeats' p10–p90 spans {100 * spread:.0f}% of the median")
    return "; ".join(flags)


# --------------------------------------------------------------------------- the table

def verdict_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration, ranked within its topology (see the module docstring)."""
    configs = _configs(frame)
    if configs.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    baselines = _baselines(configs)
    noise = launch_noise.campaign_noise(frame)
    rows = []
    for row in configs.to_dict("records"):  # dicts: a Series per row costs more than the rest of the loop
        efficiency = row["efficiency"]
        baseline = None if row["world_size"] <= 1 else _baseline_of(baselines, row, row["baseline_mode"])
        parts = attribute(row, baseline)
        cause, text = cause_text(row, baseline, parts, efficiency)
        own = launch_noise.interval_factor(len(row["launch_times"]), noise)
        scaling = (launch_noise.compare(launch_noise.config_key(row), launch_noise.config_key(baseline), noise)
                   if baseline is not None else None)
        rows.append({
            **{k: row[k] for k in ("model", "device", "batch_per_worker", "nodes", "workers_per_node", "world_size",
                                   "bandwidth", "latency", "framework", "framework_label", "mode", "launches")},
            "config_key": launch_noise.config_key(row),
            "topology": tables.topology_short(row["nodes"], row["workers_per_node"]),
            "scheme": f"{row['framework']}:{row['mode']}",
            "series": tables.series_name(row["framework_label"], row["mode"]), "synchronous": bool(row["sync"]),
            "images_per_s": row["thr"], "images_per_s_low": row["thr"] / own, "images_per_s_high": row["thr"] * own,
            "launch_cv_pct": launch_noise.launch_cv_pct(row["launch_times"]),
            "iter_ms": row["t"] * 1e3, "iter_ms_p10": row["t_p10"] * 1e3,
            "iter_ms_p90": row["t_p90"] * 1e3, **_scaling(row, efficiency, scaling),
            "baseline": "" if baseline is None else f"{baseline['framework']}:{baseline['mode']} 1×1",
            "baseline_iter_ms": math.nan if baseline is None else baseline["t"] * 1e3,
            **{f"{name}_ms": parts[name] * 1e3 for name in ("lost", *CAUSES, "rest")},
            "compute_ratio": (row["compute"] / baseline["compute"]
                              if baseline is not None and baseline["compute"] else math.nan),
            "comm_model_ms": row["comm_model"] * 1e3, "predicted_iter_ms": row["predicted"] * 1e3, "cause": cause, "cause_text": text,
            "flags": flags_text(row), "threads_per_worker": row["threads"],
            "baseline_threads": math.nan if baseline is None else baseline["threads"], "cpu_cores": row["cores"],
            "ranks_per_host": row["per_host"], "oversubscribed": row["oversub"], "other_load": row["other"],
            "peak_memory_mib": row["peak"] / 2**20})
    table = pd.DataFrame(rows)
    return _ranked(table, noise)[VERDICT_COLUMNS]


def _scaling(row: Row, efficiency, scaling: launch_noise.Comparison | None) -> dict:
    """Efficiency E(N) with the interval of the run's throughput over its baseline's (the
    test's `compare`), and weak scaling's speedup S(N) = N·E(N) with the same interval."""
    world = float(row["world_size"])
    low, high = ((efficiency * scaling.low / scaling.ratio, efficiency * scaling.high / scaling.ratio)
                 if scaling else (math.nan, math.nan))
    return {"efficiency": efficiency, "efficiency_low": low, "efficiency_high": high,
            "speedup": world * efficiency, "speedup_low": world * low, "speedup_high": world * high}


def _ranked(table: pd.DataFrame, noise: launch_noise.Noise) -> pd.DataFrame:
    """Rank the synchronous schemes of each topology by images/s; the winner's row gets the
    margin over the runner-up with its interval and the test's outcome (`_contest`).
    Topologies in key order, each with its ranked schemes first and its asynchronous ones after."""
    table = table.assign(rank=math.nan, behind_winner_pct=math.nan, margin_pct=math.nan, margin_low_pct=math.nan,
                         margin_high_pct=math.nan, p_value=math.nan, beyond_noise=None,
                         launches_to_resolve=math.nan,
                         _topology=table.groupby(TOPOLOGY_KEYS, dropna=False, sort=True).ngroup(),
                         _async=~table["synchronous"].astype(bool))
    ranked = table[~table["_async"]].sort_values(["_topology", "images_per_s"], ascending=[True, False],
                                                 kind="stable")
    by_topology = ranked.groupby("_topology")
    ranked["rank"] = by_topology.cumcount() + 1
    ranked["behind_winner_pct"] = (1 - ranked["images_per_s"] / by_topology["images_per_s"].transform("first")) * 100
    firsts = ranked[ranked["rank"] == 1]
    seconds = ranked[ranked["rank"] == 2].set_index("_topology")
    for index, first in firsts.iterrows():
        if first["_topology"] in seconds.index:
            for column, value in _contest(first, seconds.loc[first["_topology"]], noise, len(table)).items():
                ranked.at[index, column] = value
    ordered = pd.concat([ranked, table[table["_async"]]]).sort_values(["_topology", "_async"], kind="stable")
    return ordered.drop(columns=["_topology", "_async"]).reset_index(drop=True)


def _contest(first: Row, second: Row, noise: launch_noise.Noise, configurations: int) -> dict:
    """The winner against the runner-up: the margin of their medians over launches, the
    interval of the throughput ratio at the campaign's between-launch noise, the test's
    outcome, and the launches each that would resolve the margin where it is within noise."""
    found = launch_noise.compare(first["config_key"], second["config_key"], noise)
    margin = (first["images_per_s"] / second["images_per_s"] - 1) * 100
    needed = (launch_noise.launches_to_resolve(margin, noise, configurations)
              if found.beyond is False else None)
    return {"margin_pct": margin, "margin_low_pct": 100 * (found.low - 1), "margin_high_pct": 100 * (found.high - 1),
            "p_value": found.p_value, "beyond_noise": found.beyond,
            "launches_to_resolve": math.nan if needed is None else needed}


# --------------------------------------------------------------------------- headlines

def topology_title(row: pd.Series) -> str:
    """'alexnet-tiny · 1 node × 2 workers · batch 16/worker · cpu-name [· 1Gbit]'."""
    nodes, per_node = int(row["nodes"]), int(row["workers_per_node"])
    parts = [str(row["model"]), f"{_plural(nodes, 'node')} × {_plural(per_node, 'worker')}",
             f"batch {int(row['batch_per_worker'])}/worker", str(row["device"])]
    parts += [str(v) for v in (row["bandwidth"], row["latency"]) if not missing(v) and str(v)]
    return " · ".join(parts)


def _launches_text(first: Row, second: Row) -> str:
    """'2 launches each' or '3 and 2 launches'."""
    a, b = int(first["launches"]), int(second["launches"])
    return f"{a} launch{'es' if a != 1 else ''} each" if a == b else f"{a} and {b} launches"


def headline(rows: pd.DataFrame) -> str:
    """The topology's answer in one sentence: a winner only where the launches prove it, and
    what a compressing winner changes in the gradients (`lossy_text`)."""
    ranked = rows[rows["rank"].notna()].sort_values("rank")
    if ranked.empty:
        return "No synchronous scheme measured here."
    return _ranking_text(ranked) + lossy_text(ranked.iloc[0])


def lossy_text(first: Row) -> str:
    """For a compressing scheme in first place: that its speed is bought with the gradients it
    sends, and where its cost to the loss is measured (a campaign times it only)."""
    info = catalogue.SCHEMES.get(catalogue.scheme_key(first.get("framework"), first.get("mode")))
    if info is None or not info.lossy:
        return ""
    reference = f"{info.framework}:{catalogue.FRAMEWORKS[info.framework].modes[0]}"
    return (f" {first['series']} changes what it sends ({info.lossy}): its cost to the loss is not in these "
            f"timings; `dlcompare check --frameworks {reference},{info.name} --model {first.get('model')} "
            f"--workers 2` measures it.")


def _ranking_text(ranked: pd.DataFrame) -> str:
    first = ranked.iloc[0]
    if len(ranked) == 1:
        return f"Only {first['series']} was measured here: {first['images_per_s']:.0f} images/s."
    second = ranked.iloc[1]
    pair = (f"{first['series']} ({first['images_per_s']:.0f} images/s) and "
            f"{second['series']} ({second['images_per_s']:.0f})")
    launches = _launches_text(first, second)
    if first["beyond_noise"] is None:
        return (f"{pair} cannot be ranked: {launches}, so nothing measures the noise between launches; "
                f"run with --launches 2 or more.")
    interval = f"[{first['margin_low_pct']:+.0f}%, {first['margin_high_pct']:+.0f}%]"
    ahead = (f"{first['margin_pct']:.0f}% {interval} ahead of" if first["margin_pct"] < 100
             else f"{first['margin_pct'] / 100 + 1:.1f}× {interval} the images/s of")
    if first["beyond_noise"] is True and first["margin_pct"] >= TIE_PCT:
        return (f"{first['series']} is fastest at {first['images_per_s']:.0f} images/s, {ahead} "
                f"{second['series']} ({second['images_per_s']:.0f}); beyond the between-launch noise "
                f"({launches}, p = {first['p_value']:.2g}).")
    if first["margin_pct"] < TIE_PCT:
        return f"{pair} are tied: {first['margin_pct']:.1f}% {interval} apart ({launches})."
    needed = first["launches_to_resolve"]
    resolve = (f"at this campaign's noise, {int(needed)} launches each would resolve {first['margin_pct']:.0f}%"
               if not missing(needed) else f"more than {launch_noise.MAX_LAUNCHES} launches each would be "
               f"needed to resolve {first['margin_pct']:.0f}%")
    return (f"No clear winner: {first['series']} is {ahead} {second['series']}, within the between-launch "
            f"noise ({launches}; {resolve}).")


def verdicts(table: pd.DataFrame) -> list[TopologyVerdict]:
    """One `TopologyVerdict` per topology, in the table's order (model, then topology)."""
    found = []
    if table.empty:
        return found
    for _, rows in table.groupby(TOPOLOGY_KEYS, dropna=False, sort=True):
        rows = rows.sort_values(["rank", "series"], na_position="last")
        found.append(TopologyVerdict(topology_title(rows.iloc[0]), headline(rows), rows))
    return found
