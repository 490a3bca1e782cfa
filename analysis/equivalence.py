"""Cross-framework equivalence of one step: the numbers `launchers.check` compares.

Every framework's worker, in check mode, dumps its loss, its local gradients and its weights
after one SGD step from the same canonical weights and batch. Two dumps agree when
  - the loss, by relative difference |a - b| / max(|a|, |b|), is within LOSS_TOLERANCE;
  - each parameter's gradient, by relative L2 error ||a - b|| / max(||a||, ||b||), and
  - each parameter's and BN statistic's change over the one step, the same way (the
    optimizer's and batch norm's update conventions, not only the gradients)
are within the model's tolerance.

Tolerances (relative, float32 on CPU), measured rather than guessed: the model catalogue's
(`models.ModelFacts.tolerance`, the table below says how they were measured). The loss
agrees to ~1e-6 on every model, so its limit is tight and catches forward-convention mistakes
(an LRN alpha not divided by size, a pooling window off by one, a transposed weight). Gradient
agreement is model-dependent, because two correct float32 implementations differ by more than
rounding where a tiny difference flips a ReLU or max-pool decision (a kink): in full AlexNet
at batch 2 a single conv5 pre-activation within 1e-6 of zero changes sign between PyTorch and
TensorFlow and moves conv1..conv5 gradients by ~1e-2; batch norm over 2 samples amplifies
rounding through ResNet-50 (PyTorch float32 against PyTorch float64 alone differs by 1.7e-2).
Each limit is ~4-10x the worst cross-framework error measured at batch 2, seed 0, and above
the float32-vs-float64 error of PyTorch itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models import model_facts

# Measured at batch 2, seed 0 (torch vs tf; "f64": PyTorch float32 against float64, the float32
# noise floor). Worst gradient tensor:     torch vs tf   torch f32 vs f64
#   alexnet-tiny                           1.4e-06       -
#   googlenet-tiny                         9.5e-06       -
#   resnet50-tiny (BN over 2 samples)      5.6e-04       4.3e-04
#   alexnet (one ReLU kink flips, conv5)   1.2e-02       2.4e-03
#   googlenet                              3.4e-04       2.7e-04
#   resnet50 (BN over 2 samples)           2.5e-02       1.7e-02
# Loss: at most 1.9e-05 (resnet50-tiny), otherwise <= 1e-6.
LOSS_TOLERANCE = 1e-4


def tolerance(model: str) -> float:
    """The model's gradient tolerance (the model catalogue's)."""
    return model_facts(model).tolerance
TINY = 1e-30


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return float(np.linalg.norm(a - b)) / scale if scale > TINY else 0.0


def load_npz(path: Path) -> dict:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def compare_pair(name_a, a: Path, name_b, b: Path, initial: dict, tolerance: float,
                 verbose: bool) -> bool:
    grads_a, grads_b = load_npz(a / "grads_rank0.npz"), load_npz(b / "grads_rank0.npz")
    loss_a, loss_b = float(grads_a.pop("__loss__")), float(grads_b.pop("__loss__"))
    weights_a, weights_b = load_npz(a / "weights_rank0.npz"), load_npz(b / "weights_rank0.npz")
    print(f"\n{name_a} vs {name_b}")
    loss_diff = abs(loss_a - loss_b) / max(abs(loss_a), abs(loss_b), TINY)
    loss_limit = min(LOSS_TOLERANCE, tolerance)
    ok = loss_diff <= loss_limit
    print(f"  loss  {name_a} {loss_a:.7f}  {name_b} {loss_b:.7f}  rel diff {loss_diff:.2e} "
          f"(limit {loss_limit:.0e})  {'ok' if ok else 'FAIL'}")
    if set(grads_a) != set(grads_b) or set(weights_a) != set(weights_b):
        only = sorted(set(grads_a) ^ set(grads_b)) + sorted(set(weights_a) ^ set(weights_b))
        print(f"  tensors differ between the two: {only[:6]}  FAIL")
        return False
    for title, rows in (
            ("gradient", {n: relative_error(grads_a[n], grads_b[n]) for n in initial
                          if n in grads_a}),
            ("one-step update", {n: relative_error(weights_a[n] - initial[n],
                                                   weights_b[n] - initial[n])
                                 for n in initial})):
        worst = sorted(rows.items(), key=lambda item: -item[1])
        shown = [(n, rows[n]) for n in rows] if verbose else worst[:5]
        name, value = worst[0]
        passed = value <= tolerance
        ok &= passed
        print(f"  {title} relative L2 error, max over {len(rows)} tensors: {value:.2e} "
              f"({name})  {'ok' if passed else 'FAIL'}")
        for tensor, error in shown:
            print(f"      {tensor:<40s} {error:.2e}{'  FAIL' if error > tolerance else ''}")
    return ok


# Batch-norm statistics each rank keeps from its own batches (DDP sends rank 0's at each
# forward, so the last step's update stays local; FSDP sends none): not a trained weight
RANK_LOCAL_SUFFIXES = (".running_mean", ".running_var")


def ranks_agree(name, folder: Path, ranks: int) -> bool:
    """Every rank of a synchronous run ends with the same weights (bit for bit): what any
    scheme, compressing or not, must keep.  Batch-norm running statistics are each rank's
    own (`RANK_LOCAL_SUFFIXES`) and not compared."""
    weights = [load_npz(folder / f"weights_rank{r}.npz") for r in range(ranks)]
    differ = sorted(n for n in weights[0] for other in weights[1:]
                    if not n.endswith(RANK_LOCAL_SUFFIXES) and not np.array_equal(weights[0][n], other[n]))
    print(f"  {name}: the {ranks} ranks' weights " + (f"differ in {differ[:3]}  FAIL" if differ else "are identical  ok"))
    return not differ


def loss_after(folder: Path) -> float:
    """Rank 0's loss on its first batch after the run's steps (the worker's loss_rank0.json)."""
    return float(json.loads((folder / "loss_rank0.json").read_text())["after"])


def loss_cost(name, folder: Path, reference, reference_folder: Path, steps: int) -> float:
    """What a compressing scheme costs the loss: its loss after `steps` steps on the same data
    from the same weights against the uncompressed `reference`'s, in % (positive: worse)."""
    mine, theirs = loss_after(folder), loss_after(reference_folder)
    change = 100.0 * (mine - theirs) / max(abs(theirs), TINY)
    print(f"  {name}: loss after {steps} steps {mine:.5f} against {theirs:.5f} for {reference} "
          f"({change:+.2f} %): what its compression costs")
    return change
