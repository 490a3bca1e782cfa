"""The scheme catalogue: every framework and aggregation scheme dlcompare knows, in one place.

A *scheme* is one way of moving gradients: a framework's mode (``torch:ddp``, ``tf:ps``,
``mxnet:dist_sync``; the name as the command line spells it, ``FRAMEWORK:MODE``) or a textbook
scheme the model prices on its own (``wfbp``, ``buckets``: no framework runs it).  Per scheme
this module holds

- its label (how tables, legends and the verdict name it) and its colour (the same in every
  figure of every campaign: Okabe-Ito's colour-blind-safe set first, related schemes in related
  hues — TensorFlow's modes greens, MXNet's purples, Horovod's reds, textbook schemes greys and
  earths);
- how the performance model sees it (`SchemeInfo.model`: the fields of
  ``analysis.perfmodel.Scheme`` — which messages, sent during or after backward, which
  collective, how it spans nodes), the transport it runs over on CPUs and on a GPU cluster,
  and the adapter options that change it (a DDP bucket size, a Horovod fusion threshold);
- whether it is synchronous, whether it has parameter servers, whether one process drives
  every device (one node only), and which computation its one-worker run shares with other
  schemes (``compute``: PyTorch DDP, CNTK-style, Caffe-MPI-style and Horovod all run the same
  PyTorch step on one worker).

Per framework (`FrameworkFacts`): its label and modes in order (the first is the default), and
the seconds a run of it spends outside its steps, which the dry run's estimate uses.

Standard library only, in the bottom layer: the adapters describe their scheme from here
(`SchemeInfo.describe`), the what-if prices it, the palette colours it, the dry run, tables,
benches and tests read it.  What needs the framework itself (its adapter module, environment,
rendezvous, image) is `adapters.registry`, which adds only that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIB = 2 ** 20


class UnknownScheme(ValueError):
    """A framework, mode or scheme name the catalogue does not know; the message is one line."""


@dataclass(frozen=True)
class Option:
    """An adapter option a campaign may set (``--option KEY=VALUE``): what it does, the
    default the adapter uses, and how it enters the model's scheme (``model_field`` scaled by
    ``model_scale``: ``bucket_mb`` is ``bucket_bytes`` in MiB)."""

    help: str
    default: object = None
    model_field: str | None = None
    model_scale: float = 1.0


# Every adapter option, by key: a key not listed is a typo, not a silent no-op.  Which schemes
# read an option is `SchemeInfo.options`.
OPTIONS: dict[str, Option] = {
    "cudnn_benchmark": Option("PyTorch on a GPU: cuDNN autotuning (true, the default, or false)", True),
    "pinned": Option("PyTorch on a GPU: batches copied from page-locked memory (true, the default) or from "
                     "pageable memory (false)", True),
    "share_gpu": Option("PyTorch: more ranks than GPUs share them (over gloo: NCCL refuses two ranks on one GPU)",
                        False),
    "bucket_mb": Option("PyTorch DDP: gradient bucket size in MB (25)", 25.0, "bucket_bytes", MIB),
    "powersgd_rank": Option("PyTorch ddp-powersgd: rank of each gradient matrix's approximation (1, PyTorch's "
                            "default; at most a weight matrix's smallest side)", 1),
    # Horovod 0.28.1's defaults (horovod/common/operations.cc)
    "fusion_mb": Option("Horovod: tensor fusion buffer in MB (128)", 128.0, "bucket_bytes", MIB),
    "cycle_ms": Option("Horovod: background cycle in ms (1)", 1.0, "cycle_s", 1e-3),
    "xla": Option("TensorFlow: XLA compilation", False),
    "bytes_per_pack": Option("TensorFlow collective: bytes per gradient pack (0: one pack)", 0),
    "ps_strategy": Option("TensorFlow ps: variable placement", "greedy"),
    "inter_op_threads": Option("TensorFlow: inter-op threads"),
    "mxnet_bn_running_var": Option("MXNet: 'biased' keeps MXNet's own batch-norm running variance", "unbiased"),
    "bind_cores": Option("every framework: each rank's threads bound to cores of its own (CPU runs; "
                         "bench/launch_noise.py measures whether it lowers the noise between launches)", False),
}

TORCH_OPTIONS = ("cudnn_benchmark", "pinned", "share_gpu")
TF_OPTIONS = ("xla", "inter_op_threads")


@dataclass(frozen=True)
class SchemeInfo:
    """One scheme (see the module docstring).  ``framework`` is None for a textbook scheme.

    ``model`` holds the fields of ``analysis.perfmodel.Scheme`` as the scheme runs on CPUs
    here; ``on_gpu`` the fields that differ on a GPU cluster (typically its transport, NCCL).
    ``model`` None: the model has no terms for it, ``unmodelled`` says why.  ``transport`` is
    the communication stack on CPUs, ``on_gpu["transport"]`` on GPUs; calibrations are looked
    up, and described clusters' software costs charged, by that name."""

    name: str
    label: str
    colour: str
    framework: str | None = None
    mode: str | None = None
    model: dict | None = None
    on_gpu: dict = field(default_factory=dict)
    transport: str | None = None
    options: tuple[str, ...] = ()
    synchronous: bool = True
    servers: bool = False  # parameter servers (--servers N)
    one_process: bool = False  # one process drives every device of a node: one node only
    compute: str | None = None  # schemes with the same value run the same one-worker step
    unmodelled: str = ""
    lossy: str = ""  # what the scheme changes in the gradients it sends ("" : it sends them exactly)
    wire: str = ""  # how it encodes a gradient for the wire (`wire_bytes`): "", "fp16" or "powersgd"

    @property
    def modelled(self) -> bool:
        return self.model is not None

    def describe(self, options: dict | None = None, device: str = "cpu", servers: int | None = None,
                 transport: str | None = None, shapes: list | None = None) -> dict | None:
        """The scheme in the model's terms for a run: ``model`` (with ``on_gpu`` on a GPU),
        the options' values in their model fields, the run's servers and transport, and the
        label.  A fusion buffer or bucket of 0 turns merging off (one message per tensor).
        A compressing scheme's ``wire_ratio`` is counted from the model's parameter `shapes`
        (`wire_ratio`); without them it is left out.  None where the model has no terms for
        the scheme."""
        if self.model is None:
            return None
        out = {"label": self.label, **self.model, **(self.on_gpu if device == "gpu" else {})}
        if self.wire and shapes:
            out["wire_ratio"] = wire_ratio(self.wire, shapes, options)
        out.setdefault("transport", self.transport)  # on a GPU: on_gpu's, else the CPU's
        for key in self.options:
            option = OPTIONS[key]
            if option.model_field is None or option.default is None:
                continue
            value = (options or {}).get(key)
            value = option.default if value is None else value
            scaled = float(value) * option.model_scale
            out[option.model_field] = int(scaled) if option.model_field.endswith("_bytes") else scaled
        if out.get("merge") and not out.get("bucket_bytes"):  # fusion off: every tensor alone
            out.update(merge=None, profile_granularity=out.get("granularity"))
            out.pop("bucket_bytes", None)
        if servers is not None and out.get("algorithm") == "ps":
            out["servers"] = int(servers)
        if transport is not None:
            out["transport"] = transport
        return out


# PowerSGD sends a matrix compressed only where that shrinks it more than this (PyTorch's
# PowerSGDState default, powerSGD_hook._should_compress)
POWERSGD_MIN_COMPRESSION_RATE = 2.0


def powersgd_factors(shape, rank: int) -> tuple[int, int, int] | None:
    """(rows, columns, rank) of the factorisation PowerSGD sends for a tensor of `shape` (the
    tensor viewed as shape[0] x the rest), or None where it sends the tensor as it is."""
    if len(shape) < 2:
        return None
    rows, cols = int(shape[0]), math.prod(int(side) for side in shape[1:])
    rank = min(int(rank), rows, cols)
    return (rows, cols, rank) if rows * cols > POWERSGD_MIN_COMPRESSION_RATE * (rows + cols) * rank else None


def wire_bytes(wire: str, shape, options: dict | None = None) -> int:
    """Bytes a float32 gradient of `shape` takes on the wire under encoding `wire`: float16
    halves it; PowerSGD sends P (rows x r) and Q (columns x r) in float32, or the tensor."""
    count = math.prod(int(side) for side in shape)
    if wire == "fp16":
        return 2 * count
    if wire == "powersgd":
        rank = (options or {}).get("powersgd_rank", OPTIONS["powersgd_rank"].default)
        factors = powersgd_factors(shape, rank)
        return 4 * ((factors[0] + factors[1]) * factors[2] if factors else count)
    return 4 * count


def wire_ratio(wire: str, shapes, options: dict | None = None) -> float:
    """The share of a model's gradient bytes (parameter `shapes`) that goes on the wire."""
    raw = sum(wire_bytes("", shape) for shape in shapes)
    return sum(wire_bytes(wire, shape, options) for shape in shapes) / raw if raw else 1.0


def _framework_scheme(framework: str, mode: str, label: str, colour: str, **fields) -> SchemeInfo:
    return SchemeInfo(f"{framework}:{mode}", label, colour, framework=framework, mode=mode, **fields)


# Message patterns shared by several schemes (analysis.perfmodel.Scheme's fields).
WHOLE_AFTER_BACKWARD = {"overlap": False, "granularity": "whole", "profile_granularity": "whole",
                        "algorithm": "ring"}
FUSED_CYCLES = {"overlap": True, "granularity": "tensor", "merge": "cycle", "profile_granularity": "bucket",
                "algorithm": "ring"}
PS_PER_TENSOR = {"overlap": True, "granularity": "tensor", "profile_granularity": "tensor", "algorithm": "ps",
                 "servers": 1}
NCCL = {"transport": "nccl"}
# DDP: gradient buckets (bucket_mb; the first 1 MiB) all-reduced as backward fills them; the
# separated profile all-reduces the whole gradient
DDP_BUCKETS = {"overlap": True, "granularity": "bucket", "first_bucket_bytes": MIB, "profile_granularity": "whole",
               "algorithm": "ring"}

FRAMEWORK_SCHEMES: tuple[SchemeInfo, ...] = (
    _framework_scheme(
        "torch", "ddp", "PyTorch DDP", "#0072B2",  # blue
        model=DDP_BUCKETS, on_gpu=NCCL, transport="gloo", options=("bucket_mb", *TORCH_OPTIONS), compute="pytorch"),
    _framework_scheme(
        "torch", "ddp-fp16", "PyTorch DDP fp16", "#4F9FD9",  # lighter blue
        # DDP's buckets, each cast to float16 for its all-reduce: half the bytes on the wire
        model=DDP_BUCKETS, on_gpu=NCCL, transport="gloo", options=("bucket_mb", *TORCH_OPTIONS),
        compute="pytorch", wire="fp16",
        lossy="each gradient rounded to float16 for its all-reduce"),
    _framework_scheme(
        "torch", "ddp-powersgd", "PyTorch DDP PowerSGD", "#00446E",  # dark blue
        # DDP's buckets, each gradient matrix sent as a rank-r factorisation
        model=DDP_BUCKETS, on_gpu=NCCL, transport="gloo", options=("powersgd_rank", "bucket_mb", *TORCH_OPTIONS),
        compute="pytorch", wire="powersgd",
        lossy="each gradient matrix replaced by a rank-r approximation, with error feedback"),
    _framework_scheme(
        "torch", "zero", "PyTorch ZeRO", "#7FA7C9",  # greyish blue
        # DDP's all-reduce, then each rank updates its shard of the parameters and broadcasts
        # it: an all-gather of the parameters after the update
        model={**DDP_BUCKETS, "gather_params": True}, on_gpu=NCCL, transport="gloo",
        options=("bucket_mb", *TORCH_OPTIONS), compute="pytorch"),
    _framework_scheme(
        "torch", "fsdp", "PyTorch FSDP", "#3B5B92",  # slate blue
        # FSDP2 full sharding: each layer all-gathered before its forward (`gather_forward`),
        # then before its backward, its gradient reduce-scattered after: one all-reduce's
        # bytes per layer in backward; the separated profile gathers and reduce-scatters each
        # layer around a communication-free forward and backward.  FSDP2 overlaps through
        # CUDA streams; on CPUs its collectives block (no overlap)
        model={"overlap": False, "granularity": "layer", "profile_granularity": "layer", "algorithm": "ring",
               "gather_forward": True},
        on_gpu={**NCCL, "overlap": True}, transport="gloo", options=TORCH_OPTIONS, compute="pytorch"),
    _framework_scheme(
        "cntk-style", "allreduce", "CNTK-style", "#D55E00",  # vermillion
        # CNTK's scheme on PyTorch compute: the whole gradient once backward has finished
        model=WHOLE_AFTER_BACKWARD, on_gpu=NCCL, transport="gloo", options=TORCH_OPTIONS, compute="pytorch"),
    _framework_scheme(
        "caffe-mpi-style", "mpi", "Caffe-MPI-style", "#CC79A7",  # reddish purple
        # Caffe-MPI's scheme on PyTorch compute: one MPI all-reduce per tensor from a
        # communication thread as soon as backward has made it final (WFBP)
        model={"overlap": True, "granularity": "tensor", "profile_granularity": "tensor", "algorithm": "ring"},
        transport="mpi", options=TORCH_OPTIONS, compute="pytorch"),
    _framework_scheme(
        "horovod", "gloo", "Horovod (gloo)", "#B2182B",  # dark red
        # each gradient submitted when final; every cycle the background thread fuses what is
        # ready (up to the fusion threshold) into one ring all-reduce
        model=FUSED_CYCLES, on_gpu=NCCL, transport="gloo", options=("fusion_mb", "cycle_ms", *TORCH_OPTIONS),
        compute="pytorch"),
    _framework_scheme(
        "horovod", "mpi", "Horovod (MPI)", "#F4A582",  # salmon
        model=FUSED_CYCLES, on_gpu=NCCL, transport="mpi", options=("fusion_mb", "cycle_ms", *TORCH_OPTIONS),
        compute="pytorch"),
    _framework_scheme(
        "horovod", "gloo-fp16", "Horovod (gloo) fp16", "#D6604D",  # brick red
        # horovod:gloo with hvd.Compression.fp16: each gradient cast to float16 before fusion
        model=FUSED_CYCLES, on_gpu=NCCL, transport="gloo", options=("fusion_mb", "cycle_ms", *TORCH_OPTIONS),
        compute="pytorch", wire="fp16", lossy="each gradient rounded to float16 for its all-reduce"),
    _framework_scheme(
        "tf", "collective", "TensorFlow (collective)", "#009E73",  # bluish green
        # MultiWorkerMirroredStrategy packs the gradients into one tensor (bytes_per_pack 0),
        # which needs all of them: one ring all-reduce after backward, over gRPC (NCCL on GPUs)
        model=WHOLE_AFTER_BACKWARD, on_gpu=NCCL, transport="grpc", options=("bytes_per_pack", *TF_OPTIONS),
        compute="tensorflow"),
    _framework_scheme(
        "tf", "ps", "TensorFlow (ps)", "#66C2A5",  # light green
        # SyncReplicasOptimizer: one push and pull per variable over gRPC, priced after backward
        # (the pulls come with the next forward and the update waits for every push)
        model={"overlap": False, "granularity": "tensor", "profile_granularity": "tensor", "algorithm": "ps",
               "servers": 1},
        on_gpu={"transport": "grpc"}, transport="grpc-ps", options=("ps_strategy", *TF_OPTIONS), servers=True,
        compute="tensorflow"),
    _framework_scheme(
        "tf", "ps-async", "TensorFlow (ps-async)", "#1B5E20",  # dark green
        transport="grpc-ps", options=TF_OPTIONS, servers=True, synchronous=False, compute="tensorflow",
        unmodelled="asynchronous parameter servers: the model prices synchronous iterations only"),
    _framework_scheme(
        "tf", "mirrored", "TensorFlow (mirrored)", "#8BC34A",  # lime
        # one process over its node's GPUs: the whole gradient all-reduced after backward
        model=WHOLE_AFTER_BACKWARD, on_gpu=NCCL, transport="grpc", options=TF_OPTIONS, one_process=True,
        compute="tensorflow"),
    _framework_scheme(
        "mxnet", "dist_sync", "MXNet (dist_sync)", "#6A3D9A",  # purple
        # each gradient pushed to ps-lite's servers as backward makes it (the engine runs the
        # pushes by priority beside the rest of backward), summed there, then pulled
        model=PS_PER_TENSOR, on_gpu={"transport": "ps-lite"}, transport="ps-lite",
        options=("mxnet_bn_running_var",), servers=True, compute="mxnet"),
    _framework_scheme(
        "mxnet", "dist_device_sync", "MXNet (dist_device_sync)", "#9E7BC7",  # lavender
        # the node's devices reduced locally first, one push/pull per node
        model={**PS_PER_TENSOR, "topology": "local_reduce"}, on_gpu={"transport": "ps-lite"},
        transport="ps-lite", options=("mxnet_bn_running_var",), servers=True, compute="mxnet"),
    _framework_scheme(
        "mxnet", "local", "MXNet (local)", "#3F2A5C",  # dark purple
        options=("mxnet_bn_running_var",), one_process=True, compute="mxnet",
        unmodelled="one process reduces its devices' gradients in host memory: the model has no term for it"),
    _framework_scheme(
        "mxnet", "device", "MXNet (device)", "#B39DDB",  # light purple
        options=("mxnet_bn_running_var",), one_process=True, compute="mxnet",
        unmodelled="one process reduces on its devices with peer copies: the model has no term for it"),
    _framework_scheme(
        "mxnet", "nccl", "MXNet (nccl)", "#5E35B1",  # violet
        # one process, NCCL among its GPUs after backward, one all-reduce per tensor (GPU builds)
        model={"overlap": False, "granularity": "tensor", "profile_granularity": "tensor", "algorithm": "ring"},
        on_gpu=NCCL, transport="nccl", options=("mxnet_bn_running_var",), one_process=True, compute="mxnet"),
    _framework_scheme(
        "cntk", "mpi", "CNTK", "#E69F00",  # orange
        # data_parallel_distributed_learner: once backward is done, one non-blocking MPI
        # all-reduce per gradient tensor (OpenMPI's libnbc: a binomial tree), then the update;
        # on GPUs CNTK all-reduces over NCCL
        model={"overlap": False, "granularity": "tensor", "profile_granularity": "tensor", "algorithm": "tree"},
        on_gpu={"transport": "nccl", "algorithm": "ring"}, transport="mpi", compute="cntk"),
    _framework_scheme(
        "jax", "allreduce", "JAX", "#56B4E9",  # sky blue
        # one jit-compiled step; the gradients packed into one buffer and averaged by lax.pmean
        # after backward (gloo on CPUs, NCCL on GPUs)
        model=WHOLE_AFTER_BACKWARD, on_gpu=NCCL, transport="gloo", compute="jax"),
)

# Schemes the model prices that no adapter mode runs: the what-if's textbook schemes and the
# two-level all-reduce of a described cluster.  Their transport is the one whose software cost
# they pay on a described cluster.
TEXTBOOK_SCHEMES: tuple[SchemeInfo, ...] = (
    SchemeInfo("no-overlap", "no overlap: whole gradient after backward", "#949494",  # grey
               model={"overlap": False, "granularity": "whole"}, transport="nccl"),
    SchemeInfo("wfbp", "WFBP: per layer during backward", "#C8B400",  # mustard
               model={"overlap": True, "granularity": "layer"}, transport="nccl"),
    SchemeInfo("mgwfbp", "MG-WFBP-style merged layers", "#8C8000",  # olive
               model={"overlap": True, "granularity": "layer", "merge": "greedy"}, transport="nccl"),
    SchemeInfo("buckets", "25 MB buckets (DDP-like)", "#1B4F72",  # navy
               model={"overlap": True, "granularity": "bucket", "bucket_bytes": 25 * MIB,
                      "first_bucket_bytes": MIB}, transport="nccl"),
    SchemeInfo("fusion", "Horovod-like fusion: 1 ms cycles, 128 MB buffer", "#F0B25E",  # sand
               model={"overlap": True, "granularity": "tensor", "merge": "cycle", "cycle_s": 1e-3,
                      "bucket_bytes": 128 * MIB}, transport="nccl"),
    SchemeInfo("ps", "parameter server, per layer", "#5D4037",  # brown
               model={"overlap": True, "granularity": "layer", "algorithm": "ps", "servers": 1},
               transport="ps-lite"),
    SchemeInfo("horovod:hierarchical", "Horovod (hierarchical)", "#67001F",  # darkest red
               model={**FUSED_CYCLES, "cycle_s": 1e-3, "bucket_bytes": 128 * MIB, "topology": "two_level"},
               transport="nccl"),
)

SCHEMES: dict[str, SchemeInfo] = {s.name: s for s in (*FRAMEWORK_SCHEMES, *TEXTBOOK_SCHEMES)}
TEXTBOOK: tuple[str, ...] = tuple(s.name for s in TEXTBOOK_SCHEMES)


@dataclass(frozen=True)
class FrameworkFacts:
    """A framework as the catalogue knows it: label, modes (the first the default), and the
    seconds a run spends outside its training steps (processes, import, rendezvous, model and
    weights, the record) measured on campaigns of the tiny models on a 2-core CPU VM
    (2026-12), plus what compiling a model's step adds (``compile_s``)."""

    name: str
    label: str
    modes: tuple[str, ...]
    startup_s: float = 6.0
    compile_s: dict = field(default_factory=dict)
    servers_with_one_worker: bool = True  # False: one worker runs single-device, no server


FRAMEWORKS: dict[str, FrameworkFacts] = {f.name: f for f in (
    FrameworkFacts("torch", "PyTorch DDP", ("ddp", "ddp-fp16", "ddp-powersgd", "zero", "fsdp"), 4.0),
    FrameworkFacts("tf", "TensorFlow", ("collective", "ps", "ps-async", "mirrored"), 11.0,
                   servers_with_one_worker=False),
    FrameworkFacts("cntk", "CNTK", ("mpi",), 2.0),
    FrameworkFacts("cntk-style", "CNTK-style", ("allreduce",), 4.5),
    FrameworkFacts("caffe-mpi-style", "Caffe-MPI-style", ("mpi",), 5.0),
    FrameworkFacts("horovod", "Horovod", ("gloo", "mpi", "gloo-fp16"), 6.5),
    FrameworkFacts("mxnet", "MXNet", ("dist_sync", "dist_device_sync", "local", "device", "nccl"), 5.5),
    # JAX compiles its step first: googlenet-tiny's graph takes this much longer than alexnet-tiny's
    FrameworkFacts("jax", "JAX", ("allreduce",), 7.5, compile_s={"googlenet-tiny": 35.0}),
)}
DEFAULT_STARTUP_S = 6.0


def framework_facts(name: str) -> FrameworkFacts:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise UnknownScheme(f"unknown framework {name!r} (known: {', '.join(sorted(FRAMEWORKS))})") from None


def scheme(framework: str, mode: str | None = None) -> SchemeInfo:
    """The scheme of a framework's mode (its first mode when none is given)."""
    facts = framework_facts(framework)
    mode = mode or facts.modes[0]
    if mode not in facts.modes:
        raise UnknownScheme(f"unknown mode {mode!r} for {framework} (known: {', '.join(facts.modes)})")
    return SCHEMES[f"{framework}:{mode}"]


def resolve(name: str) -> SchemeInfo:
    """A scheme by the name a user types: ``FRAMEWORK:MODE``, a framework alone (its first
    mode), or a textbook scheme; case and spaces ignored."""
    key = str(name).strip().lower()
    if key in SCHEMES:
        return SCHEMES[key]
    framework, _, mode = key.partition(":")
    if framework in FRAMEWORKS:
        return scheme(framework, mode or None)
    known = ", ".join([*FRAMEWORKS, *TEXTBOOK])
    raise UnknownScheme(f"unknown scheme {name!r} (known: {known}, or FRAMEWORK:MODE)")


def scheme_key(framework, mode=None) -> str:
    """The catalogue name of a run's scheme, ``framework:mode`` (the framework's first mode when
    the mode is missing); a name the catalogue lacks is kept as the record spells it."""
    framework = "" if framework is None else str(framework)
    mode = None if mode is None or mode != mode or str(mode) == "" else str(mode)  # NaN: none
    if framework in FRAMEWORKS:
        try:
            return scheme(framework, mode).name
        except UnknownScheme:
            pass
    return f"{framework}:{mode}" if mode else framework


def label_of(framework, mode=None, fallback: str | None = None) -> str:
    """How tables and legends name a run's scheme: the catalogue's label, else ``fallback``
    (the record's own label) with its mode, else the key."""
    key = scheme_key(framework, mode)
    if key in SCHEMES:
        return SCHEMES[key].label
    if fallback and mode and mode == mode:
        return f"{fallback} ({mode})"
    return fallback or key


def shared_compute(framework, mode=None) -> str:
    """What a scheme's one-worker run computes: schemes with the same answer run the same step
    with one worker, so their one-worker runs measure one computation."""
    info = SCHEMES.get(scheme_key(framework, mode))
    return (info.compute if info is not None and info.compute else scheme_key(framework, mode))


def modelled_names() -> list[str]:
    """Every synchronous scheme the model prices, framework modes first, then textbook ones."""
    return [s.name for s in SCHEMES.values() if s.modelled and s.synchronous]
