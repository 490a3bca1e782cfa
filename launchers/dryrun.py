"""What a campaign will cost before it runs, for `--dry-run`: the environments (or container
images) it must build first, with their measured build times, and an estimate of how long its
runs will take.

The estimate of a run, in order of preference:

1. a stored run of the same configuration (this campaign, run before with other settings or
   interrupted): its start-up (wall time minus its steps) plus the new number of steps at its
   measured iteration time;
2. a stored one-worker run of the same model and per-worker batch (any scheme): its iteration
   time, scaled by the workers sharing a machine, plus the run's start-up (`startup_s`);
3. the measured defaults: the model catalogue's seconds per step and sample
   (`models.ModelFacts.step_s_per_sample`) and the start-up.

A run takes warm-up (its fixed steps and at least two windows of the steady-state check) +
iterations × repeats steps, plus three kinds of profile iterations (run
after backward, the framework's own way, and per-layer backward timing).  On a CPU, the workers on
one machine share its cores (threads per worker = cores / workers), so a step of two workers
is slower than one worker's: T threads make a step T ** 0.8 times faster than one.
"""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console
from rich.table import Table

from adapters.base import RunConfig
from analysis.rendering import missing
from core import schemes as catalogue
from core.envs import EnvUnavailable, environment_for
from launchers import plan as planning
from launchers.engine import EngineError, find_engine
from launchers.images import default_base, image_for
from models import model_facts

MEASURED = "2026-12 on a 2-core CPU VM (Debian 12, Python 3.11; pip's cache warm)"

# Seconds from nothing to a ready environment (core/envs.py: venv, pip install of the pins, a
# compile step where the env has one), measured on MEASURED from the build logs' first write to
# the environment's completion marker (host and mxnet timed again in an empty DLCOMPARE_HOME).
ENV_BUILD_S: dict[str, float] = {"host": 38, "torch": 42, "torch-mpi": 242, "tf": 45, "mxnet": 14,
                                 "horovod": 281, "cntk": 15, "jax": 25}
# Seconds to build each container image from scratch (launchers/images.py), same machine kind;
# the Debian base image (debootstrap) once for all of them.
IMAGE_BUILD_S: dict[str, float] = {"base": 120, "pytorch": 1131, "tensorflow": 145, "mxnet": 63}

# T threads make a step T ** THREAD_EXPONENT times faster (resnet50: 1.82x with 2 threads).
THREAD_EXPONENT = 0.8


# --------------------------------------------------------------------------- environments

def environments_needed(campaign: planning.Campaign) -> list[str]:
    """The environment names the campaign's frameworks run in, in plan order; the one an
    interpreter named with --python stands for is not built."""
    names = []
    for info, _ in campaign.frameworks:
        named = (info.backend_env or info.env) if info.name in campaign.python else None
        names += [n for n in (info.env, info.backend_env) if n and n not in names and n != named]
    return names


def environment_rows(campaign: planning.Campaign) -> list[tuple[str, str, float | None]]:
    """(environment, state, seconds to build it or None) for each environment needed, and
    each interpreter named with --python (checked when the campaign starts)."""
    rows = [(f"{name} (--python)", f"{path}: checked before the runs", None)
            for name, path in campaign.python.items()
            if name in {info.name for info, _ in campaign.frameworks}]
    for name in environments_needed(campaign):
        try:
            ready = environment_for(name).ready
        except EnvUnavailable as error:
            rows.append((name, f"cannot be built here: {error}", None))
        else:
            rows.append((name, "ready", None) if ready else (name, "missing: built first", ENV_BUILD_S.get(name)))
    return rows


def image_rows(campaign: planning.Campaign) -> list[tuple[str, str, float | None]]:
    """(image, state, seconds to build it or None) for --runtime container; nothing is
    installed or built to find out."""
    specs = [spec for spec in dict.fromkeys(image_for(info) for info, _ in campaign.frameworks) if spec]
    rows = [(info.name, "no image: cannot run in a container", None)
            for info, _ in campaign.frameworks if image_for(info) is None]
    try:
        engine = find_engine(install=False)
    except EngineError:
        return [("engine", "none: podman is installed first (apt, as root)", None),
                ("base", "missing: built first", IMAGE_BUILD_S["base"]),
                *((spec.name, "missing: built first", IMAGE_BUILD_S.get(spec.name)) for spec in specs), *rows]
    if not engine.image_exists(default_base()):
        rows.insert(0, ("base", f"missing: {default_base()} built first", IMAGE_BUILD_S["base"]))
    for spec in specs:
        tags = engine.run("images", "--format", "{{.Repository}}:{{.Tag}}", spec.repository,
                          check=False).stdout.split()
        present = any(tag.startswith(spec.repository + ":") for tag in tags)
        rows.append((spec.name, "present (rebuilt only if its inputs changed)", None) if present
                    else (spec.name, "missing: built first", IMAGE_BUILD_S.get(spec.name)))
    return rows


# --------------------------------------------------------------------------- duration

def steps_of(run: RunConfig) -> int:
    """Training steps one run takes: warm-up (the fixed steps, then at least the two windows
    of iterations / 2 that the steady-state check compares), timed, and three kinds of
    profile iterations."""
    windows = 2 * max(2, run.iterations // 2)
    return run.warmup + windows + run.iterations * run.repeats + 3 * max(1, run.profile_iterations)


def _stored_same(stored: pd.DataFrame, run: RunConfig) -> pd.Series | None:
    same = stored[(stored["framework"] == run.framework) & (stored["mode"] == run.mode)
                  & (stored["model"] == run.model) & (stored["batch_per_worker"] == run.batch_per_worker)
                  & (stored["nodes"] == run.nodes) & (stored["workers_per_node"] == run.workers_per_node)]
    return same.iloc[-1] if len(same) else None


def _stored_step(stored: pd.DataFrame, run: RunConfig) -> float | None:
    """Median iteration time of the stored one-worker runs of the run's model and batch."""
    same = stored[(stored["model"] == run.model) & (stored["batch_per_worker"] == run.batch_per_worker)
                  & (stored["world_size"] == 1)]
    return float(same["iter_time_median"].median()) if len(same) else None


def startup_s(framework: str, model: str) -> float:
    """Seconds a run spends outside its training steps: the framework's start-up, what the
    model's weights and graph add, and compiling the model's step (the catalogues' facts)."""
    facts = catalogue.FRAMEWORKS.get(framework)
    if facts is None:
        return catalogue.DEFAULT_STARTUP_S + model_facts(model).startup_s
    return facts.startup_s + model_facts(model).startup_s + facts.compile_s.get(model, 0.0)


def estimate_run(run: RunConfig, stored: pd.DataFrame) -> tuple[float | None, str]:
    """(seconds, where the estimate came from) for one run; None where nothing is known (a GPU
    with no stored run)."""
    startup = startup_s(run.framework, run.model)
    same = _stored_same(stored, run) if len(stored) else None
    if same is not None:
        step = float(same["iter_time_median"])
        warmed = same.get("extra_warmup_steps")  # the steps its warm-up took, where recorded
        old_steps = (int(same["warmup"]) if missing(warmed) else int(warmed)) + int(same["iterations"]) * int(same["repeats"])
        began = max(0.0, float(same["duration_s"]) - old_steps * step)
        return began + steps_of(run) * step, "stored"
    threads = max(1, run.threads_per_worker)
    one = _stored_step(stored, run) if len(stored) else None
    if one is not None:  # that run had every core: slower by the cores the run's workers share
        cores = max(1, int(stored["threads_per_worker"].max() or 1))
        return startup + steps_of(run) * one * (cores / threads) ** THREAD_EXPONENT, "stored"
    per_sample = model_facts(run.model).step_s_per_sample
    if per_sample is None or run.device != "cpu":
        return None, "unknown"
    return startup + steps_of(run) * per_sample * run.batch_per_worker / threads ** THREAD_EXPONENT, "defaults"


def estimate(runs: list[RunConfig], stored: pd.DataFrame) -> tuple[float, dict[str, int]]:
    """(seconds for the runs that have an estimate, how many came from each source)."""
    stored = stored[stored["status"] == "ok"] if len(stored) and "status" in stored.columns else stored.iloc[0:0]
    total, sources = 0.0, {"stored": 0, "defaults": 0, "unknown": 0}
    for run in runs:
        seconds, source = estimate_run(run, stored)
        sources[source] += 1
        total += seconds or 0.0
    return total, sources


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, math.ceil(seconds)):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- printing

def print_costs(console: Console, campaign: planning.Campaign, pending: list[RunConfig],
                stored: pd.DataFrame, calibrating: bool = False) -> None:
    """The dry run's account of what running the campaign takes."""
    container = campaign.runtime == "container"
    rows = image_rows(campaign) if container else environment_rows(campaign)
    table = Table(title="Container images" if container else "Environments")
    for column in ("image" if container else "environment", "state", "build time"):
        table.add_column(column)
    for name, state, seconds in rows:
        table.add_row(name, state, "" if seconds is None else f"about {duration_text(seconds)}")
    console.print(table)
    console.print(f"[dim]Build times measured {MEASURED}.[/dim]", soft_wrap=True)
    building = sum(s for _, state, s in rows if s is not None and state.startswith("missing"))
    seconds, sources = estimate(pending, stored)
    parts = [f"{len(pending)} runs to run: about {duration_text(seconds)} on a quiet machine (±50 %)" if pending
             else "nothing to run: every run is stored"]
    if building:
        parts.append(f"after about {duration_text(building)} of building")
    basis = [f"{n} from {source} runs" if source == "stored" else
             f"{n} from the measured defaults ({MEASURED.split(' (')[0]})" if source == "defaults" else
             f"{n} without an estimate (no stored run of them on this device)"
             for source, n in sources.items() if n]
    console.print("Estimated duration: " + ", ".join(parts) + (f"; {'; '.join(basis)}" if basis else "") + ".",
                  soft_wrap=True)
    if calibrating:
        console.print("--calibrate adds a calibration per scheme and worker count before and after the runs "
                      "(not in the estimate).", soft_wrap=True)
