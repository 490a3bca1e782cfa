"""What-if: every scheme at node counts, workers per node, bandwidths and latencies one does
not have, and the output people read (a table and a plot of efficiency against nodes that
names each scheme's bottleneck).

A `Candidate` is one scheme with the one-worker compute it runs on (`perfmodel.Profile`) and
a function that prices its messages on a topology and link: either a calibrated flat link
from a campaign (`flat_link_cost`: all p ranks on one link, as calibrated) or a described
cluster's hierarchy (`cluster_cost`: `perfmodel.topology_cost` on the file's links and
transports).  `evaluate` walks the grid; each row has the predicted iteration, weak-scaling
speedup S = N t(1) / t(N) and efficiency E = S / N against one worker of the same device,
the communication left exposed after backward, and the bottleneck
(`perfmodel.bottleneck`).

Every scheme comes from the scheme catalogue (`core.schemes`): the frameworks' schemes
(`STUDY_SCHEMES`, by their catalogue names) as they run on GPUs, the textbook ones
(`CATALOGUE`) as the model prices them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from analysis import perfmodel as pm
from core import schemes as catalogue
from analysis import tables
from analysis.cluster import ClusterSpec
from analysis.palette import colour
from analysis.units import format_bandwidth, format_latency
from models import get_model

MIB = 2 ** 20


class WhatIfError(ValueError):
    """Bad input for the what-if; the message is one line."""


@dataclass(frozen=True)
class StudyScheme:
    """A catalogue scheme in the model's terms on a GPU cluster, and its transport there."""

    label: str
    scheme: pm.Scheme
    transport: str


def gpu_scheme(info: catalogue.SchemeInfo, shapes: list | None = None) -> StudyScheme:
    """How `info` runs on a GPU cluster (`SchemeInfo.describe` on a GPU, default options; a
    compressing scheme's bytes on the wire from the model's parameter `shapes`)."""
    described = info.describe(device="gpu", shapes=shapes)
    return StudyScheme(info.label, pm.Scheme.from_dict({**described, "name": info.label}),
                       described["transport"])


def _study_names() -> list[str]:
    """The frameworks' schemes the what-if offers on a cluster: synchronous, priced by the
    model, spanning nodes; of modes that run alike on GPUs (Horovod's gloo and MPI
    controllers both move gradients over NCCL) the first."""
    seen, out = set(), []
    for info in catalogue.FRAMEWORK_SCHEMES:
        if not (info.modelled and info.synchronous and not info.one_process):
            continue
        described = info.describe(device="gpu")
        key = (info.framework, tuple(sorted((k, str(v)) for k, v in described.items() if k != "label")))
        if key not in seen:
            seen.add(key)
            out.append(info.name)
    return out


STUDY_SCHEMES: dict[str, StudyScheme] = {name: gpu_scheme(catalogue.SCHEMES[name]) for name in _study_names()}
CATALOGUE: dict[str, pm.Scheme] = {name: pm.Scheme.from_dict({**catalogue.SCHEMES[name].model,
                                                               "name": catalogue.SCHEMES[name].label})
                                   for name in catalogue.TEXTBOOK}


def scheme_names(text_items: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The schemes of --frameworks: catalogue names (``FRAMEWORK:MODE``, a framework alone for
    its first mode, textbook schemes), `extra` words (e.g. 'stored'), 'study' for the
    frameworks' schemes, 'all' for those and the textbook ones.  A scheme the model has no
    terms for is refused with the reason."""
    out: list[str] = []
    for item in text_items:
        key = item.strip().lower()
        if key == "all":
            out += [*STUDY_SCHEMES, *CATALOGUE]
        elif key == "study":
            out += list(STUDY_SCHEMES)
        elif key in extra:
            out.append(key)
        else:
            out.append(priced_scheme(key).name)
    return list(dict.fromkeys(out))


def priced_scheme(name: str) -> catalogue.SchemeInfo:
    """The catalogue's scheme `name`, which the model must be able to price (WhatIfError)."""
    try:
        info = catalogue.resolve(name)
    except catalogue.UnknownScheme as error:
        raise WhatIfError(f"{error}; also all, study") from None
    if not info.modelled:
        raise WhatIfError(f"{info.name}: {info.unmodelled}")
    if not info.synchronous:
        raise WhatIfError(f"{info.name} is asynchronous: the model prices synchronous iterations only")
    return info


def catalogue_scheme(key: str, algorithm: str = "ring", servers: int | None = None) -> pm.Scheme:
    """A textbook scheme with the --algorithm and --ps choices applied."""
    scheme = CATALOGUE[key]
    if algorithm != "ring" and scheme.algorithm != "ps":
        scheme = pm.Scheme.from_dict({**scheme.as_dict(), "algorithm": algorithm, "name": f"{scheme.name}, {algorithm}"})
    if scheme.algorithm == "ps" and servers is not None:
        scheme = pm.Scheme.from_dict({**scheme.as_dict(), "servers": servers,
                                      "name": f"parameter server x{servers}, per layer"})
    return scheme


# --------------------------------------------------------------------------- candidates

Cost = Callable[[pm.Topology, "float | None", "float | None"], pm.CommCost]


@dataclass(frozen=True)
class Candidate:
    """One scheme of the what-if: its name (CLI or catalogue, the palette's key), label,
    scheme, one-worker profile, where that compute came from, the function pricing its
    messages on (topology, bandwidth, latency) -- None: the default link -- the default
    link's (bandwidth bytes/s, latency s), the contention shares (kappa, kappa_c) and the
    profile's per-worker batch."""

    name: str
    label: str
    scheme: pm.Scheme
    profile: pm.Profile
    source: str
    cost: Cost
    default_link: tuple[float, float]
    shares: tuple[float, float] = (0.0, 0.0)
    batch: int | None = None
    effects: pm.NodeEffects = pm.NodeEffects()


def flat_link_cost(cost: pm.LinkCost | None, algorithm: str, servers: int, what: str) -> Cost:
    """All p ranks on one link (a campaign's calibration: alpha, beta, gamma as fitted); the
    command line's bandwidth and latency replace beta = 1 / bandwidth and alpha."""
    def price(topology: pm.Topology, bandwidth: float | None, latency: float | None) -> pm.CommCost:
        if cost is None and (bandwidth is None or latency is None):
            raise WhatIfError(f"no calibration stored for {what}: give --bandwidth and --latency "
                              "(or run python -m launchers.calibrate)")
        link = pm.LinkCost(alpha=latency if latency is not None else cost.alpha,
                           beta=1.0 / bandwidth if bandwidth is not None else cost.beta,
                           gamma=cost.gamma if cost is not None else 0.0)
        return pm.comm_time_function(algorithm, topology.world_size, link, servers)
    return price


def cluster_cost(spec: ClusterSpec, scheme: pm.Scheme, transport: str | None,
                 servers: int | None = None) -> Cost:
    """The described cluster's hierarchy (`perfmodel.topology_cost`); the command line's
    bandwidth and latency replace the NIC's.  Servers: `servers`, else the file's, else one
    per node."""
    def price(topology: pm.Topology, bandwidth: float | None, latency: float | None) -> pm.CommCost:
        return pm.topology_cost(scheme, topology, spec.fabric(transport, bandwidth, latency),
                                servers or spec.servers or topology.nodes, spec.placement)
    return price


def cluster_candidates(spec: ClusterSpec, names: list[str], profile: pm.Profile, source: str, batch: int | None,
                       algorithm: str = "ring", servers: int | None = None,
                       jitter: float | None = None, model: str | None = None) -> list[Candidate]:
    """The study and catalogue schemes `names` on the described cluster, all on `profile`,
    with the cluster's node effects (`ClusterSpec.node_effects`; `jitter`: the profile's
    measured spread where the file gives none); a compressing scheme's bytes on the wire
    counted from `model`'s parameter shapes."""
    out = []
    link = (spec.inter.bandwidth, spec.inter.latency)
    for name in names:
        if name in CATALOGUE:
            scheme = catalogue_scheme(name, algorithm, servers)
            label, transport = scheme.name, catalogue.SCHEMES[name].transport
        else:
            info = priced_scheme(name)
            study = (gpu_scheme(info, list(get_model(model).parameter_shapes().values())) if info.wire and model
                     else STUDY_SCHEMES.get(name) or gpu_scheme(info))
            scheme, label, transport = study.scheme, study.label, study.transport
        out.append(Candidate(name, label, scheme, profile, source,
                             cluster_cost(spec, scheme, transport, servers), link, spec.contention, batch,
                             spec.node_effects(jitter)))
    return out


# --------------------------------------------------------------------------- the grid

ROW_KEYS = ("scheme", "label", "model", "profile", "nodes", "workers_per_node", "world_size", "batch_per_worker",
            "bandwidth", "latency", "iter_time_s", "t1_s", "comm_total_s", "comm_exposed_s", "speedup",
            "efficiency", "bottleneck")


def _link_text(bandwidth: float, latency: float) -> tuple[str, str]:
    return (format_bandwidth(bandwidth) if math.isfinite(bandwidth) and bandwidth > 0 else "inf",
            format_latency(latency) if latency > 0 else "0")


def evaluate(candidates: list[Candidate], nodes: list[int], workers_per_node: list[int],
             bandwidths: list[float | None], latencies: list[float | None], model: str) -> list[dict]:
    """Rows: candidate x workers per node x bandwidth x latency x nodes (ROW_KEYS); a
    bandwidth or latency of None is the candidate's own (calibrated, or the file's NIC)."""
    rows = []
    for cand in candidates:
        t_one = pm.single_worker_prediction(cand.profile).iter_time
        for per_node in workers_per_node:
            for bandwidth in bandwidths:
                for latency in latencies:
                    link = _link_text(bandwidth if bandwidth is not None else cand.default_link[0],
                                      latency if latency is not None else cand.default_link[1])
                    for count in nodes:
                        rows.append(_row(cand, pm.Topology(count, per_node), bandwidth, latency, t_one, link,
                                         model))
    return rows


def _row(cand: Candidate, topology: pm.Topology, bandwidth, latency, t_one: float, link: tuple[str, str],
         model: str) -> dict:
    p = topology.world_size
    if p > 1:
        comm = cand.cost(topology, bandwidth, latency)
        prediction = pm.predict_on(cand.profile, cand.scheme, comm, topology, cand.effects, *cand.shares)
    else:
        comm, prediction = pm.CommCost(), pm.single_worker_prediction(cand.profile)
    speedup = pm.speedup(t_one, prediction.iter_time, p)
    return {"scheme": cand.name, "label": cand.label, "model": model, "profile": cand.source,
            "nodes": topology.nodes, "workers_per_node": topology.workers_per_node, "world_size": p,
            "batch_per_worker": cand.batch, "bandwidth": link[0], "latency": link[1],
            "iter_time_s": prediction.iter_time, "t1_s": t_one, "comm_total_s": prediction.comm_total,
            "comm_exposed_s": prediction.comm_exposed, "speedup": speedup,
            "efficiency": pm.efficiency(speedup, p), "bottleneck": pm.bottleneck(prediction, comm)}


# --------------------------------------------------------------------------- output

DISPLAY_COLUMNS = ("scheme", "nodes", "workers_per_node", "world_size", "batch_per_worker", "bandwidth", "latency",
                   "iter_ms", "t1_ms", "comm_exposed_ms", "speedup", "efficiency", "bottleneck")


def json_lines(rows: list[dict]) -> str:
    """One JSON object per row (ROW_KEYS), one per line."""
    return "".join(json.dumps({key: row[key] for key in ROW_KEYS}) + "\n" for row in rows)


def frame(rows: list[dict]):
    """The rows as a pandas DataFrame (full precision, seconds): the CSV."""
    return pd.DataFrame([{key: row[key] for key in ROW_KEYS} for row in rows], columns=list(ROW_KEYS))


def display_table(rows: list[dict]):
    """The rows as people read them: times in milliseconds, the report's columns."""
    table = frame(rows)
    for column in ("iter", "t1", "comm_exposed"):
        table[f"{column}_ms"] = table[f"{column}_s" if column != "iter" else "iter_time_s"] * 1e3
    return table[list(DISPLAY_COLUMNS)]


def markdown(rows: list[dict]) -> str:
    """The table with the report's table code (`analysis.tables.to_markdown`)."""
    return tables.to_markdown(display_table(rows))


BOTTLENECK_MARKERS = {"compute": "o", "NIC": "s", "intra-node link": "^", "link latency": "v",
                      "per-message software cost": "D", "per-message cost": "D", "parameter server": "P",
                      "reduction": "X", "link": "s", "transport per-byte cost": "d", "coordination": "*",
                      "slowest worker": "<", "host link": ">"}


def efficiency_figure(rows: list[dict], path: Path, title: str) -> Path | None:
    """Efficiency against nodes, one line per scheme in its palette colour, one panel per
    workers per node x bandwidth x latency; each point's marker names its bottleneck.  A last
    panel holds the legends (scheme colours, bottleneck markers).  None without rows."""
    if not rows:
        return None
    from analysis import figures  # matplotlib and seaborn load only where a plot is drawn (--json, --no-files: never)

    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["workers_per_node"], row["bandwidth"], row["latency"]), []).append(row)
    fig, axes = figures.new_panels(len(groups) + 1)
    top = max(1.05, max(r["efficiency"] for r in rows) * 1.05)
    for ax, ((per_node, bandwidth, latency), panel) in zip(axes, groups.items()):
        nodes = sorted({r["nodes"] for r in panel})
        for name in dict.fromkeys(r["scheme"] for r in panel):
            line = sorted((r for r in panel if r["scheme"] == name), key=lambda r: r["nodes"])
            ax.plot([r["nodes"] for r in line], [r["efficiency"] for r in line], color=colour(name), linewidth=2)
            for what in dict.fromkeys(r["bottleneck"] for r in line):  # one call per marker: cheap to draw
                points = [r for r in line if r["bottleneck"] == what]
                ax.scatter([r["nodes"] for r in points], [r["efficiency"] for r in points], color=colour(name),
                           s=40, zorder=3, marker=BOTTLENECK_MARKERS.get(what, "o"))
        if len(nodes) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set(title=f"{per_node} worker{'s' if per_node > 1 else ''}/node, NIC {bandwidth}, latency {latency}",
               xlabel="nodes", ylabel="efficiency E = S / N (weak scaling)", ylim=(0, top))
        ax.grid(alpha=0.3, which="both")
    legend = axes[-1]
    legend.axis("off")
    lines = [figures.plt.Line2D([], [], color=colour(name), linewidth=2, label=name)
             for name in dict.fromkeys(r["scheme"] for r in rows)]
    markers = [figures.plt.Line2D([], [], linestyle="", marker=BOTTLENECK_MARKERS.get(what, "o"), color="black",
                                  label=what) for what in dict.fromkeys(r["bottleneck"] for r in rows)]
    legend.add_artist(legend.legend(handles=lines, title="scheme", loc="upper left", fontsize=9, frameon=False))
    legend.legend(handles=markers, title="marker: bottleneck", loc="upper right", fontsize=9, frameon=False)
    return figures.save_figure(fig, path, title)


def write_outputs(rows: list[dict], out: Path, stem: str, title: str) -> dict[str, Path]:
    """CSV (full precision), Markdown (the report's table code) and the PNG under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"csv": out / f"{stem}.csv", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    frame(rows).to_csv(written["csv"], index=False)
    written["md"].write_text(f"# {title}\n\n{markdown(rows)}", encoding="utf-8")
    efficiency_figure(rows, written["png"], title)
    return written
