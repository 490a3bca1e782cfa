"""docs/adding-a-transport.md, proved: a transport that wraps `local`, written as the one file
the guide names (`launchers/cluster/<name>.py`) into a copy of the repository and nothing else
changed, is listed by --help, passes the contract's checks (tests/test_transports.py) by being
registered, shows its placement in the dry run and runs a real campaign to the end (one rank,
two timed steps: about 7 s on a 2-core CPU VM, 2026-12)."""

from __future__ import annotations

import json
import sqlite3

from tests.conftest import copy_of_the_repository, run_cli

GUIDE_TRANSPORT = '''"""A throw-away transport (tests/test_transport_guide.py): this machine, as `local`, each
process through a wrapper of its own."""

from pathlib import Path

from launchers.cluster import Transport
from launchers.cluster.local import LocalCluster


class GuideCluster(LocalCluster):
    kind = "guide"
    summary = "this machine through a wrapper (the transport guide's example)"

    identity = Transport.identity  # its runs are not local's: their hash says where they ran
    commands = Transport.commands  # the dry run shows each process as the wrapper places it

    def prepare(self, run):
        return {"cluster": self.kind}

    def wrappers(self, run):
        def wrap(spec, argv, env):
            return argv, {**env, "DLC_GUIDE_PLACED": spec.name}

        return [wrap]

    def finish(self, run):
        (Path(run.rank_dir) / "guide-finished").write_text(run.run_id)
'''
FAST = ["--frameworks", "torch", "--model", "alexnet-tiny", "--workers", "1", "--iterations", "2",
        "--repeats", "1", "--warmup", "1", "--profile-iterations", "1"]


def test_a_transport_is_one_new_file(tmp_path, torch_python):
    repo = copy_of_the_repository(tmp_path / "repo")
    added = repo / "launchers" / "cluster" / "guide.py"
    assert not added.exists()
    added.write_text(GUIDE_TRANSPORT)

    helped = run_cli("launchers.compare", "--help", cwd=repo, timeout=120)
    assert helped.returncode == 0 and "guide (this machine through a wrapper" in " ".join(helped.stdout.split())
    checked = run_cli("tests", "tests/test_transports.py", "-k", "guide", "-q", "-p", "no:cacheprovider",
                      cwd=repo, timeout=300)
    assert checked.returncode == 0 and " passed" in checked.stdout, checked.stdout[-3000:] + checked.stderr[-2000:]

    out = tmp_path / "campaign"
    planned = run_cli("launchers.compare", "--cluster", "guide", *FAST, "--out", str(out), "--dry-run",
                      cwd=repo, timeout=120)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "DLC_GUIDE_PLACED=worker0" in planned.stderr and not out.exists()

    result = run_cli("launchers.compare", "--cluster", "guide", *FAST, "--out", str(out), cwd=repo, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with sqlite3.connect(out / "results.sqlite") as db:
        (run_id, status, extra), = db.execute("SELECT run_id, status, extra_json FROM runs")
    assert status == "ok" and json.loads(extra)["cluster"] == "guide"
    assert (out / "runs" / run_id / "guide-finished").read_text() == run_id  # finish ran
    assert (out / "report.html").exists()
