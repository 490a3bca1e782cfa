"""A campaign's plan: frameworks x models x topologies x batch sizes, expanded into runs.

Validation lives here so every bad input becomes one `UsageError` with a one-line message
before anything starts or anything stored is touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from adapters.base import RunConfig
from adapters.registry import FrameworkInfo, UnknownFramework, parse_framework_mode
from analysis.units import parse_bandwidth, parse_latency
from core.cli import DEFAULT_LAUNCHES, comma_list
from core import schemes as catalogue
from launchers.cluster import DEFAULT_TRANSPORT, Transport, TransportError, transport_for
from models import MODEL_NAMES, get_model, model_facts

# Precisions a campaign may ask for (--dtype): float32 (on a GPU without TF32 math), tf32
# (float32 storage, TF32 tensor-core math), bfloat16 (mixed precision: bfloat16 compute,
# float32 weights). An adapter that cannot run one reports the run as unavailable.
DTYPES = ("float32", "tf32", "bfloat16")

class UsageError(ValueError):
    """Bad input; main() prints it as one line and exits with code 2."""


def positive_ints(text: str, what: str) -> list[int]:
    items = comma_list(text, what, UsageError)
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise UsageError(f"{what} must be whole numbers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise UsageError(f"{what} must be at least 1, got {text!r}")
    return sorted(set(values))


def launch_count(value) -> int:
    """--launches / ``launches:``: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"--launches must be a whole number of at least 1, got {value!r}")
    return value


def positive_seconds(value: float, what: str) -> float:
    """A duration flag: a finite number above 0 (NaN compares false with everything and an
    infinite timeout is no timeout: either would let a hung rank hang the campaign forever)."""
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{what} must be a positive, finite number of seconds, got {value}")
    return value


def gpu_count() -> int:
    """GPUs on this machine per nvidia-smi (0 without a driver); no framework needed."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def resolve_device(asked: str, gpus: int) -> str:
    if asked == "auto":
        return "gpu" if gpus > 0 else "cpu"
    if asked == "gpu" and gpus == 0:
        raise UsageError("--device gpu asked, but nvidia-smi finds no GPU on this machine")
    return asked


def default_workers(device: str, gpus: int) -> list[int]:
    """1, 2, 4 ... up to the GPUs present; on a CPU 1 and 2 processes."""
    if device == "cpu":
        return [1, 2]
    counts, n = [], 1
    while n <= gpus:
        counts.append(n)
        n *= 2
    return counts


def default_batch(model: str, device: str) -> int:
    """The per-worker batch when --batch-size is not given (the model catalogue's)."""
    return model_facts(model).default_batch[device]


def parse_batch_sizes(text: str | None, models: list[str]) -> list[int] | dict[str, list[int]] | None:
    """--batch-size: a comma list for every model ('32,64'), or per model
    ('alexnet=1024,googlenet=128'; a model not named keeps its default); None when not given."""
    if text is None:
        return None
    entries = comma_list(text, "--batch-size", UsageError)
    if not any("=" in entry for entry in entries):
        return positive_ints(text, "--batch-size")
    per_model: dict[str, list[int]] = {}
    for entry in entries:
        model, sep, number = entry.partition("=")
        if not sep:
            raise UsageError(f"--batch-size mixes a plain {entry!r} with MODEL=N entries: give "
                             "one list for every model, or MODEL=N for each")
        if model.strip() not in models:
            raise UsageError(f"--batch-size names {model.strip()!r}, which --model does not run")
        per_model.setdefault(model.strip(), []).extend(
            positive_ints(number, f"--batch-size {model.strip()}"))
    return {model: sorted(set(values)) for model, values in per_model.items()}


def parse_options(items: list[str] | None) -> dict:
    """--option KEY=VALUE (repeatable, or a comma list): adapter options for every run, the
    value read as JSON where it is JSON (true, 25, 0.5), else as text."""
    options = {}
    for item in (part for text in items or () for part in comma_list(text, "--option", UsageError)):
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise UsageError(f"--option takes KEY=VALUE, got {item!r}")
        if key.strip() not in catalogue.OPTIONS:
            raise UsageError(f"--option: unknown key {key.strip()!r} (known: "
                             f"{', '.join(sorted(catalogue.OPTIONS))}; the layout is --channels-last)")
        try:
            options[key.strip()] = json.loads(value.strip())
        except json.JSONDecodeError:
            options[key.strip()] = value.strip()
    return options


def parse_dtype(text: str | None) -> str:
    dtype = (text or "float32").strip()
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return dtype


def parse_frameworks(text: str) -> list[tuple[FrameworkInfo, str]]:
    entries = comma_list(text, "--frameworks", UsageError)
    try:
        return list(dict.fromkeys(parse_framework_mode(part) for part in entries))
    except UnknownFramework as error:
        raise UsageError(str(error)) from None


def parse_models(text: str) -> list[str]:
    names = comma_list(text, "--model", UsageError)
    for name in names:
        if name not in MODEL_NAMES:
            raise UsageError(f"unknown model {name!r} (known: {', '.join(MODEL_NAMES)})")
    return names


def parse_fault(text: str | None) -> dict | None:
    """'crash:RANK[:STEP]' or 'hang:RANK[:STEP]' (test-only)."""
    if not text:
        return None
    parts = text.split(":")
    if parts[0] not in ("crash", "hang") or len(parts) > 3:
        raise UsageError(f"--inject-fault takes crash:RANK[:STEP] or hang:RANK[:STEP], got {text!r}")
    try:
        rank = int(parts[1]) if len(parts) > 1 else 0
        step = int(parts[2]) if len(parts) > 2 else 1
    except ValueError:
        raise UsageError(f"--inject-fault rank and step must be numbers, got {text!r}") from None
    return {"kind": parts[0], "rank": rank, "at": step}


@dataclass
class Campaign:
    """Resolved settings of one campaign, every default filled in (the plan prints them)."""

    frameworks: list[tuple[FrameworkInfo, str]]
    models: list[str]
    workers: list[int]
    nodes: list[int]
    servers: list[int]
    # a list for every model, a list per model (others: the default), or None: default_batch
    batch_sizes: list[int] | dict[str, list[int]] | None
    iterations: int
    warmup: int
    repeats: int
    profile_iterations: int
    data: str
    device: str
    out: Path
    timeout: float
    channels_last: bool
    dropout: bool
    seed: int
    loader_workers: int
    fault: dict | None = None
    git_revision: str = ""
    runtime: str = "local"  # local: the framework's virtualenv; container: its image
    cluster: str = DEFAULT_TRANSPORT  # --cluster: a transport of launchers/cluster/
    bandwidths: list[str | None] = field(default_factory=lambda: [None])  # emulated links
    latencies: list[str | None] = field(default_factory=lambda: [None])
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    dtype: str = "float32"  # DTYPES
    options: dict = field(default_factory=dict)  # --option: catalogue.OPTIONS for every run
    python: dict[str, str] = field(default_factory=dict)  # framework -> interpreter (--python)
    # separate launches of every configuration, run in interleaved rounds (`in_rounds`)
    launches: int = DEFAULT_LAUNCHES

    def batches_for(self, model: str) -> list[int]:
        if isinstance(self.batch_sizes, dict):
            return self.batch_sizes.get(model) or [default_batch(model, self.device)]
        return self.batch_sizes or [default_batch(model, self.device)]

    def threads_per_worker(self, workers_per_node: int) -> int:
        return max(1, self.cpus // workers_per_node)

    @property
    def transport(self) -> Transport:
        """The transport --cluster names (not yet opened)."""
        return transport_for(self.cluster)


def config_hash(settings: dict) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def expand(campaign: Campaign) -> list[RunConfig]:
    """Every run of the campaign: each configuration (`configurations`) `campaign.launches`
    times, in the interleaved order of `in_rounds`."""
    return in_rounds(configurations(campaign), campaign.launches, campaign.seed)


def in_rounds(configs: list[RunConfig], launches: int, seed: int) -> list[RunConfig]:
    """Each configuration once per round, `launches` rounds, so that whatever drifts over a
    campaign (clock, cache, background load) falls on every scheme alike.  One launch keeps
    the plan's order; with several, each round's order is shuffled by a generator seeded with
    (seed, round), so a resumed campaign runs the same order and picks up where it stopped.
    Launch 1 keeps the configuration's run id; launch k > 1 adds ``-l<k>``."""
    if launches == 1:
        return list(configs)
    runs = []
    for launch in range(1, launches + 1):  # round k holds every configuration's launch k
        order = list(configs)
        random.Random(f"{seed}-{launch}").shuffle(order)
        runs += [launch_of(run, launch) for run in order]
    return runs


LAUNCH_SUFFIX = "-l{launch}"  # the run id of launch k > 1 of a configuration ends so


def launch_of(run: RunConfig, launch: int) -> RunConfig:
    """Launch `launch` of a configuration: its own run id and folder, the same config hash."""
    if launch == 1:
        return dataclasses.replace(run, launch=1)
    run_id = run.run_id + LAUNCH_SUFFIX.format(launch=launch)
    run_dir = Path(run.rank_dir).parent / run_id
    return dataclasses.replace(run, run_id=run_id, record_path=str(run_dir / "record.json"),
                               rank_dir=str(run_dir), launch=launch)


def launch_in(run_id: str) -> int:
    """The launch a run id names (`launch_of`'s suffix: ``...-l3`` is 3; launch 1 has none)."""
    found = re.search(re.escape(LAUNCH_SUFFIX.split("{")[0]) + r"(\d+)$", run_id)
    return int(found.group(1)) if found else 1


def configurations(campaign: Campaign) -> list[RunConfig]:
    """One RunConfig per framework x model x nodes x workers x batch, in a stable order."""
    runs = []
    for info, mode in campaign.frameworks:
        for model in campaign.models:
            for nodes in campaign.nodes:
                for workers in campaign.workers:
                    for servers in server_counts(campaign, info, mode, nodes * workers):
                        for batch in campaign.batches_for(model):
                            for bandwidth, latency in links_for(campaign, nodes):
                                runs.append(make_run(campaign, info, mode, model, nodes, workers,
                                                     servers, batch, bandwidth, latency))
    return runs


def links_for(campaign: Campaign, nodes: int) -> list[tuple[str | None, str | None]]:
    """Bandwidth x latency of the emulated links; a one-node run crosses no link, so it is
    one run (no bandwidth, no latency) whatever the sweep."""
    if nodes == 1:
        return [(None, None)]
    return [(b, lat) for b in campaign.bandwidths for lat in campaign.latencies]


def set_cluster(campaign, args) -> None:
    """--cluster, --bandwidth, --latency into the campaign, checked by the transport
    (UsageError)."""
    try:
        transport = transport_for(getattr(args, "cluster", None))
        campaign.cluster = transport.label
        campaign.bandwidths = parse_links(getattr(args, "bandwidth", None), "--bandwidth",
                                          parse_bandwidth)
        campaign.latencies = parse_links(getattr(args, "latency", None), "--latency", parse_latency)
        transport.validate(campaign)
    except TransportError as error:
        raise UsageError(str(error)) from None


def parse_links(text: str | None, what: str, parse) -> list[str | None]:
    """A comma list of bandwidths or latencies, each checked by `parse` (analysis.predict's
    unit parser); None when not given."""
    if text is None:
        return [None]
    items = list(dict.fromkeys(comma_list(text, what, UsageError)))
    for item in items:
        try:
            value = parse(item)
        except ValueError as error:
            raise UsageError(f"{what}: {error}") from None
        if not math.isfinite(value):
            raise UsageError(f"{what}: {item!r} is not a finite value")
    return items


def link_tag(value: str | None) -> str:
    """A bandwidth or latency as a run-id part: '1Gbit' -> '1Gbit', '0.2 ms' -> '0.2ms'."""
    return re.sub(r"[^0-9A-Za-z.]", "", value or "")


def server_counts(campaign: Campaign, info: FrameworkInfo, mode: str, world: int) -> list[int]:
    """--servers applies to parameter-server modes only; where one worker runs without any
    server (TensorFlow's single-device baseline) it is one run with servers = 0."""
    if mode not in info.server_modes or (world == 1 and not info.servers_with_one_worker):
        return [0]
    return campaign.servers


def make_run(campaign: Campaign, info: FrameworkInfo, mode: str, model: str, nodes: int,
             workers: int, servers: int, batch: int, bandwidth: str | None = None,
             latency: str | None = None) -> RunConfig:
    measured = dict(
        framework=info.name, mode=mode, model=model, nodes=nodes, workers_per_node=workers,
        servers=servers, batch_per_worker=batch, device=campaign.device, iterations=campaign.iterations,
        warmup=campaign.warmup, repeats=campaign.repeats,
        profile_iterations=campaign.profile_iterations, data=campaign.data,
        dropout=campaign.dropout, seed=campaign.seed, loader_workers=campaign.loader_workers,
        threads_per_worker=campaign.threads_per_worker(
            ranks_sharing_cores(campaign.transport, nodes, workers)),
        options={"channels_last": campaign.channels_last, **campaign.options},
        layout="NHWC" if campaign.channels_last else "NCHW", fault=campaign.fault,
    )
    if campaign.dtype != "float32":  # float32 runs keep the identities they always had
        measured["dtype"] = campaign.dtype
    # Where the nodes are and what runs the ranks change what is measured; runs of the local
    # runtime keep the identities they had before runtimes existed (stored campaigns resume).
    measured.update(campaign.transport.identity(bandwidth, latency))
    if campaign.runtime != "local":
        measured["runtime"] = campaign.runtime
    digest = config_hash(measured)
    measured.pop("cluster", None)
    measured.pop("runtime", None)
    servers_part = f"-ps{servers}" if servers else ""
    link_part = "".join(f"-{prefix}{link_tag(value)}" for prefix, value in
                        (("bw", bandwidth), ("lat", latency)) if value)
    run_id = (f"{info.name}-{mode}-{model}-{nodes}x{workers}{servers_part}-b{batch}{link_part}-"
              f"{campaign.data}-{digest[:6]}")
    run_dir = campaign.out / "runs" / run_id
    return RunConfig(run_id=run_id, campaign=campaign.out.name, config_hash=digest,
                     record_path=str(run_dir / "record.json"), rank_dir=str(run_dir),
                     git_revision=campaign.git_revision, **measured)


def ranks_sharing_cores(transport: Transport, nodes: int, workers: int) -> int:
    """The ranks of a run that share this machine's cores: one node's workers, or every
    node's where the transport's nodes are on this machine."""
    return workers * (nodes if transport.nodes_share_this_machine else 1)


def check_batch_fits(campaign: Campaign) -> None:
    """Reject topologies the machine cannot hold before anything starts."""
    for model in campaign.models:
        get_model(model)  # raises on an inconsistent description
    if campaign.device == "gpu":
        gpus = gpu_count()
        too_many = [w for w in campaign.workers if w > gpus]
        if too_many and not campaign.options.get("share_gpu"):
            raise UsageError(f"--workers {too_many[0]} needs {too_many[0]} GPUs per node; "
                             f"this machine has {gpus} ({SHARE_GPU_HINT})")


SHARE_GPU_HINT = "--option share_gpu=true runs several ranks on one GPU, over gloo"


def check_options(campaign: Campaign) -> None:
    """Options whose value no run could use, rejected before anything starts: a bucket of no
    bytes, a PowerSGD rank below 1 or above the smallest side of a weight matrix it factorises."""
    options = campaign.options
    if "bucket_mb" in options and not _positive(options["bucket_mb"]):
        raise UsageError(f"--option bucket_mb must be a positive number of MB, got {options['bucket_mb']!r}")
    if "powersgd_rank" not in options:
        return
    rank = options["powersgd_rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UsageError(f"--option powersgd_rank must be a whole number of at least 1, got {rank!r}")
    for model in campaign.models:
        sides = {name: min(shape[0], math.prod(shape[1:])) for name, shape in
                 get_model(model).parameter_shapes().items() if len(shape) > 1}
        name, side = min(sides.items(), key=lambda item: item[1])
        if rank > side:
            raise UsageError(f"--option powersgd_rank={rank} is larger than {model}'s {name} allows "
                             f"(its smallest side is {side})")


def _positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def check_out_dir(out: Path) -> None:
    """Fail early and in one line if results could not be stored."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise UsageError(f"--out {out} is not writable: {error.strerror or error}") from None


def git_revision(repo: Path) -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=repo, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (head or "unknown") + ("-dirty" if dirty.strip() else "")


def campaign_summary(campaign: Campaign) -> dict:
    """The settings as plain values, for the printed plan and the store's metadata."""
    data = asdict(campaign)
    data["frameworks"] = [f"{info.name}:{mode}" for info, mode in campaign.frameworks]
    data["out"] = str(campaign.out)
    return data
