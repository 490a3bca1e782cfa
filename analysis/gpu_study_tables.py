"""The GPU study's tables (`bench.gpu_study`): one GPU's phases per model, host-to-device
copies, two ranks on one device (contention, overlap), cuDNN autotuning x layout, precision,
from the study campaign's records and calibrations.

Each variant of the study (a campaign with its own flags) is found by its label in
`StudyRuns`; a row whose variant did not run, failed or was skipped says so in ``status``.
docs/gpu.md says what each table answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.rendering import to_markdown
from core.schemes import FRAMEWORKS, framework_facts
from models import get_model


def phase_ms(record: dict, phase: str) -> float | None:
    for entry in record.get("phases") or []:
        if entry["phase"] == phase and entry.get("measured_s") is not None:
            return entry["measured_s"] * 1e3
    return None


def rounded(value, digits: int = 2):
    return None if value is None else round(float(value), digits)


@dataclass
class StudyRuns:
    """What the study's campaigns ran: per variant label (``baseline``, ``tf32``, ``two-ranks``,
    ``calibration`` ...) the runs it stored and what happened to it, on which device, at which
    batch per model, and the model and batch of the 2-rank runs."""

    device: str
    batches: dict[str, int]
    two_ranks: tuple[str, int]
    run_ids: dict[str, list[str]] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)


class StudyTables:
    """The study's tables from the campaign's records, each run found by the variant that
    made it (`StudyRuns.run_ids`), each row saying why it is empty where it is."""

    def __init__(self, study: StudyRuns, records: list[dict], calibrations: list[dict]):
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
                row = {"framework": framework_facts(framework).label if framework in FRAMEWORKS else framework,
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
        model, batch = self.study.two_ranks
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


def write_study_tables(tables: StudyTables, folder: Path) -> list[str]:
    """Every table as ``<folder>/<name>.md`` and ``.csv``; returns their Markdown sections
    (title, what it answers, the table) for a summary of them all."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for name, (title, description) in TABLES.items():
        frame = pd.DataFrame(getattr(tables, name)())
        frame.to_csv(folder / f"{name}.csv", index=False)
        text = f"## {title}\n\n{description}\n\n{to_markdown(frame)}"
        (folder / f"{name}.md").write_text(f"#{text}")
        parts.append(text)
    return parts
