"""Benchmark: the study's single-GPU questions measured on a real GPU, in one run of at most
eight minutes, with the frameworks of an environment the machine already has.

    # on a machine with a CUDA GPU whose python3 has PyTorch (and JAX), offline:
    DLCOMPARE_NO_BOOTSTRAP=1 python3 -m bench.gpu_study --out /tmp/gpu-study --export "$OUT"
    # here, once, before: wheels of the launcher's own packages, for a node that lacks them
    python3 -m bench.gpu_study --prepare
    # on a CPU, tiny models, in a minute or two (what the test suite runs)
    python3 -m bench.gpu_study --tiny --out results/gpu-study-tiny

Every number comes from the project's own code: each section is a campaign of
`python -m launchers.compare` (or `launchers.calibrate`) with `--python torch=PATH` (the
framework's ranks in the given interpreter, not a built virtualenv) and `--device gpu`, all into
one campaign folder (results.sqlite, the report), from which this script writes the study's
tables under `<out>/gpu_study/` (Markdown and CSV) and `<out>/gpu_study.md` (all of them):

- gpu_phases: PyTorch on one GPU, AlexNet / GoogleNet / ResNet-50 at the study's per-GPU
  batches 1024 / 128 / 32: io, h2d, forward, backward, update, iteration time, images/s (JAX's
  rows too, where the registry has JAX and the interpreter imports it);
- h2d: host-to-device copies from pinned and from pageable memory;
- contention, overlap: two ranks on the one GPU (over gloo): the calibrated alpha, beta and the
  contention shares kappa, kappa_c; a 2-rank training run's overlap;
- cudnn_layout: cuDNN autotuning on/off x NCHW/NHWC, forward and backward time per model;
- precision: float32 vs TF32 vs bfloat16 (autocast) throughput.

docs/gpu.md says what each table answers.  On a CPU (--tiny, or no GPU) what only a GPU has
(cuDNN autotuning, pageable copies, TF32) is marked "skipped on CPU".  Sections run in order
while the deadline (--deadline, from the start) leaves them time; a section that would not fit
is marked "skipped: deadline", and everything measured so far is written anyway.  --export DIR
puts `gpu_study.tar.gz` (the whole campaign folder), `gpu_study.md` and `gpu_study.log` there:
what a device machine's $OUT brings back.

The launcher itself runs in this interpreter with DLCOMPARE_NO_BOOTSTRAP=1 (no virtualenv is
built); the packages it needs that this interpreter lacks (rich, tabulate, psutil, Pillow,
PyYAML) are unpacked from the wheels `--prepare` downloaded (`--wheels`, default .gpu_wheels/,
ignored by git; carry it along).  NumPy, pandas, matplotlib and seaborn must be there already.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from adapters.registry import FRAMEWORKS, framework_info
from bench import run_command
from core.cli import OneLineParser, fail
from core.envs import REPO_ROOT, ensure_environment, reexec_in_host_env
from launchers.interpreters import InterpreterError, probe_interpreter, versions_line
from models import model_facts

STUDY_BATCH = {name: model_facts(name).default_batch["gpu"] for name in ("alexnet", "googlenet", "resnet50")}
TINY_BATCH = {"alexnet-tiny": 4}
GPU_TIMING = {"--warmup": 3, "--iterations": 5, "--repeats": 3, "--profile-iterations": 3}
# three profile iterations even tiny: their median leaves out a first one that compiles (JAX)
TINY_TIMING = {"--warmup": 1, "--iterations": 2, "--repeats": 2, "--profile-iterations": 3}
# Two ranks on one GPU: GoogleNet's 28 MB gradient, not AlexNet's 244 MB, which gloo would
# copy through the host for most of each step
CONTENTION_MODEL = {"gpu": ("googlenet", 128), "cpu": ("alexnet-tiny", 4)}
# Up to sizes whose transfer outweighs the per-message cost (on loopback gloo ~0.4 ms, at
# ~2 GB/s 4 MB takes ~2 ms): below that the fitted slope is noise and may come out zero, a
# bandwidth the fit cannot state
CALIBRATION_SIZES = {"gpu": ["--min-bytes", "4K", "--max-bytes", "64M", "--repeats", "5"],
                     "cpu": ["--min-bytes", "1K", "--max-bytes", "4M", "--repeats", "3"]}
RESERVE_S = 25.0  # kept back at the end: the tables, the report, the archive
RUN_TIMEOUT_S = 150.0  # a single run's limit (the campaign's --timeout): a hang costs no more
# Seconds one campaign invocation needs at least (start-up, one run): under this it is skipped
LEAST_S = {"gpu": 45.0, "cpu": 20.0}

GPU_PYTHON = "3.12"  # the interpreter of the device machine the wheels are for
DEFAULT_WHEELS = REPO_ROOT / ".gpu_wheels"
# Packages the launcher imports that a GPU node's python may lack, by import name: the
# distribution whose wheel supplies it (rich's own dependencies with it).
WHEEL_PACKAGES = {"rich": "rich", "markdown_it": "markdown-it-py", "mdurl": "mdurl",
                  "pygments": "pygments", "tabulate": "tabulate", "psutil": "psutil",
                  "PIL": "pillow", "yaml": "PyYAML"}
PINNED_WHEELS = ("rich", "tabulate", "psutil", "pillow", "PyYAML")  # versions of envs/host.txt
# The launcher's packages carried by no wheel (too large; a GPU node's Python has them)
REQUIRED_HERE = ("numpy", "pandas", "matplotlib", "seaborn")
WORKER_PACKAGES = ("numpy", "PIL")

# A campaign's label -> (what it adds to the baseline's flags, whether a CPU has it too)
VARIANTS = {
    "baseline": ([], True),
    "cudnn-off": (["--option", "cudnn_benchmark=false"], False),
    "nhwc": (["--channels-last"], True),
    "nhwc-cudnn-off": (["--channels-last", "--option", "cudnn_benchmark=false"], False),
    "pageable": (["--option", "pinned=false"], False),
    "tf32": (["--dtype", "tf32"], False),
    "bfloat16": (["--dtype", "bfloat16"], True),
}
SECTIONS = {  # in the order they run: the study's questions first, the cheap ones before
    "phases": ["baseline"],
    "h2d": ["pageable"],
    "contention": ["calibration", "two-ranks"],
    "cudnn_layout": ["cudnn-off", "nhwc", "nhwc-cudnn-off"],
    "precision": ["tf32", "bfloat16"],
    "jax": ["jax"],
}


def log(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------- wheels

def host_pins() -> dict[str, str]:
    """name (lower case) -> version pinned in envs/host.txt."""
    pins = {}
    for line in (REPO_ROOT / "envs" / "host.txt").read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower()] = version.strip()
    return pins


def prepare_wheels(folder: Path, python_version: str = GPU_PYTHON) -> int:
    """Download (here, online) the wheels of the launcher's packages for the GPU node's
    Python, at envs/host.txt's pins, and say how much they and the repository weigh."""
    pins = host_pins()
    requirements = [f"{name}=={pins[name.lower()]}" for name in PINNED_WHEELS]
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
               "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
               "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
               "-d", str(folder), *requirements]
    if subprocess.run(command).returncode != 0:
        return fail("pip could not download the wheels (is PyPI reachable from here?)", 1)
    wheels = sum(path.stat().st_size for path in folder.glob("*.whl"))
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True).stdout
    repository = sum((REPO_ROOT / name).stat().st_size for name in tracked.decode().split("\0")
                     if name and (REPO_ROOT / name).is_file())
    log(f"wheels: {wheels / 2**20:.1f} MiB in {folder}; repository: {repository / 2**20:.1f} MiB; "
        f"together {(wheels + repository) / 2**20:.1f} MiB of the 64 MiB a device call carries")
    return 0


def present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def wheel_for(folder: Path, distribution: str) -> Path | None:
    normal = re.sub(r"[-_.]+", "_", distribution).lower()
    return next((wheel for wheel in sorted(folder.glob("*.whl"))
                 if wheel.name.split("-")[0].lower() == normal), None)


def unpack_missing(names: list[str], wheels: Path, site: Path) -> list[str]:
    """Unpack the wheels of the import `names` into `site` (a wheel is a zip of what
    site-packages holds); the names no wheel supplies."""
    lacking = []
    for name in names:
        wheel = wheel_for(wheels, WHEEL_PACKAGES.get(name, name))
        if wheel is None:
            lacking.append(name)
            continue
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        log(f"  {name}: unpacked {wheel.name}")
    return lacking


def missing_in(python: str, names) -> list[str]:
    """The import names another interpreter cannot find."""
    code = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if not importlib.util.find_spec(n)))"
    result = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=60)
    return result.stdout.split()


def supply_packages(framework_pythons: dict[str, str], wheels: Path, site: Path) -> dict[str, str]:
    """Make the launcher's packages importable here (and in every child), and the worker's in
    each framework interpreter, from the wheels where missing; returns the framework
    interpreters to use (a wrapper that adds the unpacked wheels where one needed them)."""
    missing = [name for name in WHEEL_PACKAGES if not present(name)]
    lacking_workers = {framework: missing_in(python, WORKER_PACKAGES)
                       for framework, python in framework_pythons.items()}
    wanted = list(dict.fromkeys(missing + [n for names in lacking_workers.values() for n in names]))
    if wanted:
        log(f"from the wheels in {wheels}: {', '.join(wanted)}")
        site.mkdir(parents=True, exist_ok=True)
        lacking = unpack_missing(wanted, wheels, site)
        if lacking:
            raise SystemExit(fail(f"{', '.join(lacking)} missing here and not among the wheels in "
                                  f"{wheels} (python -m bench.gpu_study --prepare downloads them)"))
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    chosen = {}
    for framework, python in framework_pythons.items():
        chosen[framework] = python if not lacking_workers[framework] else wrapper(python, site)
    return chosen


def wrapper(python: str, site: Path) -> str:
    """An executable that runs `python` with the unpacked wheels on its path: the ranks' own
    PYTHONPATH is the repository's alone (launchers/local.py)."""
    path = site / f"python-{hashlib.sha256(python.encode()).hexdigest()[:8]}"
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" "$@"\n')
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------------- inventory

def gpu_inventory() -> list[str]:
    """nvidia-smi's GPUs: name, memory, driver; [] without a driver."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def package_version(name: str) -> str | None:
    if not present(name):
        return None
    distribution = WHEEL_PACKAGES.get(name, name)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "present"


def inventory(pythons: dict[str, str]) -> dict:
    """What this run can tell before measuring: the interpreter, the GPUs, every framework
    interpreter's versions (or why it cannot run), the launcher's packages here."""
    facts = {"python": sys.version.split()[0], "executable": sys.executable,
             "cpu_count": os.cpu_count(), "gpus": gpu_inventory(), "frameworks": {},
             "packages": {name: package_version(name) for name in
                          (*REQUIRED_HERE, *WHEEL_PACKAGES, "mpi4py")}}
    for name, python in pythons.items():
        try:
            facts["frameworks"][name] = {"interpreter": python,
                                         "versions": probe_interpreter(framework_info(name), python)}
        except InterpreterError as error:
            facts["frameworks"][name] = {"interpreter": python, "error": str(error)}
    return facts


def inventory_lines(facts: dict) -> list[str]:
    lines = [f"launcher: Python {facts['python']} ({facts['executable']}), {facts['cpu_count']} CPUs",
             f"GPUs: {'; '.join(facts['gpus']) or 'none (nvidia-smi finds no GPU)'}"]
    for name, found in facts["frameworks"].items():
        lines.append(f"{name}: {found.get('error') or found['interpreter'] + ' (' + versions_line(found['versions']) + ')'}")
    packages = facts["packages"]
    lines.append("packages here: " + ", ".join(f"{n} {v}" for n, v in packages.items() if v))
    absent = [n for n, v in packages.items() if not v]
    lines.append("absent here: " + (", ".join(absent) or "none"))
    return lines


# --------------------------------------------------------------------------- the study

@dataclass
class Study:
    out: Path
    tiny: bool
    device: str
    pythons: dict[str, str]  # framework -> interpreter of its ranks
    deadline: float  # time.monotonic() by which everything, the export included, is done
    statuses: dict[str, str] = field(default_factory=dict)  # variant label -> what happened
    run_ids: dict[str, list[str]] = field(default_factory=dict)  # variant label -> its runs
    sections: dict[str, dict] = field(default_factory=dict)  # name -> {status, seconds}

    @property
    def batches(self) -> dict[str, int]:
        return TINY_BATCH if self.tiny else STUDY_BATCH

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def stored_ids(self) -> set[str]:
        path = self.out / "results.sqlite"
        if not path.exists():
            return set()
        import sqlite3  # the store's own file, read without pandas: only the run ids

        with sqlite3.connect(path) as db:
            return {row[0] for row in db.execute("SELECT run_id FROM runs")}

    def skip(self, label: str, reason: str) -> None:
        self.statuses[label] = reason
        log(f"    {label}: {reason}")

    def campaign(self, label: str, arguments: list[str], framework: str = "torch",
                 batches: dict[str, int] | None = None, workers: int = 1) -> None:
        """One `launchers.compare` into the study's folder, if the deadline leaves room."""
        if self.left() < LEAST_S[self.device]:
            return self.skip(label, "skipped: deadline")
        batches = batches or self.batches
        timing = TINY_TIMING if self.tiny else GPU_TIMING
        command = ["--frameworks", framework, "--model", ",".join(batches),
                   "--batch-size", ",".join(f"{m}={b}" for m, b in batches.items()),
                   "--workers", str(workers), "--device", self.device,
                   "--python", f"{framework}={self.pythons[framework]}",
                   "--timeout", str(int(min(RUN_TIMEOUT_S, self.left()))),
                   *(str(item) for pair in timing.items() for item in pair), *arguments]
        self.run_logged(label, ["launchers.compare", *command, "--out", str(self.out)])

    def run_logged(self, label: str, module_and_arguments: list[str]) -> None:
        """Run a launcher command (its output to logs/<label>.log), note its runs and status."""
        before, started, limit = self.stored_ids(), time.monotonic(), max(1.0, self.left())
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        code = run_command(module_and_arguments, timeout=limit, log=self.out / "logs" / f"{label}.log")
        self.run_ids[label] = sorted(self.stored_ids() - before)
        stored = (f"{len(self.run_ids[label])} runs stored" if module_and_arguments[0] == "launchers.compare"
                  else "a calibration stored" if code == 0 else "no calibration stored")
        status = {0: "ok", 1: "some run failed", 2: "bad input"}.get(code, f"exit {code}")
        if time.monotonic() - started >= limit:
            status = "cut by the deadline"
        elif code != 0:
            status += f" ({failure_line(self.out / 'logs' / f'{label}.log')})"
        self.statuses[label] = status
        log(f"    {label}: {status} in {time.monotonic() - started:.0f} s "
            f"({stored}; log: logs/{label}.log)")

    def calibration(self, label: str) -> None:
        """`launchers.calibrate` of PyTorch on 2 ranks (on one GPU: shared, over gloo)."""
        if self.left() < LEAST_S[self.device]:
            return self.skip(label, "skipped: deadline")
        share = ["--option", "share_gpu=true"] if self.device == "gpu" else []
        self.run_logged(label, ["launchers.calibrate", "--frameworks", "torch", "--workers", "2",
                                "--device", self.device, "--python", f"torch={self.pythons['torch']}",
                                *CALIBRATION_SIZES[self.device], *share,
                                "--timeout", str(int(min(RUN_TIMEOUT_S, self.left()))),
                                "--out", str(self.out)])

    def run_section(self, name: str) -> None:
        started = time.monotonic()
        log(f"[{name}] {max(0.0, self.left()):.0f} s left for this and what follows")
        if name == "contention":
            model, batch = CONTENTION_MODEL[self.device]
            self.calibration("calibration")
            share = ["--option", "share_gpu=true"] if self.device == "gpu" else []
            self.campaign("two-ranks", share, batches={model: batch}, workers=2)
        elif name == "jax":
            if "jax" not in FRAMEWORKS:
                self.skip("jax", "skipped: the registry has no JAX adapter")
            elif "jax" not in self.pythons:
                self.skip("jax", "skipped: the interpreter cannot run JAX (see the inventory)")
            else:
                self.campaign("jax", [], framework="jax")
        else:
            for label in SECTIONS[name]:
                arguments, on_cpu = VARIANTS[label]
                if self.device == "cpu" and not on_cpu:
                    self.skip(label, "skipped on CPU")
                else:
                    self.campaign(label, arguments)
        labels = SECTIONS[name]
        self.sections[name] = {"status": "; ".join(f"{label}: {self.statuses.get(label, '?')}"
                                                   for label in labels),
                               "seconds": round(time.monotonic() - started, 1)}


def failure_line(path: Path) -> str:
    """The last line of a command's log that says what went wrong."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    words = ("error", "failed", "unavailable", "timeout")
    found = next((line.strip() for line in reversed(lines) if any(w in line.lower() for w in words)), "")
    return found[:160] or "see its log"


# --------------------------------------------------------------------------- tables

def phase_ms(record: dict, phase: str) -> float | None:
    for entry in record.get("phases") or []:
        if entry["phase"] == phase and entry.get("measured_s") is not None:
            return entry["measured_s"] * 1e3
    return None


def rounded(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


class Tables:
    """The study's tables from the campaign's records, each run found by the variant that
    made it (Study.run_ids), each row saying why it is empty where it is."""

    def __init__(self, study: Study, records: list[dict], calibrations: list[dict]):
        self.study, self.calibrations = study, calibrations
        self.by_id = {record["run_id"]: record for record in records}

    def record(self, label: str, model: str) -> dict | None:
        found = [self.by_id[i] for i in self.study.run_ids.get(label, []) if i in self.by_id]
        return next((r for r in found if r["model"] == model), None)

    def status(self, label: str, record: dict | None) -> str:
        if record is None:
            return self.study.statuses.get(label, "not run")
        if record["status"] != "ok":
            lines = [line for line in (record.get("error") or "").splitlines() if line.strip()]
            return f"{record['status']}: {lines[-1][:120] if lines else ''}"
        return "measured"

    def timing(self, label: str, model: str) -> dict:
        """The common columns of one variant's run of `model`."""
        record = self.record(label, model)
        row = {"status": self.status(label, record)}
        if record is None or record["status"] != "ok":
            return row
        for phase in ("io", "h2d", "forward", "backward", "update"):
            row[f"{phase}_ms"] = rounded(phase_ms(record, phase))
        row.update(iteration_ms=rounded(record["iter_time_median"] * 1e3),
                   p10_ms=rounded(record["iter_time_p10"] * 1e3),
                   p90_ms=rounded(record["iter_time_p90"] * 1e3),
                   images_per_s=rounded(record["throughput"], 1))
        return row

    def gpu_phases(self):
        rows = []
        for label, framework in (("baseline", "torch"), ("jax", "jax")):
            if label == "jax" and label not in self.study.statuses:
                continue
            for model, batch in self.study.batches.items():
                row = {"framework": framework_info(framework).label if framework in FRAMEWORKS else framework,
                       "model": model, "batch": batch, **self.timing(label, model)}
                phases = [row.get(f"{p}_ms") for p in ("io", "h2d", "forward", "backward", "update")]
                if all(p is not None for p in phases) and sum(phases) > 0:
                    row["phases_ms"] = rounded(sum(phases))
                    row["io_h2d_pct"] = rounded(100 * (phases[0] + phases[1]) / sum(phases), 1)
                rows.append(row)
        return rows

    def cudnn_layout(self):
        rows = []
        for model, batch in self.study.batches.items():
            baseline = self.timing("baseline", model).get("iteration_ms")
            for label, layout, benchmark in (("baseline", "NCHW", "on"), ("cudnn-off", "NCHW", "off"),
                                             ("nhwc", "NHWC", "on"), ("nhwc-cudnn-off", "NHWC", "off")):
                timing = self.timing(label, model)
                if self.study.device == "cpu":
                    benchmark = "n/a on CPU"
                rows.append({"model": model, "batch": batch, "layout": layout,
                             "cudnn_benchmark": benchmark, "status": timing["status"],
                             "forward_ms": timing.get("forward_ms"), "backward_ms": timing.get("backward_ms"),
                             "iteration_ms": timing.get("iteration_ms"),
                             "images_per_s": timing.get("images_per_s"),
                             "speedup": rounded(baseline / timing["iteration_ms"], 3)
                             if baseline and timing.get("iteration_ms") else None})
        return rows

    def h2d(self):
        from models import get_model  # NumPy: imported once the launcher's packages are there

        rows = []
        for model, batch in self.study.batches.items():
            channels, height, width = get_model(model).input_shape
            nbytes = batch * (channels * height * width * 4 + 8)  # float32 images, int64 labels
            row = {"model": model, "batch": batch, "batch_MB": rounded(nbytes / 1e6, 1)}
            for label, memory in (("baseline", "pinned"), ("pageable", "pageable")):
                timing = self.timing(label, model)
                row[f"{memory}_status"] = ("n/a on CPU: no copy" if self.study.device == "cpu"
                                           else timing["status"])
                row[f"{memory}_io_ms"] = timing.get("io_ms")
                row[f"{memory}_h2d_ms"] = timing.get("h2d_ms")
                h2d = timing.get("h2d_ms")
                row[f"{memory}_GBps"] = (rounded(nbytes / (h2d / 1e3) / 1e9, 1)
                                         if h2d and self.study.device == "gpu" else None)
            rows.append(row)
        return rows

    def precision(self):
        rows = []
        for model, batch in self.study.batches.items():
            baseline = self.timing("baseline", model).get("images_per_s")
            for label, precision in (("baseline", "float32"), ("tf32", "tf32"), ("bfloat16", "bfloat16")):
                timing = self.timing(label, model)
                rows.append({"model": model, "batch": batch, "precision": precision,
                             "status": timing["status"], "forward_ms": timing.get("forward_ms"),
                             "backward_ms": timing.get("backward_ms"),
                             "iteration_ms": timing.get("iteration_ms"),
                             "images_per_s": timing.get("images_per_s"),
                             "speedup": rounded(timing["images_per_s"] / baseline, 3)
                             if baseline and timing.get("images_per_s") else None})
        return rows

    def contention(self):
        """The 2-rank calibration: its fit and the contention shares it found."""
        fits = [c for c in self.calibrations if c["framework"] == "torch" and c["world_size"] == 2
                and c["device_kind"] == self.study.device]
        status = self.study.statuses.get("calibration", "not run")
        if not fits:
            return [{"calibration": "PyTorch all-reduce, 2 ranks", "status": status}]
        fit = fits[-1]
        probe = (fit.get("extra") or {}).get("contention") or {}
        slowdowns = sorted(w / a for w, a in zip(probe.get("with_s") or [], probe.get("alone_s") or []) if a)
        return [{"calibration": f"PyTorch {fit['transport']} all-reduce, 2 ranks", "status": status,
                 "alpha_us": rounded(fit["alpha_s"] * 1e6, 1),
                 "bandwidth_GBps": rounded(1 / fit["beta_s_per_byte"] / 1e9, 2) if fit["beta_s_per_byte"] else None,
                 "fit_error_pct": rounded(100 * fit["rel_rmse"], 1),
                 "backward_slowdown_pct": rounded(100 * (slowdowns[len(slowdowns) // 2] - 1), 1) if slowdowns else None,
                 "kappa": rounded(fit.get("contention"), 3), "kappa_c": rounded(fit.get("transfer_contention"), 3)}]

    def overlap(self):
        """The 2-rank training run beside the 1-rank one."""
        model, batch = CONTENTION_MODEL[self.study.device]
        one, two = self.timing("baseline", model), self.timing("two-ranks", model)
        record = self.record("two-ranks", model)
        row = {"model": model, "batch": batch, "status": two["status"], "one_rank_ms": one.get("iteration_ms"),
               "two_ranks_ms": two.get("iteration_ms"), "backward_ms": two.get("backward_ms")}
        if record is not None and record["status"] == "ok":
            extra = record.get("extra") or {}
            row.update(comm_ms=rounded(phase_ms(record, "comm")),
                       backward_comm_ms=rounded((extra.get("profile_backward_comm") or 0) * 1e3),
                       overlap=rounded(record["overlap"], 3),
                       predicted_ms=rounded((record.get("predicted_iter_time") or 0) * 1e3) or None,
                       ranks_per_gpu=extra.get("ranks_per_gpu"), backend=extra.get("backend"))
        return [row]


TABLES = {  # name -> (title, what it answers), in the order the sections run
    "gpu_phases": ("One GPU: phases per iteration",
                   "PyTorch (and JAX) on one device at the study's per-GPU batches; phases from the "
                   "synchronised profile, iteration and images/s from the timed loops (median, p10-p90)."),
    "h2d": ("Host-to-device copies: pinned vs pageable",
            "A batch (float32 images, int64 labels) copied from page-locked memory (the page-locking "
            "copy is in io) or from pageable memory; GB/s = bytes / h2d phase."),
    "contention": ("Two ranks on one device: contention",
                   "The 2-rank calibration (launchers.calibrate): alpha and bandwidth of the all-reduce, "
                   "the probe's median slowdown of backward while gradients are sent, and the shares "
                   "the model fits to it: kappa (backward slowed by transfers), kappa_c (transfers "
                   "slowed by backward)."),
    "overlap": ("Two ranks on one device: overlap",
                "A 2-rank DDP run beside the 1-rank one: separated backward and comm, overlapped "
                "backward+comm, overlap = the share of comm hidden behind backward, and the "
                "performance model's prediction with the calibration above."),
    "cudnn_layout": ("cuDNN autotuning x memory layout",
                     "Forward and backward per model with cuDNN's autotuner on or off, NCHW or NHWC; "
                     "speedup = NCHW-with-autotuning iteration / this one."),
    "precision": ("float32 vs TF32 vs bfloat16",
                  "float32 with TF32 math off, TF32 tensor-core math, bfloat16 autocast (float32 "
                  "weights); speedup = images/s over float32's."),
}


def measured_with(versions: dict) -> str:
    """' PyTorch 2.5.1, CUDA 12.4, cuDNN 90100, NCCL 2.21.5; Python 3.12.3 (PATH).' from a
    run's environment; '' without one."""
    if not versions:
        return ""
    libraries = ", ".join(f"{label} {versions[key]}" for key, label in (
        ("torch", "PyTorch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")) if versions.get(key))
    interpreter = versions.get("python_override") or versions.get("python_executable") or "?"
    return f" {libraries}; Python {versions.get('python', '?')} ({interpreter})."


def write_tables(study: Study, facts: dict, started: float) -> Path:
    """Every table as gpu_study/<name>.md and .csv, and all of them in gpu_study.md."""
    import pandas as pd  # the launcher's packages are importable only once supply_packages ran

    from analysis.store import ResultStore
    from analysis.tables import to_markdown

    folder = study.out / "gpu_study"
    folder.mkdir(parents=True, exist_ok=True)
    records, calibrations = [], []
    if (study.out / "results.sqlite").exists():
        with ResultStore.for_campaign(study.out, create=False) as store:
            records, calibrations = store.records(), store.calibrations()
    tables = Tables(study, records, calibrations)
    versions = next((r["env"] for r in records if r["status"] == "ok" and r["framework"] == "torch"), {})
    device = next((r["device_name"] for r in records if r["status"] == "ok"), None) or "; ".join(facts["gpus"])
    parts = [f"# The study's single-GPU questions on {device or 'this machine'}\n",
             f"{time.strftime('%Y-%m-%d')}, {'tiny models on the CPU' if study.device == 'cpu' else 'one GPU'}; "
             f"{time.monotonic() - started:.0f} s in all." + measured_with(versions) + "\n",
             "## Inventory\n", *(f"- {line}" for line in inventory_lines(facts)), "",
             "## Sections\n", to_markdown(pd.DataFrame(
                 [{"section": name, **value} for name, value in study.sections.items()])
                 if study.sections else pd.DataFrame())]
    for name, (title, description) in TABLES.items():
        frame = pd.DataFrame(getattr(tables, name)())
        frame.to_csv(folder / f"{name}.csv", index=False)
        text = f"## {title}\n\n{description}\n\n{to_markdown(frame)}"
        (folder / f"{name}.md").write_text(f"#{text}")
        parts.append(text)
    path = study.out / "gpu_study.md"
    path.write_text("\n".join(parts) + "\n")
    (study.out / "gpu_study_inventory.json").write_text(json.dumps(facts, indent=1))
    return path


def rebuild_report(study: Study) -> None:
    """The campaign's report over every run (a section cut by the deadline ended before its
    own report)."""
    if not (study.out / "results.sqlite").exists():
        log("report: nothing stored")
        return
    from analysis.report import build_report  # pandas, matplotlib: after supply_packages

    try:
        log(f"report: {build_report(study.out)}")
    except Exception as error:  # noqa: BLE001 - the tables are written; the report is a bonus
        log(f"report: failed: {type(error).__name__}: {error}")


def export(study: Study, folder: Path, table_path: Path, log_path: Path) -> None:
    """gpu_study.tar.gz (the campaign folder), gpu_study.md and gpu_study.log into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "gpu_study.tar.gz", "w:gz") as archive:
        archive.add(study.out, arcname=study.out.name)
    shutil.copy(table_path, folder / "gpu_study.md")
    if log_path.exists():
        shutil.copy(log_path, folder / "gpu_study.log")
    log(f"exported to {folder}: gpu_study.tar.gz "
        f"({(folder / 'gpu_study.tar.gz').stat().st_size / 2**20:.1f} MiB), gpu_study.md, gpu_study.log")


class Tee:
    """This script's own lines (not the campaigns', which go to logs/) to a file as well; a
    closed terminal or pipe stops only the screen's copy, never the study."""

    def __init__(self, path: Path):
        self.file, self.stream = open(path, "a"), sys.stdout

    def write(self, text):
        self.file.write(text)
        if self.stream is not None:
            try:
                self.stream.write(text)
            except OSError:
                self.stream = None
        return len(text)

    def flush(self):
        self.file.flush()
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError:
                self.stream = None


# --------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m bench.gpu_study", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/gpu-study", help="a new campaign folder (default: %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="tiny models and batches on the CPU, in a minute or two")
    parser.add_argument("--deadline", type=float, default=480.0,
                        help="seconds from the start by which everything is written (default: %(default)s)")
    parser.add_argument("--python", default=None,
                        help="the interpreter of PyTorch's ranks (default: this one under "
                             "DLCOMPARE_NO_BOOTSTRAP=1, else the torch virtualenv)")
    parser.add_argument("--jax-python", default=None,
                        help="the interpreter of JAX's ranks (default: --python's, if it imports JAX)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma list, in this order: %(default)s")
    parser.add_argument("--wheels", default=str(DEFAULT_WHEELS),
                        help="wheels of the launcher's packages (default: %(default)s)")
    parser.add_argument("--export", default=None, help="also write the archive, tables and log here")
    parser.add_argument("--prepare", action="store_true",
                        help="download the wheels (online, before going to the GPU node) and stop")
    parser.add_argument("--wheel-python", default=GPU_PYTHON,
                        help="--prepare: the Python version of the node (default: %(default)s)")
    return parser


def framework_pythons(args, here: bool) -> dict[str, str]:
    """framework -> interpreter: PyTorch's (--python, this one, or its virtualenv) and JAX's
    (--jax-python, else PyTorch's when it imports JAX)."""
    torch = args.python or (sys.executable if here else str(ensure_environment("torch", log=log).python))
    pythons = {"torch": torch}
    if "jax" in FRAMEWORKS:
        pythons["jax"] = args.jax_python or torch
    return pythons


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.prepare:
        return prepare_wheels(Path(args.wheels), args.wheel_python)
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown or not sections:
        return fail(f"--sections: unknown {', '.join(unknown) or 'empty list'} (known: {', '.join(SECTIONS)})")
    if args.deadline <= RESERVE_S:
        return fail(f"--deadline must be above {RESERVE_S:.0f} s")
    here = os.environ.get("DLCOMPARE_NO_BOOTSTRAP") == "1"
    if not here:
        reexec_in_host_env("bench.gpu_study", argv)
    out = Path(args.out).resolve()
    if (out / "results.sqlite").exists():
        return fail(f"--out {out} already holds a campaign: the study writes a new one")
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_study.log"
    sys.stdout = Tee(log_path)
    absent = [name for name in REQUIRED_HERE if not present(name)]
    if absent:
        return fail(f"this interpreter lacks {', '.join(absent)}, which the launcher needs")
    pythons = supply_packages(framework_pythons(args, here), Path(args.wheels),
                              Path(os.environ.get("TMPDIR", "/tmp")) / "dlcompare-gpu-study-site")
    facts = inventory(pythons)
    for line in inventory_lines(facts):
        log(line)
    if "error" in facts["frameworks"]["torch"]:
        return fail(facts["frameworks"]["torch"]["error"])
    runnable = {name: python for name, python in pythons.items() if "error" not in facts["frameworks"][name]}
    study = Study(out=out, tiny=args.tiny, device="gpu" if facts["gpus"] and not args.tiny else "cpu",
                  pythons=runnable, deadline=started + args.deadline)
    log(f"device: {study.device}; deadline {args.deadline:.0f} s (the last {RESERVE_S:.0f} s for "
        f"the tables and the archive); each campaign needs at least {LEAST_S[study.device]:.0f} s "
        f"left to start:")
    for name in sections:
        log(f"  {name}: {len(SECTIONS[name])} campaign(s) ({', '.join(SECTIONS[name])})")
    try:
        for name in sections:
            study.run_section(name)
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
    if study.left() > 0:
        rebuild_report(study)
    table_path = write_tables(study, facts, started)
    log(table_path.read_text())
    if args.export:
        export(study, Path(args.export).resolve(), table_path, log_path)
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
