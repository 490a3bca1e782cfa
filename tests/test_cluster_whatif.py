"""A described GPU cluster: its TOML file, the study's schemes on it, the FLOP-based compute,
the what-if's rows, JSON lines and bad input; the scheme palette; composing a topology from
two link calibrations (by hand)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adapters.registry import FRAMEWORKS
from analysis import cluster, compose, palette, predict, published, whatif
from core import schemes as catalogue
from analysis import perfmodel as pm
from analysis.calibration import CalibrationFit
from analysis.workload import flops_per_sample, flops_profile
from models import get_model
from tests.conftest import run_cli
from tests.test_predict import whatif_campaign

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cluster.toml"
MODEL = "alexnet-tiny"

SMALL = """
[device]
name = "Test GPU"
peak_flops = "10 TFLOP/s"
efficiency = 0.5
memory_bandwidth = "100 GB/s"
host_to_device = "10 GB/s"
[nodes]
count = 2
workers_per_node = 1
[intra_node]
bandwidth = "10 GB/s"
latency = "1us"
[inter_node]
bandwidth = "1 GB/s"
latency = "10us"
[transport.nccl]
alpha = "5us"
[workload]
model = "alexnet-tiny"
batch_per_worker = 16
"""


def write(tmp_path, text: str, name: str = "cluster.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the file

def test_example_file_reads_with_its_units():
    spec = cluster.load_cluster(EXAMPLE)
    assert (spec.nodes, spec.workers_per_node) == (4, 4)
    assert spec.device.peak_flops == pytest.approx(11.8e12) and spec.device.efficiency == 0.4
    assert spec.intra.bandwidth == pytest.approx(12e9) and spec.intra.latency == pytest.approx(5e-6)
    assert spec.inter.bandwidth == pytest.approx(7e9) and spec.inter.latency == pytest.approx(2e-6)
    grpc = spec.transport("grpc")
    assert grpc.alpha == pytest.approx(100e-6) and (grpc.beta, grpc.efficiency) == (0.0, 0.7)
    assert spec.transport("gloo") == cluster.Transport()  # not described: no software cost
    assert spec.contention == (0.0, 0.0) and (spec.model, spec.batch_per_worker) == ("resnet50", 32)
    fabric = spec.fabric("grpc", bandwidth=1.25e9)
    assert fabric.inter.beta == pytest.approx(1 / 1.25e9) and fabric.inter.alpha == pytest.approx(2e-6)
    assert fabric.efficiency == 0.7 and fabric.gamma == pytest.approx(3 / 346e9)


@pytest.mark.parametrize("change,needle", [
    (("[device]", "[device]\ncolour = \"green\""), "unknown key device.colour"),
    (("[nodes]", "[switch]\nports = 4\n[nodes]"), "unknown section [switch]"),
    (("[inter_node]\nbandwidth = \"1 GB/s\"\nlatency = \"10us\"", ""), "missing section [inter_node]"),
    (("count = 2\n", ""), "missing nodes.count"),
    (("\"1 GB/s\"", "\"1 GHz\""), "inter_node.bandwidth: cannot read bandwidth"),
    (("\"1 GB/s\"", "1000000000"), "inter_node.bandwidth needs a unit"),
    (("\"10 TFLOP/s\"", "\"10 T\""), "device.peak_flops: cannot read compute rate"),
    (("efficiency = 0.5", "efficiency = 1.5"), "device.efficiency must be a number in (0, 1]"),
    (("count = 2", "count = 0"), "nodes.count must be a whole number >= 1"),
    (("[transport.nccl]", "[transport.rdma]"), "unknown transport [transport.rdma]"),
    (("alpha = \"5us\"", "alpha = \"5us\"\nspeed = 3"), "unknown key transport.speed"),
    (("host_to_device = \"10 GB/s\"\n", ""), "missing device.host_to_device (or give device.profile)"),
    (("[device]", "[device"), "not valid TOML"),
    (("efficiency = 0.5", "efficiency = 0.5\njitter = 1.0"), "device.jitter must be a number in [0, 1)"),
    (("batch_per_worker = 16", "batch_per_worker = 16\nprecision = \"fp16\""),
     "workload.precision = 'fp16' needs device.peak_flops_fp16"),
    (("batch_per_worker = 16", "batch_per_worker = 16\nprecision = \"fp64\""), "workload.precision must be one of"),
    (("[workload]", "[parameter_servers]\nplacement = \"rack\"\n[workload]"),
     "parameter_servers.placement must be one of colocated, dedicated, host"),
    (("[workload]", "[parameter_servers]\nplacement = \"host\"\n[workload]"),
     "placement = 'host' needs parameter_servers.memory_bandwidth"),
    (("alpha = \"5us\"", "alpha = \"5us\"\npipelined = 1"), "transport.pipelined must be true or false"),
])
def test_malformed_files_are_one_line_errors(tmp_path, change, needle):
    path = write(tmp_path, SMALL.replace(*change, 1))
    with pytest.raises(cluster.ClusterError) as error:
        cluster.load_cluster(path)
    message = str(error.value)
    assert len(message.splitlines()) == 1 and needle in message and str(path) in message, message


def test_cli_bad_cluster_input_exits_2_with_one_line(tmp_path, capsys):
    bad = write(tmp_path, SMALL.replace("[device]", "[device]\ncolour = \"green\""))
    for argv, needle in (([str(bad)], "unknown key device.colour"),
                         ([str(tmp_path / "none.toml")], "cannot read cluster file"),
                         ([str(EXAMPLE), "--frameworks", "torch:fsdp9"], "unknown mode 'fsdp9' for torch"),
                         ([str(EXAMPLE), "--model", "vgg99"], "vgg99"),
                         ([str(write(tmp_path, SMALL.replace("batch_per_worker = 16\n", ""), "b.toml"))],
                          "--batch-size")):
        assert predict.main(["--cluster-file", *argv, "--no-files"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
    with pytest.raises(SystemExit) as exited:  # neither --from nor --cluster-file: argparse's usage error
        predict.main(["--no-files"])
    assert exited.value.code == 2 and "--from" in capsys.readouterr().err


def test_cli_names_the_bad_key_of_the_new_terms(tmp_path):
    """A precision the device has no peak for, a jitter outside [0, 1), an unknown placement:
    one line naming the key and exit code 2, through the command a user runs."""
    for change, needle in (
            (("batch_per_worker = 16", "batch_per_worker = 16\nprecision = \"bf16\""), "device.peak_flops_bf16"),
            (("efficiency = 0.5", "efficiency = 0.5\njitter = -0.1"), "device.jitter"),
            (("[workload]", "[parameter_servers]\nplacement = \"cloud\"\n[workload]"),
             "parameter_servers.placement")):
        path = write(tmp_path, SMALL.replace(*change, 1), f"bad{len(needle)}.toml")
        result = run_cli("launchers.cli", "predict", "--cluster-file", str(path), "--json", timeout=120)
        assert result.returncode == 2, (result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dlcompare: error:") and needle in lines[0], result.stderr


def test_the_new_keys_read_with_their_units(tmp_path):
    text = SMALL.replace("efficiency = 0.5", "efficiency = 0.5\njitter = 0.02\npeak_flops_fp16 = \"40 TFLOP/s\"") \
        .replace("workers_per_node = 1", "workers_per_node = 1\nhost_bandwidth = \"20 GB/s\"") \
        .replace("alpha = \"5us\"", "alpha = \"5us\"\ncoordination = \"3us\"\npipelined = true") \
        .replace("batch_per_worker = 16", "batch_per_worker = 16\nprecision = \"fp16\"\n"
                                          "gradient_precision = \"fp16\"\ndata = \"synthetic\"") \
        + "[parameter_servers]\nplacement = \"host\"\nmemory_bandwidth = \"60 GB/s\"\n"
    spec = cluster.load_cluster(write(tmp_path, text))
    assert spec.device.peak == pytest.approx(40e12) and spec.device.sustained_flops == pytest.approx(20e12)
    assert (spec.gradient_bytes, spec.data, spec.placement) == (2, "synthetic", "host")
    assert spec.node_effects() == pm.NodeEffects(0.02, 10e9, 20e9)
    fabric = spec.fabric("nccl")
    assert fabric.coordination == pytest.approx(3e-6) and fabric.pipelined
    assert fabric.host_link.beta == pytest.approx(1 / 20e9) and fabric.device_link.beta == pytest.approx(1 / 10e9)
    assert fabric.server_gamma == pytest.approx(3 / 60e9)


# --------------------------------------------------------------------------- compute and rows

def test_compute_from_flops_by_hand():
    """alexnet-tiny, batch 16, 5 TFLOP/s sustained: forward 16 x 7,270,982 FLOPs; update 20
    bytes per parameter (141,818) at 100 GB/s; the batch's 16 x 4 x C H W bytes at 10 GB/s."""
    spec = get_model(MODEL)
    prof = flops_profile(MODEL, 16, 5e12, 10e9, 100e9)
    forward, backward = flops_per_sample(MODEL)
    assert forward == spec.total_flops == 7_270_982
    assert prof.forward == pytest.approx(16 * 7_270_982 / 5e12)
    # backward: 2 x the forward FLOPs of layers with parameters, 1 x for the first and the others
    assert prof.backward == pytest.approx(16 * backward / 5e12) and 1.3 < backward / forward < 2.0
    assert prof.update == pytest.approx(20 * 141_818 / 100e9)
    assert prof.h2d == pytest.approx(16 * 4 * math.prod(spec.input_shape) / 10e9)
    assert prof.io == 0.0 and prof.prefetch
    assert len(prof.grads) == len(spec.parameter_shapes()) and prof.grads[-1].ready == pytest.approx(prof.backward)
    # the inverse: the efficiency at which the model's iteration matches a measured throughput
    t_one = pm.single_worker_prediction(prof).iter_time
    efficiency = cluster.efficiency_for_throughput(16 / t_one, 16, (forward, backward), 10e12,
                                                   prof.h2d + prof.update)
    assert efficiency == pytest.approx(0.5)


def rows_of(argv: list[str], capsys) -> list[dict]:
    assert predict.main(argv + ["--json"]) == 0
    out = capsys.readouterr().out
    return [json.loads(line) for line in out.splitlines()]


def test_cluster_rows_by_hand(tmp_path, capsys):
    """CNTK-style on 2 nodes x 1 worker: the whole gradient n after backward, ring over the
    NIC: 2 (10 us + 5 us nccl) + n x 1 ns/B + n/2 x 3 / 100 GB/s."""
    path = write(tmp_path, SMALL)
    rows = rows_of(["--cluster-file", str(path), "--frameworks", "cntk-style", "--nodes", "1,2"], capsys)
    assert [r["nodes"] for r in rows] == [1, 2] and set(rows[0]) >= set(whatif.ROW_KEYS)
    n = 4 * get_model(MODEL).total_params
    t_one = pm.single_worker_prediction(flops_profile(MODEL, 16, 5e12, 10e9, 100e9)).iter_time
    t_c = 2 * 15e-6 + n * 1e-9 + n / 2 * 3 / 100e9
    assert rows[0]["iter_time_s"] == pytest.approx(t_one) and rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["iter_time_s"] == pytest.approx(t_one + t_c)
    assert rows[1]["comm_exposed_s"] == pytest.approx(t_c)
    assert rows[1]["speedup"] == pytest.approx(2 * t_one / (t_one + t_c))
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["speedup"] / 2)
    assert rows[1]["bottleneck"] == "NIC" and rows[1]["batch_per_worker"] == 16
    assert (rows[1]["bandwidth"], rows[1]["latency"]) == ("8Gbit", "10us")


def test_node_effects_in_the_rows_by_hand(tmp_path, capsys):
    """CNTK-style on 1 node x 4 workers, jitter 0.05, the 4 workers' 10 GB/s copies over one
    20 GB/s host link: compute x (1 + 0.05 e_4), the copy x 2, then the whole gradient's ring
    over the intra-node link: 6 (1 us + 5 us) + 1.5 n x 0.1 ns/B + 0.75 n x 3 / 100 GB/s."""
    text = SMALL.replace("efficiency = 0.5", "efficiency = 0.5\njitter = 0.05") \
        .replace("workers_per_node = 1", "workers_per_node = 4\nhost_bandwidth = \"20 GB/s\"")
    rows = rows_of(["--cluster-file", str(write(tmp_path, text)), "--frameworks", "cntk-style", "--nodes", "1",
                    "--workers", "1,4"], capsys)
    prof = flops_profile(MODEL, 16, 5e12, 10e9, 100e9)
    t_one = pm.single_worker_prediction(prof).iter_time
    stretch = 1 + 0.05 * pm.expected_max_standard_normal(4)
    n = 4 * get_model(MODEL).total_params
    t_c = 6 * 6e-6 + 1.5 * n * 0.1e-9 + 0.75 * n * 3 / 100e9
    expected = 2 * prof.h2d + (prof.forward + prof.backward) * stretch + t_c + prof.update
    assert rows[0]["iter_time_s"] == pytest.approx(t_one)
    assert rows[1]["iter_time_s"] == pytest.approx(expected)
    assert rows[1]["efficiency"] == pytest.approx(t_one / expected)
    assert rows[1]["bottleneck"] == "host link"  # alexnet-tiny's copy outweighs its compute


def test_every_study_scheme_on_the_example_and_its_sweeps(capsys, tmp_path):
    rows = rows_of(["--cluster-file", str(EXAMPLE), "--nodes", "1,2,4", "--bandwidth", "10Gbit,56Gbit",
                    "--workers", "2,4"], capsys)
    assert {r["scheme"] for r in rows} == set(whatif.STUDY_SCHEMES)
    assert len(rows) == len(whatif.STUDY_SCHEMES) * 3 * 2 * 2
    for row in rows:
        assert 0 < row["efficiency"] <= 1 + 1e-9
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["world_size"])
        assert row["bottleneck"] in whatif.BOTTLENECK_MARKERS
    for scheme in whatif.STUDY_SCHEMES:  # a faster NIC is never worse ...
        # ... except by a hair for Horovod's cycles: a slower link fuses more per cycle (fewer
        # messages), which on 2 nodes can hide 0.1 % more (0.9963 at 10 Gbit/s, 0.9951 at 56)
        slack = 0.005 if scheme.startswith("horovod") else 1e-12
        for nodes in (2, 4):
            slow, fast = (next(r for r in rows if r["scheme"] == scheme and r["nodes"] == nodes
                               and r["workers_per_node"] == 4 and r["bandwidth"] == bw) for bw in ("10Gbit", "56Gbit"))
            assert fast["efficiency"] >= slow["efficiency"] - slack, scheme
    # the same cluster, files written: PNG with the report's helpers, the table with its code
    _, written = predict.run(predict.build_parser().parse_args(
        ["--cluster-file", str(EXAMPLE), "--nodes", "1,2", "--out", str(tmp_path / "w")]))
    assert written["png"].read_bytes()[:4] == b"\x89PNG" and "| torch:ddp" in written["md"].read_text()


def test_profile_from_a_stored_campaign(tmp_path, capsys):
    campaign = whatif_campaign(tmp_path)
    path = write(tmp_path, SMALL.replace('[device]\nname = "Test GPU"',
                                         f'[device]\nname = "this VM"\nprofile = "{campaign.name}"'), "p.toml")
    rows = rows_of(["--cluster-file", str(path), "--frameworks", "torch", "--nodes", "1"], capsys)
    assert rows[0]["profile"] == "profile PyTorch DDP b16" and rows[0]["t1_s"] == pytest.approx(0.063)


def test_profile_jitter_comes_from_the_runs_repeats(tmp_path, capsys):
    """The one-worker run's repeats spread 4 % over 20 steps each: 0.04 x sqrt(20) per step;
    a file's own device.jitter replaces it."""
    assert predict.measured_jitter({"iter_time_std": 0.004, "iter_time_median": 0.1, "iterations": 20}) == \
        pytest.approx(0.04 * math.sqrt(20))
    assert predict.measured_jitter({"iter_time_std": None, "iter_time_median": 0.1, "iterations": 20}) is None
    campaign = whatif_campaign(tmp_path)
    measured, stated = (write(tmp_path, SMALL.replace('[device]\nname = "Test GPU"',
                                                     f'[device]\nname = "this VM"\nprofile = "{campaign.name}"{extra}'),
                              f"p{i}.toml") for i, extra in enumerate(("", "\njitter = 0.0")))
    argv = ["--frameworks", "torch", "--nodes", "2"]
    with_jitter, without = (rows_of(["--cluster-file", str(path), *argv], capsys)[0] for path in (measured, stated))
    stretch = 1 + 0.04 * math.sqrt(20) * pm.expected_max_standard_normal(2)
    assert with_jitter["iter_time_s"] > without["iter_time_s"] * (1 + 0.5 * (stretch - 1))


def test_cluster_cli_runs_as_a_user_runs_it():
    result = run_cli("analysis.predict", "--cluster-file", str(EXAMPLE), "--json", "--frameworks", "horovod,tf:ps",
                     timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["scheme"], r["nodes"], r["workers_per_node"]) for r in rows] == [("horovod:gloo", 4, 4), ("tf:ps", 4, 4)]


def test_scheme_names_come_from_the_catalogue():
    assert whatif.scheme_names(["torch", "Horovod:gloo", "mgwfbp", "jax", "cntk"]) == [
        "torch:ddp", "horovod:gloo", "mgwfbp", "jax:allreduce", "cntk:mpi"]
    assert whatif.scheme_names(["all"]) == [*whatif.STUDY_SCHEMES, *whatif.CATALOGUE]
    for bad, needle in (("torch:fsdp9", "unknown mode 'fsdp9'"), ("tf:ps-async", "asynchronous"),
                        ("mxnet:local", "no term for it")):
        with pytest.raises(whatif.WhatIfError, match=needle):
            whatif.scheme_names([bad])
    # every synchronous framework scheme the model prices and that spans nodes is offered
    # (of modes alike on GPUs, one), among them JAX and real CNTK
    offered = {catalogue.SCHEMES[name].framework for name in whatif.STUDY_SCHEMES}
    assert offered == set(FRAMEWORKS)
    for name in whatif.STUDY_SCHEMES:
        info = catalogue.SCHEMES[name]
        assert info.mode in FRAMEWORKS[info.framework].modes and info.modelled and not info.one_process


def test_palette_is_fixed_per_scheme():
    assert palette.colour("torch:ddp") == palette.colour("torch") == palette.SCHEME_COLOURS["torch:ddp"]
    assert palette.colour("Horovod:gloo") == palette.colour("horovod") == palette.SCHEME_COLOURS["horovod:gloo"]
    assert palette.colour("jax") == palette.SCHEME_COLOURS["jax:allreduce"] and palette.colour("wfbp") == "#C8B400"
    assert palette.colour("not-a-scheme") == palette.fallback_colour("not-a-scheme")
    shown = [*whatif.STUDY_SCHEMES, *whatif.CATALOGUE]
    assert len({palette.colour(name) for name in shown}) == len(shown)  # no two alike
    for name, info in FRAMEWORKS.items():  # a framework's name alone: its first mode's colour
        assert palette.colour(name) == palette.colour(f"{name}:{info.modes[0]}"), name


# --------------------------------------------------------------------------- composing

def fit(framework, nodes, per_node, a, b, algorithm="ring", servers=0, bandwidth="") -> CalibrationFit:
    p = nodes * per_node
    link = pm.invert_fit(a, b, algorithm, p, max(1, servers))
    return CalibrationFit(framework, "m", "gloo", "allreduce", algorithm, "cpu", nodes, per_node, p, servers,
                          a, b, 0.01, link.alpha, link.beta, 0.0, 10, 5, bandwidth)


def test_composing_a_ring_from_two_link_fits():
    """Ring fits: 1 x 2: a = 2 alpha_i = 100 us, b = beta_i = 1 ns/B; 2 x 1: a = 400 us,
    b = 80 ns/B.  On 2 x 4 (p = 8): 14 steps of max(50, 200) us and 7/4 n at 80 ns/B."""
    fits = compose.LinkFits(fit("torch", 1, 2, 100e-6, 1e-9), fit("torch", 2, 1, 400e-6, 80e-9, bandwidth="100Mbit"))
    fabric = compose.composed_fabric(fits)
    assert fabric.intra.alpha == pytest.approx(50e-6) and fabric.intra.beta == pytest.approx(1e-9)
    assert fabric.inter.alpha == pytest.approx(200e-6) and fabric.inter.beta == pytest.approx(80e-9, rel=1e-5)
    record = {"nodes": 2, "workers_per_node": 4, "servers": 0}
    cost = compose.composed_cost(record, pm.Scheme(), fits)
    assert cost(1e6) == pytest.approx(14 * 200e-6 + 1.75 * 1e6 * 80e-9, rel=1e-5)
    found = compose.link_fits([fits.intra, fits.inter, fit("other", 2, 1, 1, 1)],
                              {"framework": "torch", "mode": "m", "device_kind": "cpu", "bandwidth": "100Mbit"})
    assert found == fits


def test_composing_a_parameter_server_moves_the_local_share_off_the_nic():
    """One server, ps fits.  1 x 2: a = 2 alpha_i, b = 2 max(2/1, 1) beta_i = 4 beta_i.  2 x 1
    (the server on node 0): node 1's worker sends n through the NIC, node 0's stays inside, so
    b = 2 max(1 x beta_i, 1 x beta_e): beta_e = b / 2, where the flat inversion reads b / 4."""
    intra, inter = fit("mxnet", 1, 2, 1e-3, 4e-9, "ps", 1), fit("mxnet", 2, 1, 2e-3, 160e-9, "ps", 1)
    assert inter.beta_s_per_byte == pytest.approx(40e-9)  # flat: 2 max(p/S, 1) = 4
    fabric = compose.composed_fabric(compose.LinkFits(intra, inter))
    assert fabric.intra.beta == pytest.approx(1e-9) and fabric.inter.beta == pytest.approx(80e-9, rel=1e-5)
    assert fabric.inter.alpha == pytest.approx(1e-3)
    # 2 x 4 with one server: node 0 receives 4 n, node 1 sends 4 n: 2 (1 ms + 4 n x 80 ns/B)
    cost = compose.composed_cost({"nodes": 2, "workers_per_node": 4, "servers": 1},
                                 pm.Scheme(algorithm="ps", servers=1), compose.LinkFits(intra, inter))
    assert cost(1e6) == pytest.approx(2 * (1e-3 + 4 * 1e6 * 80e-9), rel=1e-5)


def test_compute_factor_is_processor_sharing():
    one = {"threads_per_worker": 2, "env": {"cpu_count": 2}}
    assert compose.compute_factor({"threads_per_worker": 1, "world_size": 4, "env": {"cpu_count": 2}}, one) == 4
    assert compose.compute_factor({"threads_per_worker": 1, "world_size": 8, "env": {"cpu_count": 2}}, one) == 8
    assert compose.compute_factor({"threads_per_worker": 1, "world_size": 2, "env": {"cpu_count": 2}}, one) == 2


def test_every_key_is_documented():
    text = (REPO / "docs" / "prediction.md").read_text(encoding="utf-8")
    for section, keys in cluster.SCHEMA.items():
        shown = "transport.<name>" if section == "transport" else section
        for key in keys:
            assert f"| `{shown}` | `{key}` |" in text, f"{section}.{key}"


# --------------------------------------------------------------------------- published

# the CI's bounds on the published validation (python -m bench.published_validation holds the
# targets: median <= 3 points, every point within 10).  The median is the 5; no honest
# model of these files holds every point within 15 (docs/prediction.md, "Checked against
# published results": 8 points beyond 10, the worst Lambda's FP16 at 4 GPUs, +34), so the
# largest error is held where it is, to catch a regression, not to claim the target.
CI_MEDIAN_POINTS = 5.0
CI_MAX_POINTS = 35.0


def test_published_cases_are_data_with_their_citations():
    """Every case names a source with its citation and a cluster of spec-sheet values; the
    model predicts each point (validation/published.toml; the comparison:
    python -m bench.published_validation)."""
    sources, cases = published.load_cases()
    assert len(sources) >= 5 and all({"title", "authors", "year", "where", "read"} <= set(s) for s in sources.values())
    assert {case.source for case in cases} == set(sources)
    rows = published.validation_rows()
    assert len(rows) >= 50 and len(rows) == sum(len(case.topologies) for case in cases)
    for row in rows:
        assert 0 < row["published"] <= 1 and 0 < row["predicted"] <= 1 and 0 < row["flat"] <= 1
        assert 0 < row["device_efficiency"] < 1
    # what the file must exercise: fused all-reduces at 16+ GPUs, parameter servers (on the
    # host CPU too), 10 Gbit/s Ethernet, reduced precision
    assert any(r["scheme"].startswith(("horovod", "torch:ddp")) and _gpus(r) >= 16 for r in rows)
    assert {case.cluster.placement for case in cases if case.scheme == "tf:ps"} >= {"host", "colocated"}
    assert any(case.cluster.inter.bandwidth <= 1.25e9 and case.cluster.nodes > 1 for case in cases)
    assert {r["precision"] for r in rows} >= {"fp32", "tf32", "fp16"}
    # the model's terms bring it closer than the model without them, and than one flat link
    model = published.median_abs_points(rows, "error_points")
    assert model < published.median_abs_points(rows, "without_error_points") < \
        published.median_abs_points(rows, "flat_error_points")
    assert model <= CI_MEDIAN_POINTS and published.max_abs_points(rows, "error_points") <= CI_MAX_POINTS
    summary = published.summary(rows)
    assert summary[-1]["source"] == "all sources" and summary[-1]["points"] == len(rows)


def _gpus(row: dict) -> int:
    nodes, per_node = row["topology"].split("x")
    return int(nodes) * int(per_node)


def test_every_published_case_beyond_ten_points_is_named_in_the_docs():
    """A point the model misses by more than 10 is listed with its reason in docs/prediction.md."""
    text = (REPO / "docs" / "prediction.md").read_text(encoding="utf-8")
    for row in published.validation_rows():
        if abs(row["error_points"]) > 10:
            assert f"{row['error_points']:+.1f}" in text, row


def test_bad_published_files_are_one_line_errors(tmp_path):
    good = (REPO / "validation" / "published.toml").read_text(encoding="utf-8")
    for change, needle in (
            (('one_worker = { images_per_s = 219,', 'one_worker = { images_per_s = 2190,'), "x the device's peak"),
            (('scheme = "tf:collective"', 'scheme = "tf:zero"'), "unknown mode 'zero'"),
            (('workload = { precision = "tf32" }', 'workload = { precision = "fp8" }'), "workload.precision"),
            ((', from = "alpha: an assumption', ', origin = "alpha: an assumption'), "needs 'from'")):
        path = write(tmp_path, good.replace(*change, 1), "bad.toml")
        with pytest.raises(published.PublishedError) as error:
            published.load_cases(path)
        assert len(str(error.value).splitlines()) == 1 and needle in str(error.value), str(error.value)
