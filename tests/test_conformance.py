"""The conformance suite: what every framework and mode of the registry must do.

Each test is parametrised from the registry (`adapters.registry.FRAMEWORKS`) and the scheme
catalogue (`core.schemes`), so a framework or mode joins the suite by being registered:

- the same loss, gradients and one SGD step as every other framework from the same weights
  and batch (`launchers.check`, every tiny model);
- every synchronous scheme that sends its gradients exactly: two ranks (or two devices of one
  process) hold identical weights, equal to one process stepping on the global batch, after
  two momentum-SGD steps; every compressing scheme (the catalogue's ``lossy``): identical
  ranks and its cost to the loss against its framework's default (`launchers.check --workers`);
- every distinct one-worker computation (the catalogue's ``compute``): a few steps reduce the
  loss;
- every multi-process synchronous scheme, once per framework and transport (a framework's modes
  over one transport share its collective call): a calibration through its own stack,
  described as the catalogue describes the scheme, with a contention probe exactly where the
  scheme sends during backward;
- every framework: an unknown mode is one line on stderr and exit 2.

A scheme the machine cannot run (NCCL without a GPU, CNTK without Python 3.6) skips, saying
why, as the worker reports it.  The phases and the scheme of every framework's 2-worker
record are checked by the all-frameworks campaign (tests/test_all_frameworks.py).
Framework-specific variants (two parameter servers, several fusion buffers, momentum over
several CNTK steps) stay in each framework's own test file.
"""

from __future__ import annotations

import json

import pytest

from adapters.registry import FRAMEWORKS, framework_info
from core import schemes as catalogue
from models import MODEL_NAMES
from tests.conftest import (REPO_ROOT, assert_a_few_steps_reduce_the_loss, assert_contention_probe,
                            assert_described_as_the_catalogue, assert_ranks_equal_one_process,
                            calibration_run, check_run, run_cli)

TINY_MODELS = tuple(name for name in MODEL_NAMES if name.endswith("-tiny"))
RANKS_MODEL = "googlenet-tiny"  # no batch norm, and branches: many tensors, several buckets
LARGE_MESSAGE = 32 * 2 ** 20  # the calibration size whose bytes dominate every transport's fixed costs


def registered(predicate=lambda scheme: True) -> list:
    """pytest params of every registered FRAMEWORK:MODE whose catalogue entry passes."""
    return [pytest.param(name, mode, id=f"{name}:{mode}")
            for name, info in FRAMEWORKS.items() for mode in info.modes
            if predicate(info.scheme(mode))]


def one_per_computation() -> list:
    """One scheme per distinct one-worker computation: schemes sharing a ``compute`` run the
    same step on one worker, so the first of them (the framework's default) stands for all."""
    seen, params = set(), []
    for name, info in FRAMEWORKS.items():
        scheme = info.scheme(info.modes[0])
        key = scheme.compute or scheme.name
        if key not in seen:
            seen.add(key)
            params.append(pytest.param(name, info.modes[0], id=scheme.name))
    return params


def first_per_transport(params: list) -> list:
    """The first of `params` per framework, transport, collective and topology: the modes that
    share them (DDP and its compressing and sharding variants) calibrate through the same
    collective call."""
    seen, kept = set(), []
    for param in params:
        name, mode = param.values
        scheme = catalogue.scheme(name, mode)
        key = (name, scheme.transport, scheme.model.get("algorithm"), scheme.model.get("topology"))
        if key not in seen:
            seen.add(key)
            kept.append(param)
    return kept


def distributed(scheme: catalogue.SchemeInfo) -> bool:
    return scheme.synchronous and not scheme.one_process


def servers_for(scheme: catalogue.SchemeInfo) -> int:
    """One parameter server for a scheme that has them, none otherwise."""
    return 1 if scheme.servers else 0


@pytest.fixture(scope="module")
def environment():
    """(python, rank variables) of a framework's ranks, as a campaign prepares them
    (launchers.interpreters): its virtualenv, and its backend's interpreter where it has one.
    Skips where the machine cannot host the framework."""
    from launchers.interpreters import prepare_interpreters

    cache: dict[str, tuple[str, dict]] = {}

    def get(name: str) -> tuple[str, dict]:
        if name not in cache:
            info = framework_info(name)
            chosen = prepare_interpreters([(info, info.modes[0])], {}, log=print, warn=print)
            if name in chosen.unavailable:
                pytest.skip(f"{name} cannot run on this machine: {chosen.unavailable[name]}")
            cache[name] = (chosen.python(info), chosen.rank_env(info))
        return cache[name]

    return get


def runnable_here(names) -> list[str]:
    """The frameworks of `names` whose environments this machine can host (the others are
    printed with the reason)."""
    from launchers.interpreters import prepare_interpreters

    infos = [framework_info(name.split(":")[0]) for name in names]
    chosen = prepare_interpreters([(info, info.modes[0]) for info in infos], {}, log=print, warn=print)
    for name, reason in chosen.unavailable.items():
        print(f"left out of the check: {name}: {reason}")
    return [name for name in names if name.split(":")[0] not in chosen.unavailable]


def equivalence_schemes() -> list[str]:
    """Every framework's default mode, and every one-process mode that runs on a CPU (one
    process driving the devices takes another code path than its ranks do)."""
    names = [f"{name}:{info.modes[0]}" for name, info in FRAMEWORKS.items()]
    names += [scheme.name for scheme in catalogue.FRAMEWORK_SCHEMES
              if scheme.one_process and scheme.synchronous and scheme.transport not in ("nccl", None)
              and scheme.framework in FRAMEWORKS]
    return names


# ----------------------------------------------------------------------------- no processes

@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_an_unknown_mode_is_one_line_and_exit_2(tmp_path, name):
    result = run_cli("launchers.compare", "--frameworks", f"{name}:no-such-mode", "--model",
                     "alexnet-tiny", "--out", str(tmp_path / "c"), timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "no-such-mode" in lines[0], result.stderr
    assert all(mode in lines[0] for mode in FRAMEWORKS[name].modes), lines[0]  # what it could be
    assert not (tmp_path / "c").exists()  # nothing stored


def test_every_registered_scheme_is_in_the_catalogue_with_a_computation():
    """The suite reads the catalogue: a mode it does not describe would run untested."""
    for name, info in FRAMEWORKS.items():
        for mode in info.modes:
            scheme = catalogue.scheme(name, mode)
            assert scheme.framework == name and scheme.mode == mode
            assert scheme.compute, f"{scheme.name}: the catalogue names no one-worker computation"


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_the_readme_lists_every_framework_with_its_label_and_modes(name):
    """README's framework table is what a user reads first: a row per registered framework,
    with the catalogue's label and every mode."""
    rows = [line for line in (REPO_ROOT / "README.md").read_text().splitlines()
            if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"README.md has no row (or several) for {name} in its framework table"
    info = FRAMEWORKS[name]
    assert f"| {info.label} |" in rows[0], rows[0]
    assert all(f"`{mode}`" in rows[0] for mode in info.modes), rows[0]


# ----------------------------------------------------------------------------- real runs

@pytest.mark.slow
@pytest.mark.parametrize("model", TINY_MODELS)
def test_every_framework_computes_the_same_step(model):
    schemes = runnable_here(equivalence_schemes())
    result = run_cli("launchers.check", "--frameworks", ",".join(schemes), "--model", model,
                     timeout=2400)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"PASS: {model}" in result.stdout
    assert "gradient relative L2 error, max over" in result.stdout
    assert all(f"ran {name}" in result.stdout for name in schemes)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", registered(lambda scheme: scheme.synchronous and not scheme.lossy))
def test_two_ranks_equal_one_process_on_the_global_batch(tmp_path, environment, name, mode):
    """2 workers x batch 4 against 1 x batch 8, two steps (so momentum takes part), with one
    parameter server where the scheme has them; for a scheme whose one process drives every
    device, two devices of that process against one."""
    python, env = environment(name)
    scheme = catalogue.scheme(name, mode)
    servers = servers_for(scheme)
    two = check_run(tmp_path, python, name, RANKS_MODEL, mode=mode, workers=2, batch=4, steps=2,
                    servers=servers, extra_env=env, timeout=600)
    one = check_run(tmp_path, python, name, RANKS_MODEL, mode=mode, workers=1, batch=8, steps=2,
                    servers=servers, extra_env=env, timeout=600)
    assert_ranks_equal_one_process(two, one, RANKS_MODEL, ranks=1 if scheme.one_process else 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({s.framework for s in catalogue.FRAMEWORK_SCHEMES if s.lossy}))
def test_compressing_schemes_keep_their_ranks_equal_and_state_their_loss_cost(name):
    """A compressing scheme cannot equal the exact step, but its ranks must still agree, and
    `check --workers` states what it costs the loss after a few steps on the same data."""
    lossy = [s.name for s in catalogue.FRAMEWORK_SCHEMES if s.framework == name and s.lossy]
    default = f"{name}:{FRAMEWORKS[name].modes[0]}"
    result = run_cli("launchers.check", "--frameworks", ",".join([default, *lossy]), "--model", "alexnet-tiny",
                     "--workers", "2", "--steps", "8", timeout=1200)
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for scheme in [default, *lossy]:
        assert f"{scheme}: the 2 ranks' weights are identical  ok" in result.stdout
    for scheme in lossy:
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(f"{scheme}: loss after 8"))
        change = float(line.rsplit("(", 1)[1].split("%")[0])
        assert abs(change) < 50, line  # a cost, not a broken training step


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", one_per_computation())
def test_a_few_steps_reduce_the_loss(tmp_path, environment, name, mode):
    python, env = environment(name)
    assert_a_few_steps_reduce_the_loss(tmp_path, python, name, mode=mode,
                                       servers=servers_for(catalogue.scheme(name, mode)),
                                       extra_env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", first_per_transport(registered(lambda s: distributed(s) and s.modelled)))
def test_calibration_goes_through_the_schemes_own_stack(tmp_path, environment, name, mode):
    """Small messages cost less than 32 MiB ones (large enough that the bytes outweigh a
    background cycle such as Horovod's, about 2 ms on loopback at 4 MiB as at 4 KiB); the
    calibration describes the scheme as the catalogue does (its collective and transport: the
    key its fit is stored under); a scheme that sends during backward probes the contention,
    one that sends after it does not."""
    python, env = environment(name)
    scheme = catalogue.scheme(name, mode)
    out = tmp_path / "calibrate"
    times = calibration_run(out, python, name, mode, sizes=(4096, LARGE_MESSAGE),
                            servers=servers_for(scheme), extra_env=env)
    assert min(times[LARGE_MESSAGE]) > min(times[4096]) > 0
    record = json.loads((out / "calibration.json").read_text())
    described = record["comm_scheme"]
    assert_described_as_the_catalogue(described, scheme)
    if scheme.servers:  # described with the run's servers, the key its fit is stored under
        assert described["servers"] == 1
    if scheme.model["overlap"]:
        assert_contention_probe(out)
    else:
        assert record["contention"] is None

