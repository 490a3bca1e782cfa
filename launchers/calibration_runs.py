"""Calibration runs: start each framework's ranks in calibration mode (`launchers.calibrate`,
`compare --calibrate`), fit the timings (`analysis.calibration`) and store the fits with the
campaign.  See launchers/calibrate.py for what is measured and how."""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from adapters.base import RunConfig
from analysis.calibration import (CalibrationFit, default_sizes, drift_line, fit_calibration,
                                  fit_contention, format_points, link_gbps, pool_probes,
                                  pool_samples)
from analysis.store import StoreError, calibration_key, open_campaign
from analysis.units import UnitError, parse_size
from core.cli import fail, interrupt_on_termination
from core.envs import EnvBuildError
from launchers import plan as planning
from launchers.cluster import TransportError, transport_for
from launchers.interpreters import InterpreterError, Interpreters, parse_overrides, prepare_interpreters
from launchers.plan import link_tag, ranks_sharing_cores, set_cluster

CALIBRATION_MODEL = "alexnet-tiny"  # the trainer needs a network; the smallest that builds fast
# The contention probe's backward: a batch whose kernels, not the interpreter, fill the cores
# (at batch 1 a step is mostly Python overhead, nothing like a training step's).
CALIBRATION_BATCH = 16


def settings_from_args(args) -> dict:
    """Validate everything before anything starts (UsageError with one line)."""
    if args.repeats < 1 or args.warmup < 0:
        raise planning.UsageError("--repeats must be at least 1 and --warmup not negative")
    planning.positive_seconds(args.timeout, "--timeout")
    try:
        low, high = parse_size(args.min_bytes), parse_size(args.max_bytes)
    except UnitError as error:
        raise planning.UsageError(str(error)) from None
    if low < 4 or high < low or args.factor < 2:
        raise planning.UsageError("need 4 <= --min-bytes <= --max-bytes and --factor >= 2")
    frameworks = planning.parse_frameworks(args.frameworks)
    workers = planning.positive_ints(args.workers, "--workers")
    nodes = planning.positive_ints(args.nodes, "--nodes")
    servers = planning.positive_ints(args.servers, "--servers")
    links = SimpleNamespace(nodes=nodes, cluster="local", bandwidths=[None], latencies=[None])
    set_cluster(links, args)
    transport = transport_for(links.cluster)
    try:
        transport.check_calibration()
    except TransportError as error:
        raise planning.UsageError(str(error)) from None
    transport.check_machine()  # root for namespaces: before anything is built
    for info, mode in frameworks:
        if mode not in info.server_modes and min(workers) * min(nodes) < 2:
            raise planning.UsageError(f"{info.name}:{mode} needs at least 2 workers to time an all-reduce")
    device = planning.resolve_device(args.device, planning.gpu_count())
    options = planning.parse_options(getattr(args, "option", None))
    if device == "gpu" and max(workers) > planning.gpu_count() and not options.get("share_gpu"):
        raise planning.UsageError(f"--workers {max(workers)} needs {max(workers)} GPUs per node "
                                  f"({planning.SHARE_GPU_HINT})")
    return {"frameworks": frameworks, "workers": workers, "nodes": nodes, "servers": servers[0],
            "options": options, "python": parse_overrides(getattr(args, "python", None)),
            "sizes": default_sizes(low, high, args.factor), "repeats": args.repeats, "warmup": args.warmup,
            "device": device, "out": Path(args.out).resolve(), "timeout": args.timeout,
            "cluster": links.cluster, "bandwidths": links.bandwidths, "latencies": links.latencies}


def calibration_run(info, mode: str, nodes: int, workers: int, servers: int, settings: dict,
                    bandwidth: str | None = None, latency: str | None = None):
    """The RunConfig of one calibration (the worker's calibration mode)."""
    out = settings["out"]
    servers = servers if mode in info.server_modes else 0
    run_id = (f"calibrate-{info.name}-{mode}-{nodes}x{workers}" + (f"-ps{servers}" if servers else "")
              + "".join(f"-{prefix}{link_tag(value)}" for prefix, value in
                        (("bw", bandwidth), ("lat", latency)) if value))
    run_dir = out / "calibration" / run_id
    return RunConfig(run_id=run_id, framework=info.name, mode=mode, model=CALIBRATION_MODEL,
                     batch_per_worker=CALIBRATION_BATCH,
                     campaign=out.name, device=settings["device"], nodes=nodes, workers_per_node=workers,
                     servers=servers, warmup=0, iterations=1, repeats=1, profile_iterations=1,
                     bandwidth=bandwidth, latency=latency,
                     threads_per_worker=max(1, (os.cpu_count() or 1) // ranks_sharing_cores(
                         transport_for(settings.get("cluster")), nodes, workers)), rank_dir=str(run_dir),
                     record_path=str(run_dir / "calibration.json"), options=dict(settings.get("options") or {}),
                     calibrate={"sizes": settings["sizes"], "repeats": settings["repeats"],
                                "warmup": settings["warmup"]})


def fit_result(result: dict, info, mode: str, bandwidth: str | None = None, latency: str | None = None):
    """The CalibrationFit of one calibration run's result file."""

    scheme = result.get("comm_scheme") or {}
    servers = int(result.get("servers") or 0)
    algorithm = scheme.get("algorithm") or ("ps" if servers else "ring")
    fit = fit_calibration(
        {int(k): v for k, v in result["collective"].items()}, framework=info.name, mode=mode,
        transport=scheme.get("transport") or info.name, collective="pushpull" if algorithm == "ps" else "allreduce",
        algorithm=algorithm, device_kind=result.get("device", "cpu"), nodes=int(result["nodes"]),
        workers_per_node=int(result["workers_per_node"]), servers=servers,
        reduction_points={int(k): v for k, v in (result.get("reduction") or {}).items()} or None,
        bandwidth=bandwidth or "", latency=latency or "")
    kappa, kappa_c = fit_contention(result.get("contention"), scheme, fit)
    return replace(fit, contention=kappa, transfer_contention=kappa_c)


def calibrate(settings: dict, pythons: Interpreters, store, console, only_missing: bool = False,
              cluster=None, pool_since: str | None = None) -> list[str]:
    """Run, fit and store every calibration of `settings`; returns one line per failure.

    only_missing: skip framework/mode/topologies that already have a calibration stored.
    cluster: the transport placing the ranks (this machine when None); on one that shapes its
    links each bandwidth x latency of `settings` is calibrated on its own (links shaped first).
    pool_since (an ISO time): calibrate again only what was stored since then, and store the
    fit of both calibrations' timings pooled (`compare --calibrate`'s closing calibration).
    """
    cluster = cluster or transport_for(None)  # the default: this machine
    failures = []
    for info, mode in settings["frameworks"]:
        for nodes in settings["nodes"]:
            links = ([(b, lat) for b in settings.get("bandwidths", [None])
                      for lat in settings.get("latencies", [None])] if nodes > 1 else [(None, None)])
            for workers in settings["workers"]:
                for bandwidth, latency in links:
                    failures += calibrate_one(settings, pythons, store, console, only_missing, cluster,
                                              info, mode, nodes, workers, bandwidth, latency, pool_since)
    return failures


def calibrate_one(settings, pythons, store, console, only_missing, cluster, info, mode, nodes, workers,
                  bandwidth, latency, pool_since=None) -> list[str]:
    """One framework, topology and link setting: run, fit, store; [] or [failure line]."""
    if nodes * workers < 2 and mode not in info.server_modes:
        return []
    run = calibration_run(info, mode, nodes, workers, settings["servers"], settings, bandwidth, latency)
    stored = {calibration_key(c): c for c in store.calibrations()}
    previous = stored.get(calibration_key({
        "framework": info.name, "mode": mode, "device_kind": settings["device"], "nodes": nodes,
        "workers_per_node": workers, "servers": run.servers, "bandwidth": bandwidth, "latency": latency}))
    if pool_since is not None:  # the closing calibration: only what this campaign calibrated
        if previous is None or (previous.get("measured_at") or "") < pool_since:
            return []
    elif only_missing and previous is not None:
        return []
    else:
        previous = None
    Path(run.rank_dir).mkdir(parents=True, exist_ok=True)
    Path(run.record_path).unlink(missing_ok=True)
    links = "".join(f", {what} {value}" for what, value in (("bandwidth", bandwidth), ("latency", latency)) if value)
    console.print(f"{'closing calibration of' if previous else 'calibrating'} {info.name}:{mode} on "
                  f"{nodes}x{workers}{links} ({len(settings['sizes'])} sizes x {settings['repeats']} repeats)"
                  f"{', pooled with the one before the runs' if previous else ''} ...")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if not pythons.ready(info):
        failure = (f"{info.name}:{mode} {nodes}x{workers}: unavailable: its environment "
                   "cannot be built on this machine")
        console.print(f"[red]{failure}[/red]")
        return [failure]
    python, extra_env = pythons.python(info), pythons.rank_env(info)
    outcome, _ = cluster.launch(run, python, info.rendezvous, settings["timeout"], extra_env=extra_env)
    record = Path(run.record_path)
    if outcome.status != "ok" or not record.exists():
        tail = [line for line in (outcome.error or "no result written").splitlines() if line.strip()]
        failure = f"{info.name}:{mode} {nodes}x{workers}{links}: {outcome.status}: {tail[-1].strip() if tail else ''}"
        console.print(f"[red]{failure}[/red]")
        return [failure]
    result = json.loads(record.read_text())
    alone = fit_result(result, info, mode, bandwidth, latency)
    windows = [calibration_window(started, alone.fit_a_s, alone.fit_b_s_per_byte)]
    if previous:
        windows = (previous["extra"].get("windows") or [calibration_window(
            previous["measured_at"], previous["fit_a_s"], previous["fit_b_s_per_byte"])]) + windows
        result = pooled_result(result, previous, store)
        started = previous["measured_at"]
    fit = fit_result(result, info, mode, bandwidth, latency) if previous else alone
    points = {int(k): v for k, v in result["collective"].items()}
    store.add_calibration(fit, points, {int(k): v for k, v in (result.get("reduction") or {}).items()},
                          measured_at=started, env=result.get("env"),
                          extra={"comm_scheme": result.get("comm_scheme"),
                                 "loop_bytes": result.get("loop_bytes"),
                                 "contention": result.get("contention"),
                                 "device_name": result.get("device_name"), "windows": windows,
                                 "duration_s": outcome.duration_s, "cluster": settings.get("cluster", "local")})
    print(format_points(fit, points), flush=True)
    if previous:
        console.print(f"{info.name}:{mode} {nodes}x{workers}{links} after the runs: "
                      f"{drift_line(CalibrationFit.from_row(previous), alone)}; the pooled fit is used")
    return []


def calibration_window(measured_at: str, fit_a_s: float, fit_b_s_per_byte: float) -> dict:
    """One calibration's own fit, kept beside a pooled one (the report's drift columns)."""
    return {"measured_at": measured_at, "fit_a_s": fit_a_s, "fit_b_s_per_byte": fit_b_s_per_byte}


def pooled_result(result: dict, previous: dict, store) -> dict:
    """A calibration run's result with a stored calibration's timings (`store` row
    `previous`) added: collective and reduction samples pooled per size, contention probes
    pooled round by round (`analysis.calibration.pool_samples`, `pool_probes`)."""
    stored = {"collective": {}, "reduction": {}}
    for point in store.calibration_points(previous["calibration_id"]):
        stored[point["kind"]][int(point["bytes"])] = point["values"]
    return {**result,
            "collective": pool_samples(stored["collective"], result["collective"]),
            "reduction": pool_samples(stored["reduction"], result.get("reduction")) or None,
            "contention": pool_probes(previous["extra"].get("contention"), result.get("contention"))}


def calibrate_campaign(campaign, pythons: Interpreters, unavailable: dict, store, console,
                       cluster=None, pool_since: str | None = None) -> list[str]:
    """`compare --calibrate`: calibrate every framework of the campaign at each of its worker
    counts above one that has no calibration stored yet (default sizes, 10 repeats).
    Failures are printed and returned; the campaign goes on (its predictions then fall back
    to the runs' measured communication).  With `pool_since`, after the runs: calibrate again
    what was calibrated since then and keep the fit of both timings pooled."""
    settings = {"frameworks": [(info, mode) for info, mode in campaign.frameworks if info.name not in unavailable],
                "workers": campaign.workers, "nodes": campaign.nodes, "servers": campaign.servers[0],
                "sizes": default_sizes(), "repeats": 10, "warmup": 2, "device": campaign.device,
                "out": campaign.out, "timeout": campaign.timeout, "cluster": campaign.cluster,
                "options": campaign.options,
                "bandwidths": campaign.bandwidths, "latencies": campaign.latencies}
    return calibrate(settings, pythons, store, console, only_missing=True, cluster=cluster,
                     pool_since=pool_since)


def summary_lines(store) -> list[str]:
    """alpha, beta, gamma per stored transport, one line each."""
    lines = [f"{'framework':<18} {'mode':<10} {'transport':<9} {'p':>3} {'algorithm':<10} "
             f"{'alpha(us)':>9} {'beta(ns/B)':>10} {'link':>15} {'gamma(ns/B)':>11} {'rms err':>7}"]
    for c in store.calibrations():
        lines.append(f"{c['framework']:<18} {c['mode']:<10} {c['transport']:<9} {c['world_size']:>3} "
                     f"{c['algorithm']:<10} {c['alpha_s'] * 1e6:>9.2f} {c['beta_s_per_byte'] * 1e9:>10.4f} "
                     f"{link_gbps(c['beta_s_per_byte']):>15} {c['gamma_s_per_byte'] * 1e9:>11.4f} "
                     f"{c['rel_rmse'] * 100:>6.1f}%")
    return lines


def run_cli(args, argv: list[str]) -> int:
    """`python -m launchers.calibrate` after the re-exec: calibrate, store, print the fits."""
    console = Console(stderr=True)
    store = None
    try:
        settings = settings_from_args(args)
        planning.check_out_dir(settings["out"])
        store = open_campaign(settings["out"], wait=getattr(args, "wait", False),
                              repair=getattr(args, "repair", False),
                              log=lambda text: console.print(text, soft_wrap=True, markup=False))
        pythons = prepare_interpreters(  # a framework that cannot run here is said again in its turn
            settings["frameworks"], settings["python"], log=console.print,
            warn=lambda message: console.print(f"[yellow]{message}[/yellow]"))
        cluster = transport_for(settings["cluster"]).open(SimpleNamespace(
            nodes=settings["nodes"], bandwidths=settings["bandwidths"], latencies=settings["latencies"]))
    except StoreError as error:
        return fail(error, error.exit_code)
    except (planning.UsageError, InterpreterError, EnvBuildError, TransportError,
            KeyboardInterrupt) as error:
        if store is not None:
            store.close()
        if isinstance(error, KeyboardInterrupt):  # while waiting for the folder (--wait)
            console.print("[yellow]interrupted: nothing was calibrated[/yellow]")
            return 130
        return fail(error)
    interrupt_on_termination()  # like Ctrl-C: ranks killed, cluster removed
    with store, cluster:
        try:
            store.set_meta("calibration_command", "python -m launchers.calibrate " + shlex.join(argv))
            failures = calibrate(settings, pythons, store, console, cluster=cluster)
        except StoreError as error:  # a full disk: the calibrations stored before are kept
            return fail(error, error.exit_code)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: finished calibrations are stored[/yellow]")
            return 130
        print("\n".join(summary_lines(store)))
    print(f"stored in {settings['out'] / 'results.sqlite'}")
    return 1 if failures else 0
