"""Horovod (adapters/horovod.py) through the real worker: with 1 MB fusion buffers 2 ranks
started by horovodrun hold identical weights, equal to one process on the global batch; the
measured overlap of Horovod's fused all-reduce with backward is clearly above zero. Fast tests
cover the launch commands, the options and the environment's recipe.  Both modes' ranks, step,
learning and calibration are in tests/test_conformance.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapters.base import DistInfo, RunConfig
from adapters.registry import parse_framework_mode
from core.envs import REPO_ROOT
from launchers.rendezvous import processes_for
from tests.conftest import assert_ranks_equal_one_process, load, overlap_run
from tests.conftest import check_run as run_check


def config_for(mode: str, workers: int, **extra) -> RunConfig:
    return RunConfig(run_id="t", framework="horovod", mode=mode, model="googlenet-tiny",
                     batch_per_worker=4, workers_per_node=workers, **extra)


# ----------------------------------------------------------------------------- fast

def test_registry_knows_both_modes():
    info, mode = parse_framework_mode("horovod")
    assert (info.env, info.rendezvous, mode) == ("horovod", "horovod", "gloo")
    assert parse_framework_mode("horovod:mpi")[1] == "mpi"


def test_gloo_mode_is_started_by_the_envs_own_horovodrun_on_loopback():
    [spec] = processes_for("horovod", config_for("gloo", 2))
    assert spec.launcher[:3] == ["{python}", "-m", "horovod.runner.launch"]
    joined = " ".join(spec.launcher)
    assert "-np 2" in joined and "-H localhost:2" in joined and "--gloo" in joined
    assert "--network-interfaces lo" in joined
    assert "DLC_RANK" not in spec.env and spec.env["DLC_WORLD_SIZE"] == "2"


def test_mpi_mode_is_started_by_mpirun():
    import shutil

    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun on this machine")
    [spec] = processes_for("horovod", config_for("mpi", 2))
    assert Path(spec.launcher[0]).name == "mpirun" and spec.launcher[1:3] == ["-np", "2"]
    assert spec.env["HOROVOD_CONTROLLER"] == "mpi"


def test_ranks_come_from_horovodrun_when_the_launcher_sets_no_dlc_rank(monkeypatch):
    for name in ("DLC_RANK", "DLC_WORLD_SIZE", "DLC_LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    assert DistInfo.from_env() == DistInfo(rank=1, world_size=2, local_rank=1)


def test_environment_recipe_covers_the_build_step_and_the_compiler_wrapper():
    from core.envs import (apt_packages, build_requirements_file, build_variables,
                                requirements_dir, requirements_text)

    text = requirements_text("horovod")
    assert "torch==" in text and "horovod==0.28.1" in text  # -r torch.txt, then the build
    wrapper = requirements_dir() / "horovod-cxx17.sh"
    assert wrapper.read_text() in text  # editing the wrapper rebuilds the environment
    variables = build_variables(build_requirements_file("horovod").read_text())
    assert variables["CXX"] == str(wrapper)
    assert variables["HOROVOD_WITH_PYTORCH"] == variables["HOROVOD_WITH_GLOO"] == "1"
    assert variables["HOROVOD_WITH_MPI"] == "1"
    assert "libopenmpi-dev" in apt_packages(text)


def test_compiler_wrapper_turns_cxx14_into_cxx17(tmp_path):
    import os
    import subprocess

    fake = tmp_path / "fake-cxx"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    wrapper = REPO_ROOT / "envs" / "horovod-cxx17.sh"
    assert os.access(wrapper, os.X_OK), "the wrapper must be executable (CXX runs it directly)"
    out = subprocess.run([str(wrapper), "-O2", "-std=c++14", "a b.cc"], capture_output=True,
                         text=True, env={**os.environ, "DLCOMPARE_REAL_CXX": str(fake)},
                         check=True).stdout.splitlines()
    assert out == ["-O2", "-std=c++17", "a b.cc"]


# ----------------------------------------------------------------------------- slow: real runs

@pytest.fixture(scope="module")
def horovod_python() -> str:
    """The Horovod environment's interpreter; built (Horovod compiled, minutes) on first use."""
    from core.envs import ensure_environment

    return str(ensure_environment("horovod", log=print).python)


IN_ENVIRONMENT = """
import torch
from adapters.horovod import horovod_variables

# The options become Horovod's variables (set before hvd.init).
assert horovod_variables({}) == {}
assert horovod_variables({"fusion_mb": 4, "cycle_ms": 2.5}) == {
    "HOROVOD_FUSION_THRESHOLD": str(4 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5"}
assert horovod_variables({"fusion_mb": 0})["HOROVOD_FUSION_THRESHOLD"] == "0"
try:
    horovod_variables({"cycle_ms": -1})
    raise AssertionError("a negative cycle time was accepted")
except ValueError:
    pass

# The separated profile's backward relies on this: Horovod's hooks sit on the parameters'
# AccumulateGrad nodes (registered as DistributedOptimizer does), which torch.autograd.grad
# does not run, while tensor hooks (the layer profile's stamps) still fire.
parameter = torch.nn.Parameter(torch.randn(5))
fired = []
accumulator = parameter.expand_as(parameter).grad_fn.next_functions[0][0]
accumulator.register_hook(lambda *_: fired.append("accumulate"))
parameter.register_hook(lambda grad: fired.append("tensor"))
(parameter * parameter).sum().backward()
assert fired == ["tensor", "accumulate"], fired
(grad,) = torch.autograd.grad((parameter * parameter).sum(), [parameter])
assert fired == ["tensor", "accumulate", "tensor"], fired
assert torch.allclose(grad, 2 * parameter.detach())
print("ok")
"""


@pytest.mark.slow
def test_options_and_the_hook_free_backward_in_the_horovod_environment(horovod_python):
    import os
    import subprocess

    result = subprocess.run([horovod_python, "-c", IN_ENVIRONMENT], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def check_run(tmp: Path, python: str, mode: str, model: str, workers: int, batch: int,
              steps: int) -> Path:
    """The check-mode worker with several fusion buffers (1 MiB), not one."""
    return run_check(tmp, python, "horovod", model, mode=mode, workers=workers, batch=batch,
                     steps=steps, options={"fusion_mb": 1})


@pytest.mark.slow
def test_one_mb_fusion_buffers_two_ranks_equal_one_process(tmp_path, horovod_python):
    """Several fusion buffers per backward (fusion_mb 1; both modes with the default buffer:
    tests/test_conformance.py), and each rank's local gradients its own."""
    model, mode = "googlenet-tiny", "gloo"
    two = check_run(tmp_path, horovod_python, mode, model, workers=2, batch=4, steps=2)
    one = check_run(tmp_path, horovod_python, mode, model, workers=1, batch=8, steps=2)
    assert_ranks_equal_one_process(two, one, model)
    # The local gradients the check dumped are each rank's own (no collective leaked in), and
    # their mean is the single process's gradient on the global batch.
    g0, g1, g = (load(folder / f"grads_rank{r}.npz")
                 for folder, r in ((two, 0), (two, 1), (one, 0)))
    names = [name for name in g if name != "__loss__"]
    assert names and not all(np.array_equal(g0[name], g1[name]) for name in names)
    for name in names:
        np.testing.assert_allclose((g0[name] + g1[name]) / 2, g[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)


@pytest.mark.slow
def test_measured_overlap_of_fused_allreduce_with_backward(tmp_path, horovod_python):
    """Full AlexNet at batch 4, Horovod's defaults (128 MB fusion, 1 ms cycle): the
    fully-connected layers' gradients (235 of its 244 MB) are final in the first moments of
    backward, so their all-reduce can run behind the convolutions' backward, and the
    all-reduce is long enough against backward for the overlap to stand out of the timing
    noise. (GoogleNet's 27 MB all-reduce is a few percent of its backward on a CPU: its overlap
    fraction is then mostly noise.)

    Loopback communication is CPU work that backward wants too, so on 2 cores it cannot hide
    completely, and on a loaded machine single measurements scatter: measured on 2 cores at a
    load of 10-12 (other jobs), 0.16, 0.36, 0.48 and once 0.00. So the claim tested is that
    the overlap is clearly above zero in one of at most three measurements (each printed)."""
    from analysis.perfmodel import Scheme

    overlaps = []
    for attempt in range(3):
        record = overlap_run(tmp_path / f"overlap{attempt}", horovod_python, "horovod", "gloo")
        assert record["extra"]["backend"] == "horovod-gloo"
        scheme = Scheme.from_dict(record["extra"]["comm_scheme"])  # the model can read it
        assert scheme.overlap and scheme.merge == "cycle"
        assert scheme.bucket_bytes == 128 * 2 ** 20
        assert record["extra"]["layer_backward_source"] == "hooks"  # measured per layer
        assert record["overlap"] is not None
        overlaps.append(record["overlap"])
        if record["overlap"] > 0.1:
            break
    assert max(overlaps) > 0.1, overlaps
