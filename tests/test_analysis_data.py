"""Realistic result records for the analysis tests, and a campaign folder built from them.

The other ``test_analysis_*`` modules import `make_records` / `make_campaign` from here.
The numbers are chosen so that speedup and efficiency can be checked by hand:
PyTorch DDP t(1) = 0.100 s, t(2) = 0.125 s  ->  S(2) = 2 * 0.100 / 0.125 = 1.6, E = 0.8;
MXNet dist_sync t(1) = 0.120 s, t(2) = 0.160 s  ->  S(2) = 1.5, E = 0.75.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.record import PHASES, RUN_COLUMNS, empty_record, phase_entry

BATCH = 16
MODEL = "alexnet"

# label -> (framework, mode, {world_size: iteration time median in s})
FRAMEWORKS = {
    "PyTorch DDP": ("torch", "ddp", {1: 0.100, 2: 0.125}),
    "MXNet dist_sync": ("mxnet", "dist_sync", {1: 0.120, 2: 0.160}),
}

FAILED_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "adapters/worker.py", line 88, in main\n'
    "    trainer.step()\n"
    "RuntimeError: rank 1 lost connection to parameter server <ps:0> & gave up\n"
)


def _phases(t_iter: float, world_size: int) -> list[dict]:
    """Plausible per-phase times summing to about t_iter; communication only with peers."""
    comm = 0.0 if world_size == 1 else 0.3 * t_iter
    rest = t_iter - 0.5 * comm  # half of communication hidden behind backward
    shares = {"io": 0.02, "h2d": 0.0, "forward": 0.33, "backward": 0.6, "update": 0.05}
    entries = []
    for name in PHASES:
        measured = comm if name == "comm" else rest * shares[name]
        predicted = None if measured == 0 else measured * 1.1
        entries.append(phase_entry(name, measured, predicted))
    return entries


# alexnet's layers with parameters in backward order, and the share of backward each takes
LAYER_SHARES = (("fc8", 0.05), ("fc7", 0.1), ("fc6", 0.15), ("conv5", 0.1), ("conv4", 0.15), ("conv3", 0.15),
                ("conv2", 0.2), ("conv1", 0.1))


def layer_backward(phases: list[dict]) -> list[list]:
    """The record's ``layer_backward_s``: the measured backward split over the layers."""
    backward = next(p["measured_s"] for p in phases if p["phase"] == "backward")
    return [[name, backward * share] for name, share in LAYER_SHARES]


def make_record(label: str, framework: str, mode: str, world_size: int, t_iter: float,
                campaign: str = "test-campaign", **overrides) -> dict:
    """One successful record filled with plausible numbers around median `t_iter`."""
    record = empty_record(
        run_id=f"{framework}-{mode}-{MODEL}-w{world_size}-b{BATCH}",
        campaign=campaign, config_hash=f"h{abs(hash((framework, mode, world_size))) % 10**8:08d}",
        framework=framework, framework_label=label, mode=mode, synchronous=1,
        model=MODEL, params=60_965_224, flops=727_000_000,
        device_kind="cpu", device_name="Intel Xeon Platinum 8375C", nodes=1,
        workers_per_node=world_size, world_size=world_size, batch_per_worker=BATCH,
        global_batch=BATCH * world_size, scaling="weak", dtype="float32", layout="NCHW",
        data="synthetic", warmup=5, iterations=20, repeats=5, threads_per_worker=1, cpu_cores=2,
        ranks_per_host=world_size, oversubscribed=0, load_avg_start=0.4, load_avg_end=1.2, other_load=0.05,
        iter_time_median=t_iter, iter_time_p10=t_iter * 0.95, iter_time_p90=t_iter * 1.08,
        iter_time_std=t_iter * 0.04, throughput=BATCH * world_size / t_iter,
        throughput_per_worker=BATCH / t_iter, profile_iter_time=t_iter * 1.05,
        overlap=None if world_size == 1 else 0.5, loss_first=6.91, loss_last=6.80,
        predicted_iter_time=t_iter * 1.1, prediction_error=0.1,
        git_revision="abc1234", status="ok", started_at=f"2024-05-01T10:{world_size:02d}:00",
        duration_s=42.0,
    )
    record["phases"] = _phases(t_iter, world_size)
    # env as adapters/worker.py writes it: host facts plus the adapter's library versions
    record["env"] = {"python": "3.11.9", "platform": "Linux-6.1.0-x86_64-with-glibc2.36",
                     "cpu": "Intel Xeon Platinum 8375C", "cpu_count": 2, "numpy": "2.4.6",
                     framework: "2.3.0" if framework == "torch" else "1.9.1", f"{framework}_threads": "1"}
    record["extra"] = {"threads": 1, "backend": {"name": "gloo", "bucket_mb": 25},
                       "layer_backward_s": layer_backward(record["phases"]), "layer_backward_source": "flop-share"}
    record.update(overrides)
    return record


def make_failed_record() -> dict:
    """A run that failed: identity and topology known, no measurements, an error tail."""
    return empty_record(
        run_id=f"tf-ps-{MODEL}-w2-b{BATCH}", campaign="test-campaign", framework="tf",
        framework_label="TensorFlow PS", mode="ps", synchronous=1, model=MODEL,
        device_kind="cpu", device_name="Intel Xeon Platinum 8375C", nodes=1, workers_per_node=2,
        world_size=2, batch_per_worker=BATCH, global_batch=2 * BATCH, scaling="weak",
        status="failed", error=FAILED_ERROR, started_at="2024-05-01T10:05:00", duration_s=12.5,
        env={"python": "3.11.9", "tf": "2.15.0"},
    )


def make_records() -> list[dict]:
    """Two frameworks x world sizes 1, 2 (all ok) plus one failed run."""
    records = [make_record(label, fw, mode, ws, t)
               for label, (fw, mode, times) in FRAMEWORKS.items() for ws, t in times.items()]
    return records + [make_failed_record()]


SWEEP_TOPOLOGIES = ((1, 1), (1, 2), (2, 1))  # nodes, workers per node
SWEEP_SCHEMES = (("PyTorch DDP", "torch", "ddp"), ("MXNet", "mxnet", "dist_sync"))


def sweep_time(framework: str, batch: int, world: int) -> float:
    """PyTorch DDP wins small batches, MXNet large ones; the crossover is at batch 100."""
    per_image = 0.0020 if framework == "torch" else 0.0017
    fixed = 0.010 if framework == "torch" else 0.040
    return fixed + per_image * batch + 0.004 * (world - 1)


def sweep_records(batches, topologies=SWEEP_TOPOLOGIES) -> list[dict]:
    """A sweep of both `SWEEP_SCHEMES` over per-worker batch and topology: one run per point."""
    records = []
    for batch in batches:
        for nodes, per_node in topologies:
            world = nodes * per_node
            for label, framework, mode in SWEEP_SCHEMES:
                t = sweep_time(framework, batch, world)
                run_id = f"{framework}-{mode}-n{nodes}x{per_node}-b{batch}"
                records.append(make_record(label, framework, mode, world, t, run_id=run_id, config_hash=run_id,
                                           nodes=nodes, workers_per_node=per_node, batch_per_worker=batch,
                                           global_batch=batch * world, throughput=batch * world / t,
                                           throughput_per_worker=batch / t))
    return records


# A sweep along per-worker batch, workers and link bandwidth: three schemes on five topologies,
# the two-node ones on two emulated links (21 runs per batch size).
WIDE_SCHEMES = SWEEP_SCHEMES + (("Horovod", "horovod", "gloo"),)
WIDE_TOPOLOGIES = ((1, 1, ""), (1, 2, ""), (1, 4, ""), (2, 1, "1Gbit"), (2, 1, "10Gbit"), (2, 2, "1Gbit"),
                   (2, 2, "10Gbit"))
# seconds of exposed exchange per iteration at 1 Gbit/s between nodes, per framework
WIDE_EXCHANGE_S = {"torch": 0.030, "mxnet": 0.050, "horovod": 0.020}


def wide_sweep_records(runs: int) -> list[dict]:
    """`runs` records (the first of as many batch sizes as it takes) of `WIDE_SCHEMES` on
    `WIDE_TOPOLOGIES`: DDP wins small batches on one node, MXNet large ones, Horovod small
    batches on the slow link; the model's prediction is 10 % slower than measured throughout."""
    per_batch = len(WIDE_SCHEMES) * len(WIDE_TOPOLOGIES)
    records = []
    for batch in range(2, 2 + 4 * -(-runs // per_batch), 4):
        for nodes, per_node, bandwidth in WIDE_TOPOLOGIES:
            world = nodes * per_node
            for label, framework, mode in WIDE_SCHEMES:
                t = sweep_time("mxnet" if framework == "mxnet" else "torch", batch, world)
                t += 0.001 + 0.002 * (world - 1) if framework == "horovod" else 0.0  # its negotiation per step
                if bandwidth:
                    t += WIDE_EXCHANGE_S[framework] * (1.0 if bandwidth == "1Gbit" else 0.1)
                run_id = f"{framework}-{mode}-n{nodes}x{per_node}-b{batch}{'-' + bandwidth if bandwidth else ''}"
                records.append(make_record(label, framework, mode, world, t, run_id=run_id, config_hash=run_id,
                                           nodes=nodes, workers_per_node=per_node, batch_per_worker=batch,
                                           global_batch=batch * world, throughput=batch * world / t,
                                           throughput_per_worker=batch / t, bandwidth=bandwidth or None,
                                           latency="100us" if bandwidth else None))
    return records[:runs]


def make_campaign(out_dir: Path, records: list[dict] | None = None) -> Path:
    """A campaign folder with a filled result store; returns the folder."""
    from analysis.store import ResultStore

    with ResultStore.for_campaign(out_dir) as store:
        for record in make_records() if records is None else records:
            store.add(record)
        store.set_meta("command", "python -m launchers.compare --frameworks torch,mxnet,tf")
        # as the launcher stores it: a dict already serialised to JSON text
        store.set_meta("settings", json.dumps({"workers": [1, 2], "batch": [BATCH], "timeout_s": 600}))
    return Path(out_dir)


def test_records_fill_every_run_column():
    """The helper itself: every record carries the whole contract and a valid status."""
    for record in make_records():
        assert set(RUN_COLUMNS) <= set(record)
        assert record["status"] in ("ok", "failed")
    ok = [r for r in make_records() if r["status"] == "ok"]
    assert len(ok) == 4 and all(len(r["phases"]) == len(PHASES) for r in ok)
