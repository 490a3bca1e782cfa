"""One result record: the contract between the worker that measures and the store that keeps.

A record is a plain dict (it travels as JSON from a worker running in a framework's own
environment to the launcher's environment), so this module uses the standard library only.
`RUN_COLUMNS` lists the scalar fields, in the order the store's `runs` table keeps them; the
per-phase times travel in the list under ``"phases"`` and land in the store's long `phases`
table; ``"env"`` is a dict of environment facts stored as JSON and flattened as ``env_*``
columns when loaded; ``"extra"`` is a free dict for adapter-specific facts.
"""

from __future__ import annotations

# (name, sqlite type, meaning)
RUN_FIELDS: tuple[tuple[str, str, str], ...] = (
    # identity
    ("run_id", "TEXT", "unique id of the run inside its campaign (also the resume key)"),
    ("campaign", "TEXT", "campaign name (the --out folder's name)"),
    ("config_hash", "TEXT", "hash of every setting that changes what is measured"),
    ("framework", "TEXT", "CLI name of the adapter: torch, tf, mxnet, ..."),
    ("framework_label", "TEXT", "how tables and plots name it, e.g. 'PyTorch DDP'"),
    ("mode", "TEXT", "aggregation mode: single, ddp, collective, ps, dist_sync, ..."),
    ("synchronous", "INTEGER", "1 when every worker steps on the same weights"),
    ("model", "TEXT", "model name from models/"),
    ("params", "INTEGER", "trainable parameters"),
    ("flops", "INTEGER", "forward FLOPs per sample"),
    # topology
    ("device_kind", "TEXT", "cpu or gpu"),
    ("device_name", "TEXT", "CPU model or GPU name"),
    ("nodes", "INTEGER", "nodes (hosts)"),
    ("workers_per_node", "INTEGER", "worker processes per node"),
    ("world_size", "INTEGER", "nodes * workers_per_node"),
    ("servers", "INTEGER", "parameter servers (0 for schemes without them)"),
    ("batch_per_worker", "INTEGER", "samples per worker per iteration"),
    ("global_batch", "INTEGER", "samples per iteration over all workers"),
    ("scaling", "TEXT", "weak (fixed per-worker batch) or strong (fixed global batch)"),
    ("dtype", "TEXT", "float32, ..."),
    ("layout", "TEXT", "NCHW or NHWC"),
    ("data", "TEXT", "synthetic or files"),
    ("warmup", "INTEGER", "untimed iterations before timing"),
    ("iterations", "INTEGER", "timed iterations per repeat"),
    ("repeats", "INTEGER", "timed repeats"),
    ("threads_per_worker", "INTEGER", "intra-op CPU threads per worker"),
    ("cpu_cores", "INTEGER", "CPU cores a rank could run on (its affinity), the fewest over the run's machines"),
    ("ranks_per_host", "INTEGER", "worker processes sharing one machine (emulated nodes share the host)"),
    ("oversubscribed", "INTEGER", "1 on a CPU run whose ranks_per_host * threads_per_worker exceed cpu_cores"),
    ("load_avg_start", "REAL", "the machine's 1-minute load average when the timed loops began"),
    ("load_avg_end", "REAL", "the machine's 1-minute load average when the timed loops ended"),
    ("other_load", "REAL", "cores kept busy during the timed loops by processes other than the run's ranks"),
    ("bandwidth", "TEXT", "emulated link bandwidth, if any"),
    ("latency", "TEXT", "emulated link latency, if any"),
    # measured (throughput mode: no synchronisation beyond the framework's own)
    ("iter_time_median", "REAL", "seconds per iteration, median over repeats (slowest rank)"),
    ("iter_time_p10", "REAL", "10th percentile over repeats"),
    ("iter_time_p90", "REAL", "90th percentile over repeats"),
    ("iter_time_std", "REAL", "standard deviation over repeats"),
    ("throughput", "REAL", "samples per second over all workers"),
    ("throughput_per_worker", "REAL", "samples per second per worker"),
    ("profile_iter_time", "REAL", "seconds per profile-mode iteration with communication run the framework's "
                                  "own way (overlapped where it overlaps); the separated phases add up to more"),
    ("overlap", "REAL", "fraction of communication hidden behind backward, 0..1"),
    ("loss_first", "REAL", "loss at the first timed iteration"),
    ("loss_last", "REAL", "loss at the last timed iteration"),
    # predicted (filled by the performance model)
    ("predicted_iter_time", "REAL", "model-predicted seconds per iteration"),
    ("prediction_error", "REAL", "(predicted - measured) / measured"),
    # environment and status
    ("git_revision", "TEXT", "dlcompare git revision"),
    ("image_digest", "TEXT", "container image digest where a container ran"),
    ("status", "TEXT", "ok, failed or timeout"),
    ("error", "TEXT", "tail of the failing rank's stderr"),
    ("started_at", "TEXT", "ISO time the run started"),
    ("duration_s", "REAL", "wall time of the whole run including start-up"),
)

RUN_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in RUN_FIELDS)

# The phases of one SGD iteration, in the order the study's model adds them.
PHASES: tuple[str, ...] = ("io", "h2d", "forward", "backward", "comm", "update")

STATUSES: tuple[str, ...] = ("ok", "failed", "timeout")


def phase_entry(phase: str, measured: float | None, predicted: float | None = None) -> dict:
    """One row of the long phase table as it travels inside a record's ``"phases"`` list."""
    return {"phase": phase, "measured_s": measured, "predicted_s": predicted}


def empty_record(**identity) -> dict:
    """A record with every run column present (None), then `identity` filled in."""
    record = {name: None for name in RUN_COLUMNS}
    record.update(phases=[], env={}, extra={})
    record.update(identity)
    return record
