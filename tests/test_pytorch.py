"""The PyTorch-compute schemes' own variants through the real worker: DDP's buckets on AlexNet,
the measured overlap of DDP (hidden) and CNTK-style (not hidden) on loopback, and
Caffe-MPI-style's overlap on 2 emulated nodes joined by a shaped link.  What every scheme must
do (the same step, ranks equal to one process, learning, calibration) is in
tests/test_conformance.py."""

from __future__ import annotations

import os

import pytest

from adapters.registry import framework_info
from tests.conftest import assert_ranks_equal_one_process, check_run, overlap_run, run_cli


@pytest.fixture(scope="module")
def scheme_python(request):
    """Interpreter of each scheme's environment, built once per module."""
    from core.envs import ensure_environment

    cache = {}

    def python_for(framework: str) -> str:
        env = framework_info(framework).env
        if env not in cache:
            cache[env] = str(ensure_environment(env, log=print).python)
        return cache[env]

    return python_for


@pytest.mark.slow
def test_ddp_two_ranks_on_alexnet_equal_one_process(tmp_path, scheme_python):
    """AlexNet's fully-connected gradients fill DDP's buckets unlike GoogleNet's many small
    tensors (the conformance suite's model)."""
    python = scheme_python("torch")
    two = check_run(tmp_path, python, "torch", "alexnet-tiny", workers=2, batch=4)
    one = check_run(tmp_path, python, "torch", "alexnet-tiny", workers=1, batch=8)
    assert_ranks_equal_one_process(two, one, "alexnet-tiny")


@pytest.mark.slow
@pytest.mark.parametrize("framework,hides", [("cntk-style", False), ("torch", True)])
def test_overlap_of_communication_with_backward_is_measured(tmp_path, scheme_python, framework,
                                                            hides):
    """Full AlexNet at batch 4, 2 ranks: its fully-connected gradients (235 of 244 MB) are
    final early in backward, so a scheme that sends during backward can hide their all-reduce
    behind the convolutions' backward. CNTK-style all-reduces the whole gradient only after
    backward: its overlap must be near zero. DDP (buckets, gloo) must hide a clear part.

    Loopback communication is CPU work that backward wants too, and on a loaded 2-core
    machine single measurements scatter, so each claim must hold in one of at most three
    measurements (each printed); Caffe-MPI-style's is below, Horovod's in tests/test_horovod.py."""
    python = scheme_python(framework)
    overlaps = []
    for attempt in range(3):
        record = overlap_run(tmp_path / f"overlap{attempt}", python, framework)
        assert record["overlap"] is not None
        overlaps.append(record["overlap"])
        if (record["overlap"] > 0.2) if hides else (record["overlap"] < 0.1):
            break
    if hides:
        assert max(overlaps) > 0.2, overlaps
    else:
        assert min(overlaps) < 0.1, overlaps


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root")
def test_caffe_mpi_style_hides_its_allreduces_behind_backward_on_a_network_link(tmp_path):
    """GoogleNet at batch 16 on 2 emulated nodes joined by a 250 Mbit/s link (MPI over TCP, as
    Caffe-MPI ran between the study's nodes): the layer-wise all-reduces of the inception
    layers' gradients go on the wire while backward works through conv1-conv2, the longest
    part of GoogleNet's backward; the measured overlap must be clearly above zero in one of
    at most three measurements (each printed).

    The link is slow so that communication (1.2 s) stands out of backward's run-to-run noise
    (2.3-2.7 s): at 1 Gbit/s its 0.27 s was within that noise and two of three measurements
    read 0.00 (one 0.93); at 250 Mbit/s two runs read 0.77 and 0.91.

    Why not on loopback like the others: between 2 ranks of one 2-core machine MPI moves the
    bytes through shared memory, so the all-reduce is CPU copying and summing, work for the
    very cores backward keeps busy; nothing can hide (measured overlap 0.00 three times on a
    quiet machine: AlexNet batch 4, backward 0.26 s, communication 0.15 s, both together
    0.47-0.53 s). On a link the all-reduce mostly waits for the wire, as on a GPU it waits
    for the device, and waiting hides behind backward once MPI yields the cores while it
    waits (launchers/rendezvous/mpi.py)."""
    from analysis.store import ResultStore

    overlaps = []
    for attempt in range(3):
        out = tmp_path / f"link{attempt}"
        result = run_cli("launchers.compare", "--frameworks", "caffe-mpi-style", "--model", "googlenet",
                         "--batch-size", "16", "--nodes", "2", "--workers", "1", "--cluster", "emulated",
                         "--bandwidth", "250Mbit", "--iterations", "1", "--repeats", "1", "--warmup", "1",
                         "--profile-iterations", "5", "--no-dropout", "--out", str(out), timeout=1200)
        assert result.returncode == 0, result.stderr[-3000:]
        with ResultStore.for_campaign(out, create=False) as store:
            run = store.runs_frame().iloc[0]
        assert run["status"] == "ok", run["error"]
        print(f"caffe-mpi-style googlenet b16, 2 nodes, 250 Mbit/s ({out.name}): backward "
              f"{run['phase_backward_s']:.3f} s, communication after backward {run['phase_comm_s']:.3f} s, "
              f"backward with its overlapped communication {run['extra_profile_backward_comm']:.3f} s "
              f"-> overlap {run['overlap']:.2f}")
        overlaps.append(run["overlap"])
        if run["overlap"] > 0.2:
            break
    assert max(overlaps) > 0.2, overlaps
