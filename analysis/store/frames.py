"""The store's rows as pandas DataFrames, with stable dtypes, for tables and figures.

Only the frames need pandas: the store itself, its lock and its repair run on the standard
library (``python -m analysis.store repair`` starts from any Python).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

import pandas as pd

from analysis.record import PHASES, RUN_COLUMNS
from analysis.store.schema import CALIBRATION_COLUMNS, COLUMN_TYPES, PHASE_CONTEXT_COLUMNS


def runs_frame(runs: Iterable[Mapping], phases: Iterable[Mapping]) -> pd.DataFrame:
    """One row per run (rows of ``runs``, in order) with its phases (rows of ``phases``)
    widened onto it; see `ResultStore.runs_frame`."""
    base = []
    for row in runs:
        flat = {name: row[name] for name in RUN_COLUMNS}
        flat.update(flatten("env", json.loads(row["env_json"] or "{}")))
        flat.update(flatten("extra", json.loads(row["extra_json"] or "{}")))
        base.append(flat)
    frame = pd.DataFrame(base, columns=None if base else list(RUN_COLUMNS))
    for column in frame.columns:
        if column.startswith(("env_", "extra_")):
            frame[column] = free_column([row.get(column) for row in base], frame.index)
    frame = typed(frame)
    return frame.join(phase_columns(phases), on="run_id") if len(frame) else with_phase_columns(frame)


def phase_columns(phases: Iterable[Mapping]) -> pd.DataFrame:
    """Wide per-run phase times: index run_id, columns phase_<p>_s / phase_<p>_pred_s."""
    long = pd.DataFrame([dict(row) for row in phases], columns=["run_id", "phase", "measured_s", "predicted_s"])
    names = list(PHASES) + [p for p in dict.fromkeys(long["phase"]) if p not in PHASES]
    wide = pd.DataFrame(index=pd.Index(sorted(set(long["run_id"])), name="run_id"))
    for name in names:
        sub = long[long["phase"] == name].set_index("run_id")
        wide[f"phase_{name}_s"] = pd.to_numeric(sub["measured_s"], errors="coerce").reindex(wide.index)
        wide[f"phase_{name}_pred_s"] = pd.to_numeric(sub["predicted_s"], errors="coerce").reindex(wide.index)
    return wide.astype("float64")


def phases_frame(rows: Iterable[Mapping]) -> pd.DataFrame:
    """The long phase table (rows of phases joined with `PHASE_CONTEXT_COLUMNS` of their run);
    see `ResultStore.phases_frame`."""
    columns = ["run_id", "phase", "measured_s", "predicted_s", *PHASE_CONTEXT_COLUMNS]
    frame = typed(pd.DataFrame([dict(row) for row in rows], columns=columns))
    frame["measured_s"] = pd.to_numeric(frame["measured_s"], errors="coerce").astype("float64")
    frame["predicted_s"] = pd.to_numeric(frame["predicted_s"], errors="coerce").astype("float64")
    order = {name: i for i, name in enumerate(PHASES)}
    frame.insert(2, "phase_order", [order.get(p, len(PHASES)) for p in frame["phase"]])
    return frame


def calibration_frame(calibrations: Iterable[Mapping]) -> pd.DataFrame:
    """One row per calibration (`ResultStore.calibrations`) without env and extra, plus
    ``windows``; see `ResultStore.calibration_frame`."""
    rows = [{**{k: v for k, v in row.items() if k not in ("env", "extra")},
             "windows": row["extra"].get("windows") or []} for row in calibrations]
    return pd.DataFrame(rows, columns=["calibration_id", *CALIBRATION_COLUMNS, "measured_at", "windows"])


def flatten(prefix: str, value: dict) -> dict[str, Any]:
    """Nested dict -> flat ``prefix_key[_subkey]`` columns; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, item in value.items():
        column = f"{prefix}_{key}"
        if isinstance(item, dict):
            flat.update(flatten(column, item))
        elif isinstance(item, (list, tuple)):
            flat[column] = json.dumps(item, default=str)
        else:
            flat[column] = item
    return flat


def free_column(values: list, index) -> pd.Series:
    """A free-form ``env_``/``extra_`` column: whole numbers as nullable Int64 (16 stays 16,
    not 16.0), numbers as float64, anything else (text, booleans, mixed) as objects."""
    present = [v for v in values if v is not None]
    numbers = [v for v in present if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not present or len(numbers) != len(present):
        return pd.Series(values, index=index, dtype=object)
    if all(isinstance(v, int) for v in numbers):
        return pd.Series(values, index=index, dtype="Int64")
    return pd.Series([math.nan if v is None else float(v) for v in values], index=index, dtype="float64")


def typed(frame):
    """Give run columns stable dtypes: nullable Int64 for INTEGER, float64 for REAL."""
    for name in frame.columns:
        sqltype = COLUMN_TYPES.get(name)
        if sqltype == "INTEGER":
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("Int64")
        elif sqltype == "REAL":
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
        elif sqltype == "TEXT":
            frame[name] = frame[name].astype(object).where(frame[name].notna(), None)
    return frame


def with_phase_columns(frame):
    """An empty runs frame still carries the phase columns."""
    for name in PHASES:
        frame[f"phase_{name}_s"] = pd.Series(dtype="float64")
        frame[f"phase_{name}_pred_s"] = pd.Series(dtype="float64")
    return frame


def first_launches(frame, launches: int | None):
    """The runs of launches 1..`launches` (``extra_launch``; a record without one is launch 1);
    every run where `launches` is None."""
    if not launches or "extra_launch" not in frame.columns:
        return frame
    launch = pd.to_numeric(frame["extra_launch"], errors="coerce").fillna(1)
    return frame[launch <= int(launches)].reset_index(drop=True)
