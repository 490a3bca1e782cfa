"""`python -m launchers.check`, as a user runs it: bad input, and a real disagreement failing.
Every framework agreeing on every tiny model is in tests/test_conformance.py."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli


def assert_one_line_error(result, needle: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("dlcompare: error:"), result.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args,needle", [
    (["--frameworks", "torch,caffe3", "--model", "alexnet-tiny"], "caffe3"),
    (["--frameworks", "torch,tf:nope", "--model", "alexnet-tiny"], "nope"),
    (["--frameworks", "torch", "--model", "alexnet-tiny"], "at least two"),
    (["--frameworks", "torch,tf", "--model", "vgg99"], "vgg99"),
    (["--frameworks", "torch,tf", "--model", "alexnet-tiny", "--batch-size", "0"], "--batch-size"),
    (["--frameworks", "torch,tf", "--model", "alexnet-tiny", "--tolerance", "-1"],
     "--tolerance"),
    (["--frameworks", "torch,tf"], "--model"),
    (["--model", "alexnet-tiny", "--frobnicate"], "--frobnicate"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    assert_one_line_error(run_cli("launchers.check", *args, timeout=120), needle)


@pytest.mark.slow
def test_a_real_disagreement_fails(torch_python, tf_python):
    """A limit no two float32 implementations meet: the command must say FAIL and exit 1."""
    result = run_cli("launchers.check", "--frameworks", "torch,tf", "--model", "alexnet-tiny",
                     "--tolerance", "1e-30")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "FAIL" in result.stdout
