"""The tree keeps the layers it promises: core <- models <- analysis <- adapters <- launchers.

Read from the source (every import, function-local ones included), not from a list of today's
modules, so a new module or a new import is checked the day it appears:
  - no import runs up the layers;
  - no import cycle between modules;
  - a function-local import says why it is local (a comment on its line or just above it);
  - no framework is imported by the parts every environment runs (core, models, analysis,
    launchers, and everything the worker imports before it loads the one adapter it needs);
  - the registry's facts point at things that exist (adapter module, environment file,
    rendezvous module, image).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

from adapters.registry import FRAMEWORKS
from core.envs import requirements_dir
from launchers.images import IMAGES
from launchers.rendezvous import KINDS

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("core", "models", "analysis", "adapters", "launchers")  # bottom first
FRAMEWORKS_IMPORTED = set().union(*(info.packages for info in FRAMEWORKS.values()))


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported name, resolved to a module of the project where it is one
    line: int
    local: bool  # inside a function


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for layer in LAYERS
            for path in sorted((REPO_ROOT / layer).rglob("*.py"))}


def resolve(name: str, modules: dict[str, Path]) -> str:
    """The project module `name` refers to (a module, or an attribute of one), else `name`."""
    probe = name
    while probe and probe not in modules:
        probe = probe.rpartition(".")[0]
    return probe or name


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    local_lines = {node.lineno for function in ast.walk(tree)
                   if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        for target in targets:
            found.append(Import(name, resolve(target, modules), node.lineno,
                                node.lineno in local_lines))
    return found


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Import]]:
    modules = project_modules()
    return modules, [imp for name, path in modules.items()
                     for imp in imports_of(name, path, modules)]


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_no_import_runs_up_the_layers(graph):
    modules, imports = graph
    upward = [f"{imp.source}:{imp.line} imports {imp.target}" for imp in imports
              if imp.target in modules and layer(imp.target) > layer(imp.source)]
    assert not upward, "imports against the layers (core <- models <- analysis <- adapters " \
                       "<- launchers):\n" + "\n".join(upward)


def strongly_connected(nodes, edges) -> list[list[str]]:
    """Tarjan's algorithm; the components of more than one module are the cycles."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return [c for c in components if len(c) > 1]


def test_no_import_cycles(graph):
    modules, imports = graph
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target in modules and imp.target != imp.source:
            edges.setdefault(imp.source, set()).add(imp.target)
    cycles = strongly_connected(sorted(modules), edges)
    assert not cycles, "import cycles (function-local imports included): " + "; ".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_strongly_connected_finds_a_cycle_hidden_in_a_function():
    """The check itself: a cycle through a function-local import is found."""
    assert strongly_connected(["a", "b", "c"], {"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def has_reason(lines: list[str], line: int) -> bool:
    """A comment on the import's line, or above the group of imports it belongs to."""
    if "#" in lines[line - 1]:
        return True
    above = line - 2
    while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def test_function_local_imports_say_why(graph):
    modules, imports = graph
    texts = {name: path.read_text(encoding="utf-8").splitlines() for name, path in modules.items()}
    silent = [f"{modules[imp.source].relative_to(REPO_ROOT)}:{imp.line} imports {imp.target}"
              for imp in imports if imp.local and not has_reason(texts[imp.source], imp.line)]
    assert not silent, "function-local imports without a reason (keep a framework or a heavy " \
                       "library out of a process that does not need it, and say so):\n" + \
                       "\n".join(sorted(set(silent)))


def modules_every_environment_runs(modules, imports) -> set[str]:
    """core, models, analysis and launchers, and everything the worker imports (statically)
    before it loads its adapter by name: these run in every framework's environment or in the
    launcher's, which holds no framework."""
    shared = {name for name in modules if name.split(".")[0] != "adapters"}
    edges: dict[str, set[str]] = {}
    for imp in imports:
        edges.setdefault(imp.source, set()).add(imp.target)
    pending = ["adapters.worker"]
    while pending:
        name = pending.pop()
        if name in shared or name not in modules:
            continue
        shared.add(name)
        pending.extend(edges.get(name, ()))
    return shared


def test_no_framework_where_every_environment_runs(graph):
    modules, imports = graph
    shared = modules_every_environment_runs(modules, imports)
    assert {"adapters.worker", "adapters.base", "adapters.registry", "core.envs"} <= shared
    assert not shared & {info.module for info in FRAMEWORKS.values()}
    leaks = [f"{imp.source}:{imp.line} imports {imp.target}" for imp in imports
             if imp.source in shared and imp.target.split(".")[0] in FRAMEWORKS_IMPORTED]
    assert not leaks, "a framework imported where every environment runs (a machine without " \
                      "it could not run the others):\n" + "\n".join(leaks)


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_registry_entries_point_at_what_exists(name):
    info = FRAMEWORKS[name]
    assert importlib.util.find_spec(info.module) is not None, info.module
    for env in filter(None, (info.env, info.backend_env)):
        assert (requirements_dir() / f"{env}.txt").exists(), env
    assert info.rendezvous in KINDS
    assert info.image is None or info.image in IMAGES
    assert info.modes and set(info.synchronous_modes) <= set(info.modes)
    assert set(info.server_modes) <= set(info.modes)
