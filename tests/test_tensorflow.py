"""The TensorFlow adapter's own parts: TF1 parameter servers over two servers on loopback, the
model's geometry, NHWC and tf.data, the profile's scaling, the environment's pins, a dying
server.  What every mode must do (MultiWorkerMirroredStrategy and one parameter server: the same
step as the others, two workers equal to one, learning, a calibration through the mode's own
exchange) is in tests/test_conformance.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from core.envs import REPO_ROOT
from tests.conftest import (assert_ranks_equal_one_process, check_run, cli_command,
                            worker_processes)

MODEL = "alexnet-tiny"  # groups, LRN and a 2x2 flatten (the NHWC row permutation) in one net


@pytest.mark.slow
def test_two_parameter_servers_two_workers_equal_one_process(tmp_path, tf_python):
    """The variables spread over two servers (one server: tests/test_conformance.py)."""
    two = check_run(tmp_path, tf_python, "tf", MODEL, mode="ps", workers=2, batch=4, servers=2)
    one = check_run(tmp_path, tf_python, "tf", MODEL, mode="collective", batch=8)
    assert_ranks_equal_one_process(two, one, MODEL)


def tf_snippet(python: str, code: str, timeout: float = 600) -> dict:
    """Run `code` in the TensorFlow environment; it prints one JSON object last."""
    result = subprocess.run([python, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=timeout,
                            env={"PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
                                 "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


GEOMETRY = r"""
import json
import numpy as np
import tensorflow as tf
from adapters.tensorflow.model import TFModel
from models import MODEL_NAMES, canonical_weights, get_model

out = {}
for name in MODEL_NAMES:
    spec = get_model(name)
    model = TFModel(spec, "NHWC", dropout=True)
    params = {n: tf.Variable(tf.zeros(s)) for n, s in model.param_shapes.items()}
    buffers = {n: tf.Variable(tf.zeros(s)) for n, s in model.buffer_shapes.items()}
    fn = tf.function(lambda x: model(x, params, buffers, training=True)[0])
    # tracing asserts every node's output shape against the description's shape inference
    logits = fn.get_concrete_function(tf.TensorSpec(model.input_shape(2), tf.float32))
    weights = canonical_weights(spec)
    roundtrip = all(np.array_equal(model.to_canonical(n, model.to_tf(n, w)), w)
                    for n, w in weights.items())
    out[name] = {"logits": logits.structured_outputs.shape.as_list(), "roundtrip": roundtrip,
                 "permuted": sorted(model.to_tf_fns)}
print(json.dumps(out))
"""


def test_every_model_builds_with_the_descriptions_shapes(tf_python):
    """All six models trace in TF with every node's output shape equal to models' shape
    inference (Caffe ceil-mode pools included), and weights survive the layout round trip."""
    from models import MODEL_NAMES, get_model

    result = tf_snippet(tf_python, GEOMETRY)
    for name in MODEL_NAMES:
        assert result[name]["logits"] == [2, get_model(name).num_classes]
        assert result[name]["roundtrip"], name
    assert result["alexnet"]["permuted"] == ["fc6.weight"]  # 256x6x6 flatten in NHWC
    assert result["googlenet"]["permuted"] == []  # global pool: 1x1, nothing to permute


LAYOUT_AND_DATA = r"""
import json, tempfile
import numpy as np
from adapters.base import DistInfo, FrameworkUnavailable, RunConfig
from adapters.data import decode_jpeg, list_jpeg_dataset, make_jpeg_dataset
from adapters.tensorflow.inputs import decode_jpeg_tf
from adapters.tensorflow.strategy import CollectiveTrainer
from models import get_model

spec = get_model("alexnet-tiny")
config = RunConfig(run_id="x", framework="tf", mode="collective", model=spec.name,
                   batch_per_worker=2, options={"layout": "NCHW"})
try:
    CollectiveTrainer(spec, config, DistInfo())
    refused = ""
except FrameworkUnavailable as error:
    refused = str(error)
root = make_jpeg_dataset(tempfile.mkdtemp() + "/jpeg", spec, images_per_class=1)
worst = 0.0
for path, _ in list_jpeg_dataset(root)[:4]:
    ours = decode_jpeg_tf(path, 96, 96, "NCHW").numpy()
    worst = max(worst, float(np.max(np.abs(ours - decode_jpeg(path, 96, 96)))))
print(json.dumps({"refused": refused, "decode_max_diff": worst}))
"""


def test_nchw_refused_on_cpu_and_tf_data_decodes_like_pillow(tf_python):
    result = tf_snippet(tf_python, LAYOUT_AND_DATA)
    assert "NCHW" in result["refused"] and "CPU" in result["refused"]
    # accurate IDCT like Pillow: equal pixels, so equal normalised values
    assert result["decode_max_diff"] <= 1 / 64 + 1e-6


FUSED_PROFILE = r"""
import json, time
import numpy as np
from adapters.base import DistInfo, RunConfig
from adapters.tensorflow.strategy import CollectiveTrainer
from models import canonical_weights, get_model

spec = get_model("alexnet-tiny")
trainer = CollectiveTrainer(spec, RunConfig(run_id="x", framework="tf", mode="collective",
                                            model=spec.name, batch_per_worker=4), DistInfo())
trainer.load_weights(canonical_weights(spec, 0))
state = lambda: {**trainer.export_weights(), **{k + "/m": v.numpy() for k, v in trainer.slots.items()}}
before = state()
images, labels = next(trainer.batches)
trainer._fused_local_step()(images, labels)
after = state()
fused = trainer._fused_local_step()

def slow_fused(images, labels):  # the step's compute graph, 0.3 s slower than it is
    time.sleep(0.3)
    return fused(images, labels)

trainer._fused_local_step = lambda: slow_fused
phases = trainer.profile_step(False)
print(json.dumps({"unchanged": all(np.array_equal(before[k], after[k]) for k in before),
                  "phases": phases}))
"""


def test_profile_scales_backward_and_update_to_the_fused_local_graph(tf_python):
    """The separated profile's forward + backward + update is the time of one graph of the
    step's compute (forward, backward, pack, update), which runs on scratch copies and so
    changes neither weights nor momenta; a fused graph made 0.3 s slower shows in the phases."""
    result = tf_snippet(tf_python, FUSED_PROFILE)
    assert result["unchanged"]
    phases = result["phases"]
    assert set(phases) == {"io", "h2d", "forward", "backward", "comm", "update"}
    compute = phases["forward"] + phases["backward"] + phases["update"]
    assert 0.3 <= compute < 1.0, phases
    assert phases["backward"] > 0 and phases["update"] > 0 and phases["comm"] == 0.0


def test_environment_has_tf_keras_without_the_full_tensorflow_wheel(tf_python):
    code = ("import importlib.metadata as m, json\n"
            "names = {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()}\n"
            "print(json.dumps(sorted(n for n in names if 'tensorflow' in n or 'keras' in n)))")
    result = subprocess.run([tf_python, "-c", code], capture_output=True, text=True, timeout=120)
    names = json.loads(result.stdout.strip().splitlines()[-1])
    assert "tensorflow-cpu" in names, names
    assert "tf-keras" in names, names
    assert "tensorflow" not in names, names  # tf-keras's declared dependency was not installed


def test_nodeps_requirements_are_part_of_the_environment_digest(tmp_path, monkeypatch):
    from core import envs

    (tmp_path / "x.txt").write_text("numpy==2.4.6\n")
    monkeypatch.setenv("DLCOMPARE_REQUIREMENTS", str(tmp_path))
    plain = envs.environment_for("x").path
    (tmp_path / "x.nodeps.txt").write_text("tf-keras==2.21.0\n")
    with_nodeps = envs.environment_for("x").path
    (tmp_path / "x.nodeps.txt").write_text("tf-keras==2.20.0\n")
    assert len({plain, with_nodeps, envs.environment_for("x").path}) == 3


def find_server(marker: str, timeout: float = 300):
    """The parameter-server process of the run whose command line mentions `marker`, once
    the run's workers have started timing (so the server dies mid-run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in worker_processes(marker):
            try:
                role = process.environ().get("DLC_ROLE")
            except Exception:  # noqa: BLE001 - gone or not ours
                continue
            progress = list(Path(marker).glob("runs/*/progress"))
            if role == "server" and progress and "timed" in progress[0].read_text():
                return process
        time.sleep(0.2)
    raise AssertionError("the run never reached its timed iterations")


@pytest.mark.slow
def test_a_parameter_server_dying_mid_run_fails_the_run_and_leaves_nothing(tmp_path,
                                                                           tf_python):
    out = tmp_path / "dying-server"
    command, env = cli_command("launchers.compare", "--frameworks", "tf:ps", "--model",
                               MODEL, "--workers", "2", "--servers", "1", "--out", str(out),
                               "--timeout", "240", "--iterations", "200", "--repeats", "3",
                               "--warmup", "1", "--profile-iterations", "1")
    started = time.monotonic()
    campaign = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        server = find_server(str(out))
        killed_at = time.monotonic()
        server.kill()
        stdout, stderr = campaign.communicate(timeout=240 + 120)
    finally:
        if campaign.poll() is None:
            campaign.kill()
    assert campaign.returncode == 1, stderr[-3000:]
    import sqlite3

    with sqlite3.connect(out / "results.sqlite") as db:
        (status, error), = db.execute("SELECT status, error FROM runs").fetchall()
    assert status == "failed", error
    assert error.startswith("server 0 killed by signal 9"), error
    assert time.monotonic() - killed_at < 60  # noticed at once, not at the run's timeout
    assert time.monotonic() - started < 240 + 300
    assert worker_processes(str(out)) == []
