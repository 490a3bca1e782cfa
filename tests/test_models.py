"""models/: parameter counts, shapes, FLOPs, canonical weights, CLI, and a PyTorch cross-check.

The reference parameter totals are the published Caffe numbers; GoogleNet's 6,998,552 was also
recomputed by hand per module (stem 124,416; 3a 163,696; 3b 388,736; 4a 376,176; 4b 449,160;
4c 510,104; 4d 605,376; 4e 868,352; 5a 1,043,456; 5b 1,444,080; classifier 1,025,000).
"""

import collections
import json
import math
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from models import (
    LRN, MODEL_NAMES, Concat, Conv2d, Dropout, Flatten, Linear, ModelSpec, Pool2d,
    Residual, Sequential, canonical_weights, get_model, load_npz, save_npz,
)
from models.spec import pool_output_size
from models.weights import check_weights
from tests.conftest import REPO_ROOT

REPO = Path(__file__).resolve().parents[1]
FULL = ("alexnet", "googlenet", "resnet50")
TINY = ("alexnet-tiny", "googlenet-tiny", "resnet50-tiny")


# --------------------------------------------------------------------------- registry, counts


def test_registry_names():
    assert MODEL_NAMES == FULL + TINY
    for name in MODEL_NAMES:
        assert get_model(name).name == name


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError, match="known: alexnet, googlenet"):
        get_model("vgg16")


@pytest.mark.parametrize("name, params", [
    ("alexnet", 60_965_224),
    ("googlenet", 6_998_552),
    ("resnet50", 25_557_032),
])
def test_published_parameter_totals(name, params):
    assert get_model(name).total_params == params


def test_googlenet_module_params_by_hand():
    """Per-module counts computed by hand (weights + biases) add up to the pinned total."""
    spec = get_model("googlenet")
    per_module = collections.Counter()
    for row in spec.layer_table():
        key = row.name.split("_")[1] if row.name.startswith("inception_") else "other"
        per_module[key] += row.params
    assert per_module["3a"] == 192 * 64 + 64 + 192 * 96 + 96 + 96 * 9 * 128 + 128 \
        + 192 * 16 + 16 + 16 * 25 * 32 + 32 + 192 * 32 + 32
    assert per_module["5b"] == 1_444_080
    assert per_module["other"] == 124_416 + 1_025_000


def test_googlenet_aux_heads_not_represented():
    from models.zoo import googlenet
    with pytest.raises(NotImplementedError, match="auxiliary"):
        googlenet(aux=True)


def _topology(spec):
    """Everything but widths: leaf names, kinds, kernels, strides, pads, groups, biases."""
    out = []
    for layer in spec.walk():
        fields = dict(vars(layer))
        for width in ("out_channels", "out_features"):
            fields.pop(width, None)
        out.append((type(layer).__name__, tuple(sorted(fields.items()))))
    return out


@pytest.mark.parametrize("full", FULL)
def test_tiny_variant_has_same_topology(full):
    big, tiny = get_model(full), get_model(full + "-tiny")
    kinds = lambda s: collections.Counter(type(layer).__name__ for layer in s.walk())
    assert kinds(big) == kinds(tiny)
    assert _topology(big) == _topology(tiny)
    assert tiny.num_classes == 10 and tiny.total_params < big.total_params / 50


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name, node, shape", [
    ("alexnet", "conv1", (96, 55, 55)),
    ("alexnet", "pool1", (96, 27, 27)),
    ("alexnet", "pool5", (256, 6, 6)),
    ("alexnet", "flatten", (9216,)),
    ("googlenet", "pool1_3x3_s2", (64, 56, 56)),  # ceil mode: floor would give 55
    ("googlenet", "inception_3a_output", (256, 28, 28)),
    ("googlenet", "inception_4e_output", (832, 14, 14)),
    ("googlenet", "inception_5b_output", (1024, 7, 7)),
    ("resnet50", "pool1", (64, 56, 56)),
    ("resnet50", "res2c", (256, 56, 56)),
    ("resnet50", "res3a_branch2a", (128, 28, 28)),  # the stride sits on the first 1x1
    ("resnet50", "res5c", (2048, 7, 7)),
    ("resnet50", "fc1000", (1000,)),
])
def test_reference_shapes(name, node, shape):
    assert get_model(name).output_shapes()[node] == shape


def test_output_shape_of_a_node():
    spec = get_model("googlenet")
    assert spec.output_shape(spec.node("inception_3a_output"), (192, 28, 28)) == (256, 28, 28)


@pytest.mark.parametrize("kernel, stride, pad", [(3, 2, 0), (3, 2, 1), (2, 2, 1), (5, 3, 2),
                                                 (3, 1, 1)])
def test_caffe_pool_rule(kernel, stride, pad):
    """Caffe's pooling_layer.cpp, written out independently (float ceil, then the pad fix)."""
    for size in range(max(1, kernel - 2 * pad), 40):
        out = int(math.ceil(float(size + 2 * pad - kernel) / stride)) + 1
        if pad and (out - 1) * stride >= size + pad:
            out -= 1
        assert pool_output_size(size, kernel, stride, pad) == out, size


def test_walk_order_and_leaves():
    spec = get_model("resnet50")
    names = [layer.name for layer in spec.walk()]
    assert names[:4] == ["conv1", "bn_conv1", "conv1_relu", "pool1"]
    # body then shortcut, then the ReLU after the add
    i = names.index("res2a_branch2a")
    assert names[i:i + 11] == [
        "res2a_branch2a", "bn2a_branch2a", "res2a_branch2a_relu", "res2a_branch2b",
        "bn2a_branch2b", "res2a_branch2b_relu", "res2a_branch2c", "bn2a_branch2c",
        "res2a_branch1", "bn2a_branch1", "res2a_relu"]
    assert names[-1] == "fc1000"
    g = [layer.name for layer in get_model("googlenet").walk()]
    order = ["inception_3a_1x1", "inception_3a_3x3_reduce", "inception_3a_5x5",
             "inception_3a_pool_proj", "inception_3b_1x1"]
    assert [g.index(n) for n in order] == sorted(g.index(n) for n in order)


# --------------------------------------------------------------------------- FLOPs, gradients


def test_conv_flops_by_hand():
    rows = {r.name: r for r in get_model("alexnet").layer_table()}
    # conv1: 2 * 3*11*11 * 96 * 55*55 + 96*55*55 bias adds
    assert rows["conv1"].flops == 2 * 363 * 96 * 3025 + 96 * 3025 == 211_120_800
    # conv2 in two groups: each output sees 96/2 input channels
    assert rows["conv2"].flops == 2 * 48 * 25 * 256 * 729 + 256 * 729 == 448_084_224
    assert rows["fc6"].flops == 2 * 9216 * 4096 + 4096
    assert rows["relu1"].flops == 96 * 3025
    assert rows["norm1"].flops == 96 * 3025 * (5 + 4)
    assert rows["pool1"].flops == 96 * 27 * 27 * 9


@pytest.mark.parametrize("name, gflops", [("alexnet", 1.45), ("googlenet", 3.2),
                                          ("resnet50", 7.7)])
def test_total_flops(name, gflops):
    spec = get_model(name)
    table = spec.layer_table()
    assert spec.total_flops == sum(r.flops for r in table)
    assert spec.total_flops == pytest.approx(gflops * 1e9, rel=0.02)
    # multiply-adds of convs and FCs: weight size x output positions (papers quote GMACs)
    weights = spec.parameter_shapes()
    macs = sum(math.prod(weights[r.name + ".weight"]) * math.prod(r.output_shape[1:])
               for r in table if r.kind in ("Conv2d", "Linear"))
    assert macs / 1e9 == pytest.approx(gflops / 2, rel=0.03)


def test_layer_table_rows_and_gradients():
    spec = get_model("resnet50")
    table = spec.layer_table()
    leaves = [layer.name for layer in spec.walk()]
    assert [r.name for r in table if r.kind not in ("Residual", "Concat")] == leaves
    add = next(r for r in table if r.name == "res2a")
    assert add.kind == "Residual" and add.flops == 256 * 56 * 56 and add.params == 0
    assert all(r.grad_bytes == 4 * r.params for r in table)
    grads = spec.gradient_sizes_backward()
    assert grads[0] == ("fc1000", 4 * (2048 * 1000 + 1000))
    assert grads[-1] == ("conv1", 4 * 64 * 3 * 49)
    assert sum(b for _, b in grads) == 4 * spec.total_params
    assert all(b > 0 for _, b in grads)


def test_parameter_and_buffer_shapes():
    a = get_model("alexnet").parameter_shapes()
    assert list(a)[:4] == ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    assert a["conv2.weight"] == (256, 48, 5, 5)  # OIHW with in/groups
    assert a["fc6.weight"] == (4096, 9216)
    r = get_model("resnet50")
    assert "conv1.bias" not in r.parameter_shapes()
    assert r.parameter_shapes()["bn_conv1.weight"] == (64,)
    assert r.buffer_shapes()["bn5c_branch2c.running_var"] == (2048,)
    assert len(r.buffer_shapes()) == 2 * 53
    assert get_model("alexnet").buffer_shapes() == {}


# --------------------------------------------------------------------------- bad specs


def _spec(*layers, shape=(3, 8, 8), classes=10):
    return ModelSpec("bad", shape, classes, Sequential("root", tuple(layers)))


@pytest.mark.parametrize("build, message", [
    (lambda: _spec(Conv2d("c", 4, 11), Flatten("f"), Linear("l", 10)), "kernel 11 exceeds"),
    (lambda: _spec(Pool2d("p", "max", 3, 2), Pool2d("q", "max", 3, 2), Pool2d("r", "max", 3, 2),
                   Flatten("f"), Linear("l", 10)), "r: kernel 3 exceeds input 2x2"),
    (lambda: _spec(Linear("l", 10)), "flat input"),
    (lambda: _spec(Conv2d("c", 4, 3, groups=2)), "not divisible by groups"),
    (lambda: _spec(Flatten("f"), Linear("l", 5)), r"expected \(10,\)"),
    (lambda: _spec(Flatten("f"), Linear("f", 10)), "used twice"),
    (lambda: _spec(Concat("c", (Sequential("a", (Conv2d("x", 2, 3),)),
                                Sequential("b", (Conv2d("y", 2, 1),))))), "disagree"),
    (lambda: _spec(Residual("r", Sequential("b", (Conv2d("x", 4, 1),)))), "shortcut gives"),
    (lambda: Conv2d("conv1/7x7", 4, 3), "must match"),
    (lambda: Conv2d("c", 0, 3), "out_channels"),
    (lambda: Pool2d("p", "min", 3), "'max' or 'avg'"),
    (lambda: Dropout("d", 1.0), "dropout p"),
    (lambda: LRN("n", 4), "odd"),
    (lambda: _spec(Flatten("f"), Linear("l", 10), shape=(3, 0, 8)), "positive ints"),
])
def test_bad_specs_raise_value_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_output_shape_rejects_impossible_input():
    spec = get_model("alexnet")
    with pytest.raises(ValueError, match="conv1: kernel 11 exceeds input 8x8"):
        spec.output_shape(spec.root, (3, 8, 8))


# --------------------------------------------------------------------------- weights


def test_canonical_weights_deterministic_and_shaped():
    spec = get_model("resnet50-tiny")
    w1, w2 = canonical_weights(spec), canonical_weights(spec, seed=0)
    expected = {**spec.parameter_shapes(), **spec.buffer_shapes()}
    assert list(w1) == list(expected)
    check_weights(spec, w1)
    for name, shape in expected.items():
        assert w1[name].shape == shape and w1[name].dtype == np.float32
        assert w1[name].flags.c_contiguous
        np.testing.assert_array_equal(w1[name], w2[name])
    assert np.all(w1["bn_conv1.weight"] == 1) and np.all(w1["bn_conv1.bias"] == 0)
    assert np.all(w1["bn_conv1.running_mean"] == 0) and np.all(w1["bn_conv1.running_var"] == 1)
    assert np.all(w1["fc1000.bias"] == 0)
    w3 = canonical_weights(spec, seed=1)
    assert not np.array_equal(w1["conv1.weight"], w3["conv1.weight"])


def test_canonical_weights_independent_of_order():
    """A tensor depends only on (seed, its name, its shape), not on the other tensors."""
    w = canonical_weights(get_model("alexnet-tiny"), seed=3)["conv2.weight"]
    rng = np.random.default_rng([3, zlib.crc32(b"conv2.weight")])
    ref = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(math.sqrt(2 / (6 * 25)))
    np.testing.assert_array_equal(w, ref)


def test_he_normal_scale():
    w = canonical_weights(get_model("googlenet"))
    fc = w["loss3_classifier.weight"]
    assert fc.std() == pytest.approx(math.sqrt(2 / 1024), rel=0.01)
    assert abs(fc.mean()) < 1e-3


def test_npz_round_trip(tmp_path):
    w = canonical_weights(get_model("googlenet-tiny"))
    save_npz(tmp_path / "w.npz", w)
    back = load_npz(tmp_path / "w.npz")
    assert list(back) == list(w)
    for name in w:
        np.testing.assert_array_equal(back[name], w[name])
        assert back[name].dtype == np.float32


def test_models_imports_no_framework():
    code = ("import sys, models, models.__main__; "
            "bad = {'torch', 'tensorflow', 'mxnet', 'cntk'} & set(sys.modules); "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# --------------------------------------------------------------------------- CLI


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "models", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_cli_summary_json():
    out = _cli("summary", "alexnet", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["model"] == "alexnet" and data["params"] == 60_965_224
    assert data["input_shape"] == [3, 227, 227] and data["num_classes"] == 1000
    assert data["flops"] == sum(layer["flops"] for layer in data["layers"])
    assert data["layers"][0]["name"] == "conv1"
    assert data["layers"][0]["output_shape"] == [96, 55, 55]


def test_cli_summary_table_and_list():
    out = _cli("summary", "resnet50-tiny")
    assert out.returncode == 0 and "res5c_branch2c" in out.stdout
    assert f"{get_model('resnet50-tiny').total_params:,}" in out.stdout.splitlines()[-1]
    listed = _cli("list")
    assert listed.stdout.split() == list(MODEL_NAMES)


def test_cli_unknown_model():
    out = _cli("summary", "vgg16")
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "vgg16" in out.stderr


# --------------------------------------------------------------------------- PyTorch cross-check


@pytest.mark.parametrize("check,name", [("parameter_count", name) for name in MODEL_NAMES]
                         + [("tiny_forward_backward", name) for name in TINY])
def test_plain_torch_build_agrees_with_the_description(torch_python, check, name):
    """tests/torch_reference.py builds each net from plain torch.nn modules, independently of
    adapters/pytorch.py, and checks it against models/ inside the PyTorch environment (the
    launcher's environment has no torch)."""
    result = subprocess.run([torch_python, "-m", "tests.torch_reference", check, name],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin",
                                 "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok"), result.stdout
