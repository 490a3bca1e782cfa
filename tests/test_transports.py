"""The transport contract, checked on every transport the registry finds (launchers/cluster/):
a transport is tested here by being a module of that package (docs/adding-a-transport.md).
What each one does with real nodes is tests/test_cluster.py's."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from types import FunctionType, SimpleNamespace

import pytest

from adapters.base import RunConfig
from launchers.cluster import Transport, TransportError, transport_for, transports
from tests.conftest import REPO_ROOT

KINDS = sorted(transports())
HOOKS = sorted(name for name, value in vars(Transport).items()
               if isinstance(value, (FunctionType, classmethod)) and not name.startswith("_"))


def campaign(nodes=(1,), bandwidths=(None,), latencies=(None,)) -> SimpleNamespace:
    """What the hooks read of a campaign (a plan.Campaign has more)."""
    return SimpleNamespace(nodes=list(nodes), bandwidths=list(bandwidths), latencies=list(latencies))


def parsed(cls: type[Transport]) -> Transport:
    """The transport as `--cluster` names it (an argument where it takes one)."""
    return transport_for(f"{cls.kind}:example" if cls.argument else cls.kind)


@pytest.fixture(scope="module")
def help_with_the_standard_library_only() -> str:
    """`--help` of run from an interpreter without site-packages: the registry (every transport
    module) imports with the standard library alone, as it must before the move into the
    launcher's environment."""
    done = subprocess.run([sys.executable, "-S", "-E", "-m", "launchers.compare", "--help"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return " ".join(done.stdout.split())


@pytest.mark.parametrize("kind", KINDS)
def test_it_parses_back_from_its_cluster_text_and_is_listed_by_help(
        kind, help_with_the_standard_library_only):
    cls = transports()[kind]
    assert kind and kind == kind.strip().lower() and ":" not in kind
    assert cls.summary and "\n" not in cls.summary
    transport = parsed(cls)
    assert type(transport) is cls and transport.label.startswith(kind)
    assert transport_for(transport.label).label == transport.label  # what the plan stores reads back
    assert f"{cls.syntax()} ({cls.summary})" in help_with_the_standard_library_only


@pytest.mark.parametrize("kind", KINDS)
def test_a_cluster_text_of_the_wrong_shape_is_one_line(kind):
    cls = transports()[kind]
    wrong = [kind, f"{kind}:", f" {kind}: "] if cls.argument else [f"{kind}:extra"]
    for text in wrong:
        with pytest.raises(TransportError) as raised:
            transport_for(text)
        assert len(str(raised.value).splitlines()) == 1 and "--cluster takes" in str(raised.value)


@pytest.mark.parametrize("kind", KINDS)
def test_links_and_nodes_beyond_what_it_gives_are_refused(kind):
    cls = transports()[kind]
    transport = parsed(cls)
    if not cls.shapes_links:
        for shaped in (campaign(bandwidths=["1Gbit"]), campaign(latencies=["1ms"])):
            with pytest.raises(TransportError, match="--bandwidth and --latency"):
                transport.validate(shaped)
    if cls.max_nodes < 10 ** 6:
        with pytest.raises(TransportError):
            transport.validate(campaign(nodes=[1, cls.max_nodes + 1]))


@pytest.mark.parametrize("kind", KINDS)
def test_every_hook_it_overrides_takes_what_the_campaign_passes(kind):
    cls = transports()[kind]
    for name in HOOKS:
        ours, base = inspect.getattr_static(cls, name), vars(Transport)[name]
        if ours is base:
            continue
        ours, base = (getattr(hook, "__func__", getattr(hook, "fget", hook)) for hook in (ours, base))
        expected = list(inspect.signature(base).parameters.values())
        signature = inspect.signature(ours)
        signature.bind(*[None] * len(expected))  # all positionally, as `launch` passes start's
        signature.bind(*[None for p in expected if p.default is p.empty],
                       **{p.name: None for p in expected if p.default is not p.empty})


@pytest.mark.parametrize("kind", KINDS)
def test_its_identity_is_made_of_run_settings(kind):
    """What a transport adds to a run's hash ends up in its RunConfig (the plan pops only
    `cluster`), so it must be a RunConfig field."""
    identity = parsed(transports()[kind]).identity("1Gbit", "1ms")
    assert set(identity) <= {"cluster"} | {f.name for f in dataclasses.fields(RunConfig)}


def test_two_transports_of_one_kind_are_refused_by_the_registry(tmp_path, monkeypatch):
    """A module copied under another name would shadow a transport: the registry says so."""
    import launchers.cluster as package

    (tmp_path / "second_local.py").write_text(
        "from launchers.cluster import Transport\n\n\n"
        "class Again(Transport):\n    kind = 'local'\n    summary = 'again'\n")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    transports.cache_clear()
    try:
        with pytest.raises(TypeError, match="two transports of kind 'local'"):
            transports()
    finally:
        monkeypatch.undo()
        transports.cache_clear()
        sys.modules.pop("launchers.cluster.second_local", None)
