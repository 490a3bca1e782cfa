"""The model composing a topology it was never calibrated on, for real (slow; root: network
namespaces): CNTK-style on 2 emulated nodes x 2 workers at 100 Mbit/s, predicted from a
1 x 2 calibration (inside a node) and a 2 x 1 calibration (across the shaped link) only.
The other schemes (DDP, Horovod, MXNet dist_sync) and 2 x 4: `python -m bench.compose_emulated`.

All four ranks share this machine's 2 cores: the test compares the prediction on each run's
own measured compute (the composition of the links is what is tested), at a bandwidth low
enough that the link is most of the iteration.  The bound here (45%) catches a composition
that leaves out a link (the ring across the shaped link is about 70 ms of a 100-120 ms
iteration, so without it the error is 55% or more); on a 2-core AMD EPYC VM the composition
itself misses by 30-37% (-30.5, -32.2, -34.6 and -36.9% measured there, 2026-12-07), which a
tighter bound would fail on.  The model's 15% accuracy target needs a quiet machine and lives
in `python -m bench.compose_emulated`."""

from __future__ import annotations

import os

import pytest

from analysis import compose
from analysis.store import ResultStore
from tests.conftest import run_cli

ROOT = os.geteuid() == 0
SCHEME = "cntk-style"
BANDWIDTH = "100Mbit"
LIMIT = 0.45
CALIBRATION = ["--frameworks", SCHEME, "--max-bytes", "1M", "--repeats", "4", "--timeout", "600"]
RUN = ["--frameworks", SCHEME, "--model", "alexnet-tiny", "--batch-size", "8", "--iterations", "5", "--repeats", "3",
       "--warmup", "2", "--profile-iterations", "3", "--timeout", "600"]


def composed_campaign(out) -> list[dict]:
    """Calibrate 1 x 2 and 2 x 1, run 2 x 2; the composition's rows."""
    for topology in (["--nodes", "1", "--workers", "2"],
                     ["--cluster", "emulated", "--nodes", "2", "--workers", "1", "--bandwidth", BANDWIDTH]):
        done = run_cli("launchers.calibrate", *CALIBRATION, *topology, "--out", str(out), timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    done = run_cli("launchers.compare", *RUN, "--cluster", "emulated", "--nodes", "2", "--workers", "2",
                   "--bandwidth", BANDWIDTH, "--out", str(out), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    with ResultStore.for_campaign(out, create=False) as store:
        assert {(c.nodes, c.workers_per_node) for c in store.calibration_fits()} == {(1, 2), (2, 1)}
        return compose.composition_rows(store.records(), store.calibration_fits())


@pytest.mark.slow
@pytest.mark.skipif(not ROOT, reason="network namespaces and tc need root")
def test_two_by_two_from_intra_and_inter_node_calibrations(tmp_path):
    rows = composed_campaign(tmp_path / "compose")
    print("\n" + compose.composition_report(tmp_path / "compose"))
    assert [row["topology"] for row in rows] == ["2x2"]
    row = rows[0]
    assert row["flat_basis"] == "calibrated (other world size)"  # no 2 x 2 calibration: composed, not looked up
    if abs(row["composed_error"]) > LIMIT:
        # a shared 2-core machine moves a whole campaign by 10-20% now and then: one more campaign
        rows = composed_campaign(tmp_path / "again")
        row = rows[0]
    assert abs(row["composed_error"]) <= LIMIT, row
