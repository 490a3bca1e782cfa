"""The MXNet adapter's own parts: kvstore names, the ps-lite rendezvous, the Gluon build of the
shared description and its composite LRN, dist_sync over two servers, NCCL without a GPU, the
RecordIO input path, and failure of any ps-lite role.  What every mode must do (the same step as
PyTorch, two workers equal to one, learning, a calibration through the servers' updater with
its contention probe) is in tests/test_conformance.py.

Everything that needs MXNet runs in the MXNet environment (envs/mxnet.txt) as a subprocess:
this test process (the launcher's environment) never imports it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from adapters.base import RunConfig
from adapters.registry import UnknownFramework, parse_framework_mode
from core.envs import REPO_ROOT
from launchers.local import run_local
from launchers.rendezvous import processes_for
from tests.conftest import assert_ranks_equal_one_process, cli_command, run_cli, worker_processes
from tests.conftest import check_run as run_check

FAST = ["--iterations", "3", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1"]


def run_in_env(python: str, code: str, timeout: float = 600) -> str:
    """Run `code` in the MXNet environment from the repository root; returns its stdout."""
    result = subprocess.run([python, "-c", textwrap.dedent(code)], cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout



# ----------------------------------------------------------------------------- names and plans

@pytest.mark.parametrize("mode", ["horovod", "dist_async", "dist_sync_typo", "Local"])
def test_unknown_kvstore_names_are_rejected_by_the_registry(mode):
    with pytest.raises(UnknownFramework, match="unknown mode"):
        parse_framework_mode(f"mxnet:{mode}")


def test_kvstore_modes_and_their_servers():
    info, mode = parse_framework_mode("mxnet")
    assert mode == "dist_sync" and info.rendezvous == "dmlc" and info.env == "mxnet"
    assert set(info.modes) == {"local", "device", "nccl", "dist_sync", "dist_device_sync"}
    assert set(info.server_modes) == {"dist_sync", "dist_device_sync"}
    assert set(info.synchronous_modes) == set(info.modes)


def test_plan_expands_servers_only_for_server_modes(tmp_path):
    result = run_cli("launchers.compare", "--frameworks", "mxnet:dist_sync,mxnet:local",
                     "--model", "alexnet-tiny", "--workers", "1,2", "--servers", "1,2",
                     "--out", str(tmp_path / "c"), "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    plan = result.stderr + result.stdout
    for workers in (1, 2):
        for servers in (1, 2):
            assert f"mxnet-dist_sync-alexnet-tiny-1x{workers}-ps{servers}-" in plan
        assert f"mxnet-local-alexnet-tiny-1x{workers}-b" in plan
    assert "mxnet-local-alexnet-tiny-1x2-ps" not in plan


# ----------------------------------------------------------------------------- rendezvous

def config_for(mode: str, workers: int, servers: int, **extra) -> RunConfig:
    return RunConfig(run_id="r", framework="mxnet", mode=mode, model="alexnet-tiny",
                     batch_per_worker=2, workers_per_node=workers, servers=servers, **extra)


def test_dist_rendezvous_has_scheduler_servers_and_workers_on_loopback():
    specs = processes_for("dmlc", config_for("dist_sync", workers=2, servers=2))
    assert [s.name for s in specs] == ["scheduler0", "server0", "server1", "worker0", "worker1"]
    ports = {s.env["DMLC_PS_ROOT_PORT"] for s in specs}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for spec in specs:
        env = spec.env
        assert env["DMLC_ROLE"] == spec.role == env["DLC_ROLE"]
        assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert env["DMLC_NODE_HOST"] == "127.0.0.1" and env["DMLC_INTERFACE"] == "lo"
        assert env["DMLC_NUM_SERVER"] == "2" and env["DMLC_NUM_WORKER"] == "2"
    workers = [s for s in specs if s.is_worker]
    assert [(w.env["DLC_RANK"], w.env["DLC_WORLD_SIZE"]) for w in workers] == [("0", "2"),
                                                                             ("1", "2")]
    assert [s.env["DLC_ROLE_INDEX"] for s in specs if s.role == "server"] == ["0", "1"]


def test_in_process_kvstores_are_one_process_without_ps_lite():
    for mode in ("local", "device", "nccl"):
        specs = processes_for("dmlc", config_for(mode, workers=2, servers=0))
        assert len(specs) == 1 and specs[0].is_worker
        assert specs[0].env["DLC_WORLD_SIZE"] == "1"
        assert not any(key.startswith("DMLC_") for key in specs[0].env)


def test_rendezvous_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="at least one parameter server"):
        processes_for("dmlc", config_for("dist_sync", workers=2, servers=0))
    with pytest.raises(ValueError, match="one process on one node|one node from one process"):
        processes_for("dmlc", config_for("local", workers=2, servers=0, nodes=2))
    with pytest.raises(ValueError, match="no ps-lite rendezvous"):
        processes_for("dmlc", config_for("horovod", workers=1, servers=1))


# ----------------------------------------------------------------------------- in the environment

@pytest.mark.slow
def test_adapter_rejects_names_mxnet_would_accept(mxnet_python):
    out = run_in_env(mxnet_python, """
        import mxnet as mx
        from adapters.mxnet.base import check_mode
        # MXNet itself accepts any name without a word (a local store behind it):
        store = mx.kv.create("horovod")
        print("mxnet made:", store.type, store.num_workers)
        for name in ("horovod", "dist_async", "nonsense"):
            try:
                check_mode(name)
            except ValueError as error:
                print("rejected", name, "-", error)
        for name in ("local", "device", "nccl", "dist_sync", "dist_device_sync"):
            check_mode(name)
        """)
    assert "mxnet made: horovod 1" in out
    for name in ("horovod", "dist_async", "nonsense"):
        assert f"rejected {name}" in out


@pytest.mark.slow
def test_gluon_build_matches_the_description_shapes(mxnet_python):
    """Every leaf's output shape in the Gluon network equals the description's shape
    inference, for the tiny and the full models (Caffe's ceil-mode pools included)."""
    out = run_in_env(mxnet_python, """
        import mxnet as mx
        from adapters.mxnet.model import Network
        from models import MODEL_NAMES, get_model
        for name in MODEL_NAMES:
            spec = get_model(name)
            net = Network(spec, dropout=True)
            net.initialize(mx.init.Xavier())
            seen = {}
            for leaf_name, leaf in net.leaves.items():
                leaf.register_forward_hook(
                    lambda block, inputs, output, n=leaf_name: seen.__setitem__(n, output.shape))
            logits = net(mx.nd.zeros((1, *spec.input_shape)))
            expected = spec.output_shapes()
            bad = [(n, s[1:], expected[n]) for n, s in seen.items() if tuple(s[1:]) != expected[n]]
            assert not bad, (name, bad[:5])
            assert logits.shape == (1, spec.num_classes)
            params = sum(p.data().size for n, p in net.params_by_name.items()
                         if not n.endswith(("running_mean", "running_var")))
            assert params == spec.total_params, (name, params, spec.total_params)
            print(name, len(seen), "leaves ok", params)
        """)
    assert out.count("leaves ok") == 6


@pytest.mark.slow
def test_composite_lrn_is_caffes_lrn_forward_and_backward(mxnet_python):
    """The LRN used under MKL-DNN (see adapters/mxnet/model.py LRN) against Caffe's formula and its
    analytic gradient in float64, with a large alpha so a wrong cross-channel term shows."""
    out = run_in_env(mxnet_python, """
        import numpy as np, mxnet as mx
        from mxnet import autograd
        from adapters.mxnet.model import LRN
        from models import LRN as Spec
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 16, 5, 5))
        g = rng.standard_normal(x.shape)
        n, alpha, beta, k = 5, 0.5, 0.75, 2.0
        C = x.shape[1]
        sq = np.pad(x ** 2, ((0, 0), (n // 2, n // 2), (0, 0), (0, 0)))
        s = k + alpha / n * sum(sq[:, i:i + C] for i in range(n))
        y = x * s ** -beta
        t = np.pad(g * x * s ** (-beta - 1), ((0, 0), (n // 2, n // 2), (0, 0), (0, 0)))
        dx = g * s ** -beta - 2 * alpha * beta / n * x * sum(t[:, i:i + C] for i in range(n))
        block = LRN(Spec("norm", n, alpha, beta, k), x.shape[1:], composite=True)
        block.hybridize()
        xs = mx.nd.array(x, dtype="float32"); xs.attach_grad()
        with autograd.record():
            out = block(xs)
        out.backward(mx.nd.array(g, dtype="float32"))
        ey = np.abs(out.asnumpy() - y).max() / np.abs(y).max()
        ex = np.abs(xs.grad.asnumpy() - dx).max() / np.abs(dx).max()
        print(f"forward {ey:.2e} backward {ex:.2e}")
        assert ey < 1e-5 and ex < 1e-5
        """)
    print(out)


def check_run(tmp: Path, python: str, mode: str, model: str, workers: int, batch: int,
              servers: int, steps: int = 1, timeout: float = 300) -> Path:
    return run_check(tmp, python, "mxnet", model, mode=mode, workers=workers, batch=batch,
                     servers=servers, steps=steps, timeout=timeout)


@pytest.mark.slow
def test_dist_sync_over_two_servers_equals_one_worker_on_the_global_batch(tmp_path, mxnet_python,
                                                                         monkeypatch):
    """2 steps, so the servers' momentum state takes part, every tensor over 1000 values split
    over both servers (MXNET_KVSTORE_BIGARRAY_BOUND, default 1e6, would leave the tiny models'
    tensors whole on one server or the other).  One server: tests/test_conformance.py."""
    model = "alexnet-tiny"
    monkeypatch.setenv("MXNET_KVSTORE_BIGARRAY_BOUND", "1000")
    two = check_run(tmp_path, mxnet_python, "dist_sync", model, workers=2, batch=4,
                    servers=2, steps=2)
    one = check_run(tmp_path, mxnet_python, "dist_sync", model, workers=1, batch=8,
                    servers=1, steps=2)
    assert_ranks_equal_one_process(two, one, model)


@pytest.mark.slow
def test_nccl_without_gpus_is_recorded_as_unavailable(tmp_path, mxnet_python):
    out = tmp_path / "nccl"
    config = RunConfig(run_id="nccl", framework="mxnet", mode="nccl", model="alexnet-tiny",
                       batch_per_worker=2, rank_dir=str(out), record_path=str(out / "r.json"))
    outcome = run_local(config, mxnet_python, out, "dmlc", REPO_ROOT, timeout=120)
    assert outcome.status == "unavailable", outcome
    assert "nccl" in outcome.error.lower()


# ----------------------------------------------------------------------------- files

@pytest.mark.slow
def test_recordio_path_packs_the_same_jpegs_and_decodes_like_the_others(tmp_path,
                                                                         mxnet_python):
    """The data set's JPEG bytes go into RecordIO unchanged; ImageRecordIter's centre crop
    and normalisation give what adapters.data.decode_jpeg gives (up to the two JPEG
    decoders' rounding)."""
    from adapters.data import make_jpeg_dataset
    from models import get_model

    root = make_jpeg_dataset(tmp_path / "jpegs", get_model("alexnet-tiny"), images_per_class=2)
    out = run_in_env(mxnet_python, f"""
        import numpy as np, mxnet as mx
        from pathlib import Path
        from adapters.base import DistInfo, RunConfig
        from adapters.data import decode_jpeg, list_jpeg_dataset
        from adapters.mxnet.inputs import RecordBatches, pack_recordio
        from models import get_model
        root = {str(root)!r}
        items = list_jpeg_dataset(root)
        rec, idx = pack_recordio(root)
        reader = mx.recordio.MXIndexedRecordIO(str(idx), str(rec), "r")
        for i, (path, label) in enumerate(items):
            header, payload = mx.recordio.unpack(reader.read_idx(i))
            assert payload == Path(path).read_bytes() and header.label == label
        spec = get_model("alexnet-tiny")
        config = RunConfig(run_id="f", framework="mxnet", mode="local", model=spec.name,
                           batch_per_worker=len(items), data="files", data_dir=root,
                           loader_workers=1)
        images, labels = next(RecordBatches(spec, config, DistInfo(), [mx.cpu()]))
        images, labels = images.asnumpy(), labels.asnumpy()
        reference = [(decode_jpeg(p, 96, 96), l) for p, l in items]
        worst = 0.0
        for image, label in zip(images, labels):
            best = min(np.abs(image - ref).mean() for ref, l in reference if l == label)
            worst = max(worst, best)
        print("images", len(images), "worst mean abs difference", worst)
        assert images.shape == (len(items), 3, 96, 96) and worst < 0.02
        assert sorted(labels.astype(int)) == sorted(l for _, l in items)
        """)
    print(out)


@pytest.mark.slow
def test_files_run_through_dist_sync_records_the_input_path(tmp_path, mxnet_python):
    from adapters.data import make_jpeg_dataset
    from models import get_model

    root = make_jpeg_dataset(tmp_path / "jpegs", get_model("alexnet-tiny"), images_per_class=4)
    out = tmp_path / "run"
    config = RunConfig(run_id="files", framework="mxnet", mode="dist_sync",
                       model="alexnet-tiny", batch_per_worker=4, workers_per_node=2, servers=1,
                       warmup=1, iterations=2, repeats=1, profile_iterations=1, data="files",
                       data_dir=str(root), loader_workers=1, rank_dir=str(out),
                       record_path=str(out / "record.json"))
    outcome = run_local(config, mxnet_python, out, "dmlc", REPO_ROOT, timeout=300)
    assert outcome.status == "ok", outcome.error
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok" and record["data"] == "files" and record["servers"] == 1
    assert record["extra"]["input"] == "RecordIO + ImageRecordIter"
    assert record["extra"]["kvstore"] == "dist_sync"


# ----------------------------------------------------------------------------- campaigns

def role_processes(marker: str, role: str) -> list:
    found = []
    for process in worker_processes(marker):
        try:
            if process.environ().get("DLC_ROLE") == role:
                found.append(process)
        except Exception:  # noqa: BLE001 - gone or not ours
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_a_ps_lite_role_killed_mid_run_fails_the_run_and_leaves_nothing(tmp_path, mxnet_python,
                                                                       role):
    out = tmp_path / f"kill-{role}"
    timeout = 120
    command = ["launchers.compare", "--frameworks", "mxnet:dist_sync", "--model",
               "alexnet-tiny", "--workers", "2", "--servers", "2", "--out", str(out),
               "--timeout", str(timeout), "--iterations", "100000", "--repeats", "1",
               "--warmup", "1", "--profile-iterations", "1"]
    command, env = cli_command(*command)
    started = time.monotonic()
    cli = subprocess.Popen(command, cwd=REPO_ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        victim = None
        while time.monotonic() - started < timeout:  # wait until the workers are stepping
            progress = list(out.glob("runs/*/progress"))
            victims = role_processes(str(out), role)
            if progress and victims and int(progress[0].read_text().split()[0]) >= 3:
                victim = victims[0]
                break
            assert cli.poll() is None, cli.communicate()
            time.sleep(0.2)
        assert victim is not None, "the run never got going"
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = cli.communicate(timeout=timeout + 120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 1, stderr[-3000:]
    with sqlite3.connect(out / "results.sqlite") as db:
        (status, error, duration), = db.execute("SELECT status, error, duration_s FROM runs")
    assert status == "failed", (status, error)
    assert f"{role} " in error.splitlines()[0] and "killed by signal 9" in error.splitlines()[0]
    assert duration < timeout
    print(f"{role} killed: run ended {time.monotonic() - killed:.1f} s later "
          f"(the campaign included its report), recorded: {error.splitlines()[0]!r}")
    assert worker_processes(str(out)) == []
