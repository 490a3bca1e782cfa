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
one campaign folder (results.sqlite, the report), from which the study's tables
(`analysis.gpu_study_tables`) are written under `<out>/gpu_study/` (Markdown and CSV) and
`<out>/gpu_study.md` (all of them):

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
PyYAML, Jinja2) are unpacked from the wheels `--prepare` downloaded (`launchers.wheels`; `--wheels`,
default .gpu_wheels/, ignored by git; carry it along).  NumPy, pandas, matplotlib and seaborn
must be there already.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from adapters.registry import FRAMEWORKS, framework_info
from bench import run_command
from core.cli import OneLineParser, comma_list_type, fail
from core.envs import REPO_ROOT, ensure_environment, reexec_in_host_env
from launchers.interpreters import InterpreterError, probe_interpreter, versions_line
from launchers.wheels import (LAUNCHER_PACKAGES, REQUIRED_HERE, StagingError, installed_version,
                              prepare_wheels, present, supply_packages)
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


def inventory(pythons: dict[str, str]) -> dict:
    """What this run can tell before measuring: the interpreter, the GPUs, every framework
    interpreter's versions (or why it cannot run), the launcher's packages here."""
    facts = {"python": sys.version.split()[0], "executable": sys.executable,
             "cpu_count": os.cpu_count(), "gpus": gpu_inventory(), "frameworks": {},
             "packages": {name: installed_version(name) for name in
                          (*REQUIRED_HERE, *LAUNCHER_PACKAGES, "mpi4py")}}
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

def write_tables(study: Study, facts: dict, started: float) -> Path:
    """Every table as gpu_study/<name>.md and .csv, and all of them in gpu_study.md."""
    # the launcher's packages (pandas) are importable only once supply_packages ran
    import pandas as pd

    from analysis.gpu_study_tables import StudyRuns, StudyTables, measured_with, write_study_tables
    from analysis.rendering import to_markdown
    from analysis.store import ResultStore

    records, calibrations = [], []
    if (study.out / "results.sqlite").exists():
        with ResultStore.for_campaign(study.out, create=False) as store:
            records, calibrations = store.records(), store.calibrations()
    runs = StudyRuns(device=study.device, batches=study.batches, two_ranks=CONTENTION_MODEL[study.device],
                     run_ids=study.run_ids, statuses=study.statuses)
    versions = next((r["env"] for r in records if r["status"] == "ok" and r["framework"] == "torch"), {})
    device = next((r["device_name"] for r in records if r["status"] == "ok"), None) or "; ".join(facts["gpus"])
    parts = [f"# The study's single-GPU questions on {device or 'this machine'}\n",
             f"{time.strftime('%Y-%m-%d')}, {'tiny models on the CPU' if study.device == 'cpu' else 'one GPU'}; "
             f"{time.monotonic() - started:.0f} s in all." + measured_with(versions) + "\n",
             "## Inventory\n", *(f"- {line}" for line in inventory_lines(facts)), "",
             "## Sections\n", to_markdown(pd.DataFrame(
                 [{"section": name, **value} for name, value in study.sections.items()])
                 if study.sections else pd.DataFrame())]
    parts += write_study_tables(StudyTables(runs, records, calibrations), study.out / "gpu_study")
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
    parser.add_argument("--sections", type=comma_list_type, default=",".join(SECTIONS),
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
        try:
            prepare_wheels(Path(args.wheels), args.wheel_python, log)
        except StagingError as error:
            return fail(error, 1)
        return 0
    sections = args.sections
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown:
        return fail(f"--sections: unknown {', '.join(unknown)} (known: {', '.join(SECTIONS)})")
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
    try:
        pythons = supply_packages(framework_pythons(args, here), Path(args.wheels),
                                  Path(os.environ.get("TMPDIR", "/tmp")) / "dlcompare-gpu-study-site", log)
    except StagingError as error:
        return fail(error)
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
