"""Shared fixtures: the CLI as a user runs it, the framework environments, and a 1,000-run
sweep's report (built once, read by the overview and browser tests)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


# The interpreter a user starts the commands with: the one the launcher's environment was made
# from (without its packages: no pandas, no rich), as `python3 -m ...` from a clone is.
USER_PYTHON = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
BOOTSTRAP = ("DLCOMPARE_NO_BOOTSTRAP", "DLCOMPARE_HOST_ENV", "VIRTUAL_ENV")


WIDE_SWEEP_RUNS = 1000


@pytest.fixture(scope="session")
def wide_sweep(tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    """A campaign of `WIDE_SWEEP_RUNS` runs swept along batch, workers and bandwidth
    (`tests.test_analysis_data.wide_sweep_records`): its folder, its report and its records."""
    from analysis import report
    from tests.test_analysis_data import make_campaign, wide_sweep_records

    records = wide_sweep_records(WIDE_SWEEP_RUNS)
    folder = make_campaign(tmp_path_factory.mktemp("wide_sweep"), records)
    return folder, report.build_report(folder), records


def cli_command(*args: str, env: dict | None = None,
                cwd: Path = REPO_ROOT) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `python -m <args>` as a user runs it from the
    repository root (or `cwd`, a copy of it): the user's interpreter, then the command's own
    move into the launcher's environment (core.envs.reexec_in_host_env; built by the time tests
    run, so it costs a process start, and the process keeps its pid). A campaign runs one
    launch of each configuration unless the test names --launches. With
    `env={"DLCOMPARE_NO_BOOTSTRAP": "1"}` it runs in the test's own interpreter instead."""
    full_env = {**{k: v for k, v in os.environ.items() if k not in BOOTSTRAP},
                "PYTHONPATH": str(cwd), **(env or {})}
    if args[:1] == ("launchers.compare",) and "--launches" not in args:
        args = (*args, "--launches", "1")  # tests that need no statistics keep one launch each
    python = sys.executable if full_env.get("DLCOMPARE_NO_BOOTSTRAP") == "1" else USER_PYTHON
    return [python, "-m", *args], full_env


def run_cli(*args: str, env: dict | None = None, timeout: float = 900,
            cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Run `python -m <args>` as a user does (`cli_command`), to its end."""
    command, full_env = cli_command(*args, env=env, cwd=cwd)
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def copy_of_the_repository(to: Path) -> Path:
    """The files of this checkout git knows (tracked, and new ones it does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60)
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


def insert_at_table_end(path: Path, entry: str, table: str, closing: str) -> None:
    """Put `entry` as the last element of the table that starts at `table` in `path`: before
    the first line after it that begins with `closing` (a guide's "add it at the end of ...")."""
    text = path.read_text()
    end = text.index("\n" + closing, text.index(table)) + 1
    path.write_text(text[:end] + entry + text[end:])


def assert_described_as_the_catalogue(described: dict, scheme) -> None:
    """A run's (or a calibration's) `comm_scheme` names the catalogue's collective and its
    stack; a framework with its own layer over the stack qualifies it (Horovod's fits are
    keyed ``horovod-gloo``, so a PyTorch gloo fit never stands in for Horovod's own)."""
    assert described["algorithm"] == scheme.model["algorithm"], (scheme.name, described)
    transport = described["transport"]
    assert transport in (scheme.transport, f"{scheme.framework}-{scheme.transport}"), (scheme.name, described)


def worker_processes(marker: str) -> list:
    """Live processes whose command line mentions `marker` (a campaign folder, say)."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if marker in cmdline and process.pid != os.getpid():
            found.append(process)
    return found


@pytest.fixture(scope="session")
def torch_python() -> str:
    """The PyTorch environment's interpreter, built from envs/torch.txt on first use."""
    from core.envs import ensure_environment

    return str(ensure_environment("torch", log=print).python)


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    """The MXNet environment's interpreter, built from envs/mxnet.txt on first use."""
    from core.envs import ensure_environment

    return str(ensure_environment("mxnet", log=print).python)


@pytest.fixture(scope="session")
def tf_python() -> str:
    """The TensorFlow environment's interpreter, built from envs/tf.txt (+ tf.nodeps.txt)."""
    from core.envs import ensure_environment

    return str(ensure_environment("tf", log=print).python)


def check_run(tmp: Path, python: str, framework: str, model: str, *, mode: str | None = None,
              workers: int = 1, batch: int = 4, steps: int = 1, servers: int = 0,
              options: dict | None = None, timeout: float = 300,
              extra_env: dict | None = None) -> Path:
    """The worker in check mode through the local transport, as a campaign starts it: gradients
    on the first batch, `steps` SGD steps, then every rank's weights, dumped as .npz files in
    the returned folder. Dropout is off and each rank gets one thread, so runs compare."""
    from adapters.base import RunConfig
    from adapters.registry import framework_info
    from launchers.local import run_local

    info = framework_info(framework)
    mode = mode or info.modes[0]
    out = tmp / f"{framework}-{mode}-{model}-w{workers}-b{batch}-s{servers}-n{steps}"
    config = RunConfig(run_id=out.name, framework=framework, mode=mode, model=model,
                       batch_per_worker=batch, workers_per_node=workers, servers=servers,
                       dropout=False, threads_per_worker=1, options=options or {},
                       rank_dir=str(out), check={"steps": steps, "out_dir": str(out)})
    outcome = run_local(config, python, out, info.rendezvous, REPO_ROOT, timeout=timeout,
                        extra_env=extra_env)
    if outcome.status == "unavailable":  # the machine lacks what the scheme needs (a GPU)
        pytest.skip(f"{framework}:{mode} cannot run here: {outcome.error}")
    assert outcome.status == "ok", outcome.error
    return out


def assert_a_few_steps_reduce_the_loss(tmp: Path, python: str, framework: str,
                                       mode: str | None = None, servers: int = 0,
                                       extra_env: dict | None = None, timeout: float = 300) -> None:
    """Eight SGD steps on resnet50-tiny's first batch (16 images) cut its loss by 10 % or more:
    the framework trains, not only runs."""
    out = check_run(tmp, python, framework, "resnet50-tiny", mode=mode, batch=16, steps=8,
                    servers=servers, timeout=timeout, extra_env=extra_env)
    losses = json.loads((out / "loss_rank0.json").read_text())
    print(losses)
    assert losses["after"] < 0.9 * losses["before"]


def load(path: Path) -> dict:
    """An .npz dump as a plain dict of arrays."""
    import numpy as np

    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def assert_ranks_equal_one_process(several: Path, one: Path, model: str, ranks: int = 2) -> float:
    """Every parameter bit-identical on every rank, equal to one process stepping on the global
    batch, and really moved by the step (a no-op step would also be "equal"). Returns the
    largest difference from the one process. Models without batch norm only: with it each
    worker normalises by its own share of the batch, not the global batch's statistics."""
    import numpy as np

    from models import canonical_weights, get_model

    spec = get_model(model)
    assert not spec.buffer_shapes(), "batch-norm models differ from the global batch by design"
    weights = [load(several / f"weights_rank{r}.npz") for r in range(ranks)]
    single = load(one / "weights_rank0.npz")
    assert weights[0].keys() == single.keys() == set(spec.parameter_shapes())
    worst = 0.0
    for name in single:
        for other in weights[1:]:
            assert np.array_equal(weights[0][name], other[name]), f"ranks differ in {name}"
        np.testing.assert_allclose(weights[0][name], single[name], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
        worst = max(worst, float(np.max(np.abs(weights[0][name] - single[name]))))
    initial = canonical_weights(spec)
    moved = max(float(np.max(np.abs(single[n] - initial[n]))) for n in single)
    print(f"{several.name}: max |{ranks} ranks - 1 process| = {worst:.2e}, "
          f"max step change = {moved:.2e}")
    assert moved > 100 * max(worst, 1e-9)
    return worst


def overlap_run(out: Path, python: str, framework: str, mode: str | None = None,
                model: str = "alexnet", batch: int = 4) -> dict:
    """One 2-rank run of the real worker with 5 profile iterations of each kind (communication
    after backward, and the framework's own overlapped way); returns its record, printing the
    times the overlap comes from."""
    import json

    from adapters.base import RunConfig
    from adapters.registry import framework_info
    from launchers.local import run_local

    info = framework_info(framework)
    mode = mode or info.modes[0]
    config = RunConfig(run_id=out.name, framework=framework, mode=mode, model=model,
                       batch_per_worker=batch, workers_per_node=2, warmup=1, iterations=1,
                       repeats=1, profile_iterations=5, dropout=False, rank_dir=str(out),
                       record_path=str(out / "record.json"))
    outcome = run_local(config, python, out, info.rendezvous, REPO_ROOT, timeout=900)
    assert outcome.status == "ok", outcome.error
    record = json.loads((out / "record.json").read_text())
    phases = {p["phase"]: p["measured_s"] for p in record["phases"]}
    print(f"{framework}:{mode} {model} b{batch} x2 ({out.name}): backward "
          f"{phases['backward']:.3f} s, communication after backward {phases['comm']:.3f} s, "
          f"backward with its overlapped communication "
          f"{record['extra']['profile_backward_comm']:.3f} s -> overlap {record['overlap']:.2f}"
          f"; iteration {record['iter_time_median']:.3f} s")
    return record


def calibration_run(out: Path, python: str, framework: str, mode: str,
                    sizes: tuple[int, ...] = (4096, 4 * 2 ** 20), repeats: int = 3,
                    servers: int = 0, extra_env: dict | None = None) -> dict[int, list[float]]:
    """A real 2-rank calibration through the framework's own communication stack, as
    `launchers.calibrate` starts it (small sizes as up to the adapter's MAX_CALIBRATION_ITERS
    back-to-back messages, 1 MiB per sample); returns seconds per message for each size and
    prints the fastest of each."""
    import json

    from adapters.base import RunConfig
    from adapters.registry import framework_info
    from launchers.local import run_local

    info = framework_info(framework)
    config = RunConfig(run_id="calibrate", framework=framework, mode=mode, model="alexnet-tiny",
                       batch_per_worker=2, workers_per_node=2, servers=servers, rank_dir=str(out),
                       record_path=str(out / "calibration.json"),
                       calibrate={"sizes": list(sizes), "repeats": repeats})
    outcome = run_local(config, python, out, info.rendezvous, REPO_ROOT, timeout=300,
                        extra_env=extra_env)
    assert outcome.status == "ok", outcome.error
    result = json.loads((out / "calibration.json").read_text())
    times = {n: result["collective"][str(n)] for n in sizes}
    print(f"{framework}:{mode}, 2 ranks: " + ", ".join(
        f"{n} B {min(t) * 1e3:.3f} ms" for n, t in times.items()))
    assert all(len(t) == repeats for t in times.values())
    return times


ALEXNET_TINY_TENSORS = 16  # the calibration network: 8 layers with parameters, weight and bias


def assert_contention_probe(out: Path, tensors: int = ALEXNET_TINY_TENSORS) -> dict:
    """The calibration record's contention probe (adapters/calibration.py): every round's
    backward alone and with a collective per parameter tensor, when that round's exchange was
    back (never before its backward ended), when the same exchange alone was back, and the
    ready times of the `tensors` parameter tensors in order."""
    import json
    import statistics

    from adapters.calibration import CONTENTION_ROUNDS

    probe = json.loads((out / "calibration.json").read_text())["contention"]
    assert probe is not None, "a scheme that overlaps must have a contention probe"
    assert len(probe["alone_s"]) == len(probe["with_s"]) == len(probe["done_s"]) == CONTENTION_ROUNDS
    assert min(probe["alone_s"] + probe["with_s"]) > 0
    assert all(done >= with_ for done, with_ in zip(probe["done_s"], probe["with_s"]))
    assert len(probe["replay_s"]) == CONTENTION_ROUNDS
    # sent at each round's own ready times: it cannot end long before the last of them
    assert min(probe["replay_s"]) >= 0.5 * probe["ready_s"][-1] > 0
    assert len(probe["bytes"]) == len(probe["ready_s"]) == tensors and min(probe["bytes"]) > 0
    assert probe["ready_s"] == sorted(probe["ready_s"]) and probe["ready_s"][-1] <= max(probe["alone_s"])
    print(f"contention probe: backward {statistics.median(probe['alone_s']) * 1e3:.1f} ms alone, "
          f"{statistics.median(probe['with_s']) * 1e3:.1f} ms with a collective per tensor, exchange back at "
          f"{statistics.median(probe['done_s']) * 1e3:.1f} ms")
    return probe


def default_sigint() -> None:
    """`preexec_fn` for a campaign a test interrupts with SIGINT, as Ctrl-C at a terminal
    would: a shell starts background jobs with SIGINT ignored, Python then never raises
    KeyboardInterrupt, and a suite run as `.ci/run &` saw the campaign finish as if never
    interrupted (exit 0, not 130)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
