"""The PyTorch-compute schemes through the real worker, 2 ranks on loopback: DDP over gloo,
CNTK-style (flat all-reduce after backward, gloo) and Caffe-MPI-style (layer-wise MPI
all-reduce from a communication thread, started by mpirun)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adapters.base import RunConfig
from adapters.registry import framework_info
from launchers.envs import REPO_ROOT
from launchers.local import run_local




@pytest.fixture(scope="module")
def scheme_python(request):
    """Interpreter of each scheme's environment, built once per module."""
    from launchers.envs import ensure_environment

    cache = {}

    def python_for(framework: str) -> str:
        env = framework_info(framework).env
        if env not in cache:
            cache[env] = str(ensure_environment(env, log=print).python)
        return cache[env]

    return python_for


def check_run(tmp: Path, python: str, model: str, workers: int, batch: int, steps: int,
              framework: str = "torch") -> Path:
    """Run the worker in equivalence mode; returns the folder of its .npz dumps."""
    info = framework_info(framework)
    out = tmp / f"{framework}-{model}-w{workers}"
    config = RunConfig(run_id=out.name, framework=framework, mode=info.modes[0], model=model,
                       batch_per_worker=batch, workers_per_node=workers, dropout=False,
                       rank_dir=str(out), check={"steps": steps, "out_dir": str(out)})
    outcome = run_local(config, python, out, info.rendezvous, REPO_ROOT, timeout=300)
    assert outcome.status == "ok", outcome.error
    return out


def load(path: Path) -> dict:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


@pytest.mark.slow
@pytest.mark.parametrize("framework,model", [
    ("torch", "alexnet-tiny"), ("torch", "googlenet-tiny"),
    ("cntk-style", "googlenet-tiny"), ("caffe-mpi-style", "googlenet-tiny")])
def test_two_ranks_equal_one_process_on_the_global_batch(tmp_path, scheme_python, framework,
                                                         model):
    python = scheme_python(framework)
    two = check_run(tmp_path, python, model, workers=2, batch=4, steps=1, framework=framework)
    one = check_run(tmp_path, python, model, workers=1, batch=8, steps=1, framework=framework)
    rank0, rank1 = load(two / "weights_rank0.npz"), load(two / "weights_rank1.npz")
    single = load(one / "weights_rank0.npz")
    assert rank0.keys() == single.keys()
    worst = 0.0
    for name in single:
        assert np.array_equal(rank0[name], rank1[name]), f"ranks differ in {name}"
        np.testing.assert_allclose(rank0[name], single[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
        worst = max(worst, float(np.max(np.abs(rank0[name] - single[name]))))
    # The step really moved the weights (a no-op step would also be "equal").
    from models import canonical_weights, get_model

    initial = canonical_weights(get_model(model))
    moved = max(float(np.max(np.abs(single[n] - initial[n]))) for n in single)
    print(f"{framework} {model}: max |2-rank - 1-process| = {worst:.2e}, max step change = {moved:.2e}")
    assert moved > 100 * max(worst, 1e-9)


@pytest.mark.slow
def test_a_few_steps_reduce_the_loss(tmp_path, torch_python):
    out = check_run(tmp_path, torch_python, "resnet50-tiny", workers=1, batch=16, steps=8)
    losses = json.loads((out / "loss_rank0.json").read_text())
    print(losses)
    assert losses["after"] < 0.9 * losses["before"]
