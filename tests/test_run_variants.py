"""What a campaign may vary beyond the topology (the GPU study's knobs): a batch per model,
--dtype, --option KEY=VALUE; each a run identity of its own, each refused in one line when it
makes no sense, and an adapter without a precision reports its runs unavailable."""

from __future__ import annotations

import json
import sqlite3

import pytest

from launchers import plan as planning
from launchers.campaign import campaign_from_args
from launchers.compare import build_parser
from tests.conftest import run_cli


def runs_of(*arguments: str):
    args = build_parser().parse_args(["--frameworks", "torch", "--workers", "1", "--launches", "1", *arguments])
    return planning.expand(campaign_from_args(args))


def test_a_batch_per_model_and_a_default_for_the_others():
    runs = runs_of("--model", "alexnet-tiny,googlenet-tiny,resnet50-tiny",
                   "--batch-size", "alexnet-tiny=4,googlenet-tiny=2,googlenet-tiny=8")
    assert [(r.model, r.batch_per_worker) for r in runs] == [
        ("alexnet-tiny", 4), ("googlenet-tiny", 2), ("googlenet-tiny", 8),
        ("resnet50-tiny", planning.default_batch("resnet50-tiny", "cpu"))]
    assert [r.batch_per_worker for r in runs_of("--model", "alexnet-tiny,googlenet-tiny",
                                                "--batch-size", "2,4")] == [2, 4, 2, 4]


@pytest.mark.parametrize("text, needle", [
    ("alexnet-tiny=4,8", "mixes a plain '8' with MODEL=N"),
    ("resnet50=32", "names 'resnet50', which --model does not run"),
    ("alexnet-tiny=0", "--batch-size alexnet-tiny must be at least 1"),
])
def test_bad_batch_sizes(text, needle):
    with pytest.raises(planning.UsageError, match=needle):
        planning.parse_batch_sizes(text, ["alexnet-tiny"])


def test_options_and_dtype_are_the_runs_identity():
    plain, = runs_of("--model", "alexnet-tiny")
    varied, = runs_of("--model", "alexnet-tiny", "--dtype", "bfloat16", "--option",
                      "cudnn_benchmark=false,bucket_mb=2.5", "--option", "ps_strategy=greedy")
    assert plain.dtype == "float32" and varied.dtype == "bfloat16"
    assert plain.options == {"channels_last": False}
    assert varied.options == {"channels_last": False, "cudnn_benchmark": False, "bucket_mb": 2.5,
                              "ps_strategy": "greedy"}
    assert varied.config_hash != plain.config_hash and varied.run_id != plain.run_id


@pytest.mark.parametrize("items, needle", [
    (["cudnn_bench=false"], "unknown key 'cudnn_bench'"),
    (["channels_last=true"], "the layout is --channels-last"),
    (["pinned"], "takes KEY=VALUE"),
])
def test_bad_options(items, needle):
    with pytest.raises(planning.UsageError, match=needle):
        planning.parse_options(items)


def test_bad_dtype():
    with pytest.raises(planning.UsageError, match="'float16' is not one of float32, tf32, bfloat16"):
        planning.parse_dtype("float16")


@pytest.mark.slow
def test_a_precision_the_device_or_adapter_lacks_is_unavailable_not_renamed(tmp_path):
    """TF32 on a CPU (PyTorch) and bfloat16 in JAX's adapter: each run is stored as
    unavailable with the reason, and the campaign still succeeds (exit 0)."""
    out = tmp_path / "campaign"
    for dtype, framework in (("tf32", "torch"), ("bfloat16", "jax")):
        result = run_cli("launchers.compare", "--frameworks", framework, "--model", "alexnet-tiny",
                         "--workers", "1", "--batch-size", "2", "--dtype", dtype, "--out", str(out),
                         timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    with sqlite3.connect(out / "results.sqlite") as db:
        stored = {row[0]: row[1:] for row in db.execute(
            "SELECT framework, dtype, status, error, extra_json FROM runs")}
    assert stored["torch"][:2] == ("tf32", "failed") and "tf32 is a GPU's tensor-core math" in stored["torch"][2]
    assert stored["jax"][:2] == ("bfloat16", "failed") and "jax runs float32, not bfloat16" in stored["jax"][2]
    assert all(json.loads(row[3])["unavailable"] for row in stored.values())
