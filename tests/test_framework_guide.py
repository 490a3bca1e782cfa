"""docs/adding-a-framework.md, proved: a framework that wraps CNTK-style's adapter, added as the
guide says (its catalogue entries in core/schemes.py, its registry line in adapters/registry.py,
its adapter adapters/<name>.py, its row in README.md, reusing envs/torch.txt) into a copy of the
repository and nothing else changed, joins the conformance suite by being registered, agrees with PyTorch in
`launchers.check` and runs a 1- and 2-worker campaign to a report with its label."""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import copy_of_the_repository, insert_at_table_end, run_cli

GUIDE_ADAPTER = '''"""A throw-away framework (tests/test_framework_guide.py): PyTorch compute, the whole
gradient all-reduced once after backward, as CNTK-style does."""

from adapters.cntk_style import CntkStyleTrainer


class GuideTrainer(CntkStyleTrainer):
    def describe(self):
        return {**super().describe(), "scheme": "the framework guide's example"}


TRAINERS = {"flat": GuideTrainer}
'''
# Each entry goes after the last one of its table, as the guide says.
CATALOGUE_SCHEME = '''    _framework_scheme(
        "guide", "flat", "Guide (flat)", "#2F4F4F",
        model=WHOLE_AFTER_BACKWARD, on_gpu=NCCL, transport="gloo", options=TORCH_OPTIONS, compute="pytorch"),
'''
CATALOGUE_FACTS = '''    FrameworkFacts("guide", "Guide", ("flat",), 4.5),
'''
REGISTRY_LINE = '''    FrameworkInfo("guide", "adapters.guide", "torch", "torch", imports=("torch",)),
'''
README_ROW = "| `guide` | Guide | `flat`: the whole gradient after backward, on PyTorch compute | `envs/torch.txt` |\n"
FAST = ["--iterations", "2", "--repeats", "1", "--warmup", "1", "--profile-iterations", "1",
        "--batch-size", "4"]


@pytest.mark.slow
def test_a_framework_is_four_files(tmp_path, torch_python):
    repo = copy_of_the_repository(tmp_path / "repo")
    (repo / "adapters" / "guide.py").write_text(GUIDE_ADAPTER)
    insert_at_table_end(repo / "core" / "schemes.py", CATALOGUE_SCHEME, "FRAMEWORK_SCHEMES: tuple", ")")
    insert_at_table_end(repo / "core" / "schemes.py", CATALOGUE_FACTS, "FRAMEWORKS: dict[str, FrameworkFacts]", ")}")
    insert_at_table_end(repo / "adapters" / "registry.py", REGISTRY_LINE, "FRAMEWORKS: dict", ")}")
    insert_at_table_end(repo / "README.md", README_ROW, "| name | label | modes | environment |", "\n")

    joined = run_cli("tests", "tests/test_conformance.py", "tests/test_layers.py", "-k", "guide",
                     "-m", "not slow", "-q", "-p", "no:cacheprovider", cwd=repo, timeout=300)
    assert joined.returncode == 0 and " passed" in joined.stdout, joined.stdout[-3000:] + joined.stderr[-2000:]

    checked = run_cli("launchers.check", "--frameworks", "torch,guide", "--model", "alexnet-tiny",
                      cwd=repo, timeout=600)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    assert "PASS: alexnet-tiny" in checked.stdout and "ran guide:flat" in checked.stdout

    out = tmp_path / "campaign"
    result = run_cli("launchers.compare", "--frameworks", "guide", "--model", "alexnet-tiny",
                     "--workers", "1,2", *FAST, "--out", str(out), cwd=repo, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with sqlite3.connect(out / "results.sqlite") as db:
        rows = db.execute("SELECT framework, mode, world_size, status FROM runs").fetchall()
    assert sorted(rows) == [("guide", "flat", 1, "ok"), ("guide", "flat", 2, "ok")]
    assert "Guide (flat)" in (out / "report.html").read_text()
