"""The JAX adapter's own variants, in its environment (envs/jax.txt): both activation layouts
give the same numbers, and a 2-process record has its phases and its scheme.  What every
framework must do (the same step as the others, two processes equal to one on the global batch,
learning, a calibration through its own pmean) is in tests/test_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import check_run, load, overlap_run


@pytest.fixture(scope="session")
def jax_python() -> str:
    """The JAX environment's interpreter, built from envs/jax.txt on first use."""
    from core.envs import ensure_environment

    return str(ensure_environment("jax", log=print).python)


@pytest.mark.slow
def test_channels_last_gives_the_same_numbers(tmp_path, jax_python):
    """NHWC activations (options channels_last) against the canonical NCHW: the same loss and
    gradients on the same batch, to float32 rounding."""
    nchw = check_run(tmp_path / "nchw", jax_python, "jax", "googlenet-tiny", batch=2)
    nhwc = check_run(tmp_path / "nhwc", jax_python, "jax", "googlenet-tiny", batch=2,
                     options={"channels_last": True})
    a, b = load(nchw / "grads_rank0.npz"), load(nhwc / "grads_rank0.npz")
    assert a.keys() == b.keys() and len(a) > 100
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=2e-4, atol=2e-6, err_msg=name)


@pytest.mark.slow
def test_two_rank_record_has_phases_and_its_scheme(tmp_path, jax_python):
    """A 2-process run's record: every phase measured, the pmean declared after backward, and
    an overlap measured.  Its value is no test of the scheme: the separate backward and pmean
    functions pay packing and a dispatch each that the fused step does not, and on the 2-core
    VM that difference can read as full overlap (1.00 in two runs in a row, 2026-12-08)."""
    record = overlap_run(tmp_path / "overlap", jax_python, "jax", model="alexnet-tiny", batch=8)
    phases = {p["phase"]: p["measured_s"] for p in record["phases"]}
    assert set(phases) >= {"io", "h2d", "forward", "backward", "comm", "update"}
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["comm"] > 0
    scheme = record["extra"]["comm_scheme"]
    assert scheme["overlap"] is False and scheme["transport"] == "gloo"
    assert scheme["granularity"] == "whole"
    assert record["overlap"] is not None and 0.0 <= record["overlap"] <= 1.0
