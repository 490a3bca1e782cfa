"""Running a campaign: plan, environments, data, runs with progress, store, report.

Runs in the launcher's own environment (envs/host.txt). Each run's record is stored the moment
it ends, successful or not, so a crash, a timeout or Ctrl-C never loses what was measured.

Nothing measured is lost to a failing disk or store either: the campaign holds its folder's
lock (one campaign per folder; `--wait` queues behind the holder), checks the store when it
opens it, keeps each record in its run folder (``runs/<id>/record.json``) before storing it,
and stops at the first record it cannot store with one line and exit status 3; the next
campaign on the folder (or ``python -m analysis.report``) stores the records kept. A report
that cannot be written (a full disk, Ctrl-C) leaves every stored run as it was.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.base import RunConfig
from adapters.data import jpeg_dataset_dir, make_jpeg_dataset
from adapters.registry import framework_info
from analysis import noise
from analysis import trace
from analysis.predict import predict_stored
from analysis.record import empty_record
from analysis.report import build_report
from analysis.store import ResultStore, StoreError, open_campaign
from analysis.summary import print_summary
from core.cli import EXIT_INTERRUPTED, EXIT_NOT_WRITTEN, fail, interrupt_on_termination
from core.envs import REPO_ROOT, EnvBuildError, dlcompare_home
from core.files import write_json_atomic
from launchers import plan as planning
from launchers.calibration_runs import calibrate_campaign
from launchers.cluster import Transport, TransportError, transport_for
from launchers.container_runtime import ContainerImages
from launchers.dryrun import print_costs
from launchers.engine import find_engine
from launchers.images import ensure_image, image_for
from launchers.interpreters import InterpreterError, Interpreters, parse_overrides, prepare_interpreters
from models import get_model


def make_console(stream) -> Console:
    """Rich console; wide when writing to a log file so run ids and tables are not cut."""
    return Console(file=stream, width=None if stream.isatty() else 140)


console = make_console(sys.stderr)


def campaign_from_args(args) -> planning.Campaign:
    """Resolve the CLI's arguments into a Campaign, validating every one (UsageError)."""
    for name in ("iterations", "repeats", "profile_iterations"):
        if getattr(args, name) < 1:
            raise planning.UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.loader_workers < 0:
        raise planning.UsageError("--warmup and --loader-workers cannot be negative")
    planning.positive_seconds(args.timeout, "--timeout")
    gpus = planning.gpu_count()
    device = planning.resolve_device(args.device, gpus)
    workers = (planning.positive_ints(args.workers, "--workers") if args.workers is not None
               else planning.default_workers(device, gpus))
    models = planning.parse_models(args.model)
    campaign = planning.Campaign(
        frameworks=planning.parse_frameworks(args.frameworks),
        models=models,
        workers=workers,
        nodes=planning.positive_ints(args.nodes, "--nodes"),
        servers=planning.positive_ints(args.servers, "--servers"),
        batch_sizes=planning.parse_batch_sizes(args.batch_size, models),
        iterations=args.iterations, warmup=args.warmup, repeats=args.repeats,
        profile_iterations=args.profile_iterations, data=args.data, device=device,
        out=Path(args.out).resolve(), timeout=args.timeout, channels_last=args.channels_last,
        dropout=not args.no_dropout, seed=args.seed, loader_workers=args.loader_workers,
        fault=planning.parse_fault(args.inject_fault),
        git_revision=planning.git_revision(REPO_ROOT),
        runtime=getattr(args, "runtime", "local"),
        dtype=planning.parse_dtype(getattr(args, "dtype", None)),
        options=planning.parse_options(getattr(args, "option", None)),
        python=parse_overrides(getattr(args, "python", None)),
        launches=planning.launch_count(getattr(args, "launches", planning.DEFAULT_LAUNCHES)),
    )
    if campaign.runtime == "container" and campaign.python:
        raise planning.UsageError("--python names a local interpreter; with --runtime container "
                                  "every rank runs in its image's")
    if campaign.runtime == "container" and getattr(args, "calibrate", False):
        raise planning.UsageError("--calibrate runs on the local runtime only so far; "
                                  "calibrate first without --runtime container")
    planning.set_cluster(campaign, args)
    planning.check_batch_fits(campaign)
    planning.check_options(campaign)
    return campaign


def print_plan(campaign: planning.Campaign, runs: list[RunConfig], stored: set[str]) -> None:
    settings = Table(title="Campaign settings (every default resolved)", show_header=False)
    for key, value in planning.campaign_summary(campaign).items():
        settings.add_row(key, json.dumps(value) if not isinstance(value, str) else value)
    console.print(settings)
    launches = campaign.launches
    rounds = f" in {launches} rounds (order seed {campaign.seed})" if launches > 1 else ""
    table = Table(title=f"Plan: {len(runs)} runs{rounds}, {len(stored & {r.run_id for r in runs})} "
                        f"already stored (skipped)")
    for column in ("run", "framework", "model", "workers", "batch/worker", "launch", "state"):
        table.add_column(column)
    for run in runs:
        table.add_row(run.run_id, f"{run.framework}:{run.mode}", run.model,
                      f"{run.nodes}x{run.workers_per_node}", str(run.batch_per_worker),
                      f"{run.launch}/{launches}", "stored" if run.run_id in stored else "to run")
    console.print(table)
    beyond = sorted({k for k in map(planning.launch_in, stored) if k > launches})
    if beyond:
        console.print(f"[yellow]the store holds launch{'es' if len(beyond) > 1 else ''} "
                      f"{', '.join(map(str, beyond))} of some configurations, beyond --launches {launches}: "
                      f"they are kept, and the tables, the verdict and the report use launches 1-{launches}[/yellow]",
                      soft_wrap=True)


def prepare_environments(campaign: planning.Campaign):
    """(interpreters.Interpreters: each framework's python and the frameworks that cannot run
    here, their unavailable dict, the container images by env name or None): the framework's
    virtualenvs or the interpreters named with --python, or with --runtime container its images."""
    if campaign.runtime == "container":
        chosen, containers = prepare_images(campaign)
    else:
        chosen, containers = prepare_interpreters(
            campaign.frameworks, campaign.python, log=console.print, status=console.status,
            warn=lambda message: console.print(f"[yellow]{message}[/yellow]")), None
    return chosen, chosen.unavailable, containers


def prepare_images(campaign: planning.Campaign):
    """Build (once per inputs digest) or reuse each framework's image (launchers/images.py).

    The interpreters are the images' own. A framework without an image is reported and
    skipped; a failed build is an error (EnvBuildError)."""
    containers = ContainerImages(find_engine(log=console.print))
    chosen = Interpreters()
    for info, _ in campaign.frameworks:
        spec = image_for(info)
        if spec is None:
            chosen.unavailable[info.name] = "no container image for this framework yet"
            console.print(f"[yellow]{info.name}: cannot run in a container: "
                          f"{chosen.unavailable[info.name]}[/yellow]")
            continue
        image = next((built for built in containers.images.values() if built.spec == spec), None)
        if image is None:  # several environments share an image (torch, torch-mpi, horovod)
            with console.status(f"image {spec.name} for {info.name} ...") as status:
                image = ensure_image(containers.engine, spec, log=console.print,
                                     status=lambda text: status.update(f"image {spec.name}: {text}"))
            how = ("reused" if image.built_s is None else f"built in {image.built_s:.0f} s")
            console.print(f"image {image.tag} ({image.id[:19]}, "
                          f"{image.size / 2**20:.0f} MiB): {how}")
        containers.images[info.env] = image
        chosen.pythons[info.name] = spec.python
    return chosen, containers


def prepare_data(campaign: planning.Campaign, runs: list[RunConfig]) -> None:
    """Generate the JPEG data set each model needs (once, cached under DLCOMPARE_HOME)."""
    if campaign.data != "files":
        return
    for model in campaign.models:
        spec = get_model(model)
        largest = max(r.global_batch for r in runs if r.model == model)
        per_class = max(2, -(-max(256, 4 * largest) // spec.num_classes))
        root = jpeg_dataset_dir(dlcompare_home() / "data", spec, per_class, campaign.seed)
        with console.status(f"JPEG data set for {model} ..."):
            make_jpeg_dataset(root, spec, per_class, campaign.seed)
        for run in runs:
            if run.model == model:
                run.data_dir = str(root)


def failure_record(run: RunConfig, status: str, error: str, duration: float) -> dict:
    info = framework_info(run.framework)
    spec = get_model(run.model)
    return empty_record(
        run_id=run.run_id, campaign=run.campaign, config_hash=run.config_hash,
        framework=run.framework, framework_label=info.label, mode=run.mode,
        synchronous=int(run.mode in info.synchronous_modes), model=run.model,
        params=spec.total_params, flops=spec.total_flops, device_kind=run.device,
        nodes=run.nodes, workers_per_node=run.workers_per_node, world_size=run.world_size,
        servers=run.servers,
        batch_per_worker=run.batch_per_worker, global_batch=run.global_batch, scaling="weak",
        bandwidth=run.bandwidth, latency=run.latency,
        dtype=run.dtype, layout=run.layout, data=run.data, warmup=run.warmup,
        iterations=run.iterations, repeats=run.repeats,
        threads_per_worker=run.threads_per_worker, git_revision=run.git_revision,
        status=status, error=error, duration_s=duration)


def unavailable_record(run: RunConfig, error: str, duration: float = 0.0) -> dict:
    """A run this machine cannot host: stored as failed (so the report lists it with the
    reason) and marked, so it does not make the campaign's exit code non-zero."""
    record = failure_record(run, "failed", error, duration)
    record["extra"] = {"unavailable": True}
    return record


def execute(run: RunConfig, pythons: Interpreters, campaign: planning.Campaign,
            on_progress, cluster=None, containers=None) -> dict:
    """One run, its processes placed by the cluster transport (this machine by default),
    each in its framework's image when `containers` (container_runtime.ContainerImages) is
    given; always returns a record (ok or failure)."""
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    info = framework_info(run.framework)
    Path(run.record_path).unlink(missing_ok=True)
    (Path(run.record_path).parent / trace.TRACE_FILE).unlink(missing_ok=True)
    python, extra_env = pythons.python(info), pythons.rank_env(info)
    cluster = cluster or transport_for(None)  # the default: this machine
    runtime = containers.runtime_for(run, info.env, python) if containers else None
    try:
        # the image runs the command, the transport places the image on its node
        outcome, placed = cluster.launch(run, python, info.rendezvous, campaign.timeout, on_progress,
                                         extra_env=extra_env, wrappers=[runtime.wrap] if runtime else [])
    except (TransportError, ValueError, OSError) as error:  # the run cannot be placed
        record = failure_record(run, "failed", f"{type(error).__name__}: {error}", 0.0)
        record.update(started_at=started)
        return record
    finally:
        if runtime:
            runtime.remove()
    record = outcome_record(run, outcome)
    record.update(started_at=started, duration_s=outcome.duration_s)
    if placed:
        record["extra"] = {**(record.get("extra") or {}), **placed}
    if runtime:  # which image ran it: the digest of its content, and its name
        record["image_digest"] = runtime.image.id
        record.setdefault("extra", {}).update(runtime="container", image=runtime.image.tag)
    return record


def outcome_record(run: RunConfig, outcome) -> dict:
    """The run's record: rank 0's when it wrote one, else a failure record with the reason."""
    record_path = Path(run.record_path)
    if outcome.status == "ok" and record_path.exists():
        record = json.loads(record_path.read_text())
    elif outcome.status == "ok":
        record = failure_record(run, "failed", "rank 0 exited without writing a record",
                                outcome.duration_s)
    elif outcome.status == "unavailable":  # the adapter said why in one line (exit code 3)
        record = unavailable_record(run, outcome.error or "", outcome.duration_s)
    else:
        record = failure_record(run, outcome.status, outcome.error or "", outcome.duration_s)
    return record


class NotStored(Exception):
    """A measured run's record could not be stored (one line); `record` is None when it is
    kept in its run folder, else the record itself, kept nowhere yet."""

    def __init__(self, message: str, record: dict | None):
        super().__init__(message)
        self.record = record


def keep_record(run: RunConfig, record: dict) -> bool:
    """Write the record, as it is about to be stored, to the run folder's record.json
    (atomically: a full disk leaves rank 0's own record there, which is the same measurement).
    True when the run folder holds a record of the run afterwards."""
    path = Path(run.record_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)
    except OSError:
        pass  # a full disk: rank 0's own record, if it wrote one, is still there
    return path.exists()


def store_record(store: ResultStore, run: RunConfig, record: dict) -> None:
    """Keep the record in its run folder, then store it; NotStored when the store cannot
    take it (a full disk, a store damaged during the campaign)."""
    kept = keep_record(run, record)
    try:
        store.add(record)
    except StoreError as error:
        where = (f"its record is kept in {run.record_path} and is stored by the next run of "
                 f"this command (or python -m analysis.report {Path(run.rank_dir).parents[1]})"
                 if kept else "its record could not be kept either: it is printed on stdout")
        raise NotStored(f"{error}; run {run.run_id} was measured but not stored: {where}",
                        None if kept else record) from None


def run_all(campaign, pending, pythons, unavailable, store, cluster=None,
            containers=None) -> list[dict]:
    """Run the pending runs with a campaign bar and a per-run bar; store each record."""
    records = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("campaign", total=len(pending))
        for run in pending:
            task = progress.add_task(f"  {run.run_id}", total=None)

            def update(state, task=task):
                if state:
                    progress.update(task, completed=state[0], total=state[1])

            if run.framework in unavailable:
                record = unavailable_record(run, f"unavailable here: {unavailable[run.framework]}")
            else:
                record = execute(run, pythons, campaign, update, cluster, containers)
            record.setdefault("extra", {}).update(launch=run.launch, order_seed=campaign.seed)
            store_record(store, run, record)
            predicted = predict_stored(store, record, console)  # the performance model's prediction
            if predicted is not None:  # beside the measured ranks in the run's trace
                for problem in trace.update_model_process(campaign.out, [predicted]):
                    console.print(f"[yellow]{problem}[/yellow]")
            records.append(record)
            progress.update(task, description=f"  {run.run_id} [{record['status']}]")
            progress.remove_task(task) if record["status"] == "ok" else None
            progress.advance(overall)
            if record["status"] != "ok":
                console.print(f"[red]{run.run_id}: {record['status']}:[/red] "
                              f"{(record['error'] or '').splitlines()[0] if record['error'] else ''}")
    return records


def print_commands(campaign: planning.Campaign, runs: list[RunConfig], cluster: Transport) -> None:
    """--dry-run: what the transport says of itself and of each run (each node's commands and
    the environment each receives, or the job script)."""
    for line in cluster.describe():
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for run in runs:
        info = framework_info(run.framework)
        lines = cluster.commands(run, f"<{info.env} python>", info.rendezvous, campaign.timeout)
        if lines:
            console.print(f"[bold]{run.run_id}[/bold]")
            console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


def note(text: str) -> None:
    """A line about the campaign folder, printed as it is (paths and commands hold brackets)."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def say(text: str) -> None:
    """A closing message; a terminal that is gone (SIGHUP) does not turn it into a traceback."""
    try:
        console.print(text)
    except OSError:
        pass


def dry_run(campaign: planning.Campaign, runs: list[RunConfig], args) -> int:
    """The plan (on a cluster each node's commands) and what the campaign will cost, reading
    the store if there is one: nothing is written, so a folder without write access will do."""
    stored: set[str] = set()
    frame = pd.DataFrame()
    if (campaign.out / "results.sqlite").exists():
        with ResultStore.for_campaign(campaign.out, read_only=True) as store:
            stored = store.run_ids(status="ok" if args.retry_failed else None)
            frame = store.runs_frame()
    print_plan(campaign, runs, stored)
    print_commands(campaign, runs, campaign.transport.open(campaign, dry_run=True))
    print_costs(console, campaign, [run for run in runs if run.run_id not in stored], frame,
                getattr(args, "calibrate", False))
    console.print(resolving_power(campaign, frame), soft_wrap=True, markup=False, highlight=False)
    return 0


def resolving_power(campaign: planning.Campaign, frame: pd.DataFrame) -> str:
    """What difference between two schemes the chosen launches can resolve, at the noise
    between launches that the campaign's store has measured (analysis.noise)."""
    fitted = noise.campaign_noise(frame) if len(frame) else noise.UNKNOWN
    configurations = len(planning.configurations(campaign))
    if campaign.launches < 2:
        return "launches: 1 each, so the verdict cannot test a difference between schemes (--launches 2 or more)"
    if not fitted.known:
        return (f"launches: {campaign.launches} each; the store has no two launches of one configuration yet, so "
                "what they resolve is measured by this campaign (its report and verdict say it)")
    resolved = noise.resolvable_pct(fitted, campaign.launches, configurations)
    return (f"launches: {campaign.launches} each of {configurations} configurations resolve a difference of "
            f"{resolved:.0f}% with {100 * noise.POWER:.0f}% power at level {noise.LEVEL:g}, at the noise this "
            f"store has measured ({fitted.describe()})")


def run_campaign_cli(args, argv: list[str]) -> int:
    try:
        campaign = campaign_from_args(args)
        runs = planning.expand(campaign)
        if args.dry_run:
            return dry_run(campaign, runs, args)
        campaign.transport.check_machine()  # root for namespaces, Slurm's commands: before anything is built
        planning.check_out_dir(campaign.out)
        store = open_campaign(campaign.out, wait=getattr(args, "wait", False),
                              repair=getattr(args, "repair", False), log=note)
    except StoreError as error:
        return fail(error, error.exit_code)
    except (planning.UsageError, InterpreterError, EnvBuildError, TransportError) as error:
        return fail(error)
    except KeyboardInterrupt:  # while waiting for the folder (--wait)
        say("[yellow]interrupted: nothing was run[/yellow]")
        return EXIT_INTERRUPTED
    with store:  # the folder stays locked until the report is written
        return run_campaign(campaign, runs, store, args, argv)


def run_campaign(campaign: planning.Campaign, runs: list[RunConfig], store: ResultStore,
                 args, argv: list[str]) -> int:
    """Environments, data, the runs, the report, with the campaign folder locked."""
    interrupt_on_termination()  # SIGTERM and SIGHUP end the campaign like Ctrl-C
    cluster = containers = None
    try:
        stored = store.run_ids(status="ok") if args.retry_failed else store.run_ids()
        print_plan(campaign, runs, stored)
        pythons, unavailable, containers = prepare_environments(campaign)
        pending = [run for run in runs if run.run_id not in stored]
        prepare_data(campaign, pending)
        cluster = campaign.transport.open(campaign)
        store.set_meta("command", "python -m launchers.compare " + shlex.join(argv))
        store.set_meta("settings", planning.campaign_summary(campaign))
        calibrating = getattr(args, "calibrate", False)
        if calibrating:  # alpha, beta of each transport, where missing
            opened = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            calibrate_campaign(campaign, pythons, unavailable, store, console, cluster)
        for warning in filter(None, (cluster.latency_note(latency) for latency in campaign.latencies)):
            console.print(f"[yellow]{warning}[/yellow]", soft_wrap=True)
        records = run_all(campaign, pending, pythons, unavailable, store, cluster, containers)
        if calibrating and records:  # the same again after the runs, pooled (see pool_samples);
            # build_report below re-predicts every run with the pooled fits
            calibrate_campaign(campaign, pythons, unavailable, store, console, cluster, pool_since=opened)
    except (planning.UsageError, InterpreterError, EnvBuildError, TransportError) as error:
        return fail(error)
    except NotStored as error:
        if error.record is not None:  # the last place left to keep it
            print(json.dumps(error.record, default=str), flush=True)
        return fail(error, EXIT_NOT_WRITTEN)
    except StoreError as error:
        return fail(error, error.exit_code)
    except KeyboardInterrupt:
        say("[yellow]interrupted: stored runs are kept; run the same command again to resume[/yellow]")
        return EXIT_INTERRUPTED
    finally:
        for used in (cluster, containers):
            if used is not None:
                used.close()
    return report_and_summary(campaign, records)


def report_and_summary(campaign: planning.Campaign, records: list[dict]) -> int:
    """Tables, figures, report.html and the terminal summary; every run is stored by now, so
    a report that cannot be written (a full disk, Ctrl-C) costs only the report."""
    rebuild = f"every run is stored; python -m analysis.report {campaign.out} writes the report"
    try:
        report = build_report(campaign.out)
        print_summary(campaign.out, make_console(sys.stdout))
    except KeyboardInterrupt:
        say(f"[yellow]interrupted while writing the report: {rebuild}[/yellow]")
        return EXIT_INTERRUPTED
    except OSError as error:
        cause = f"{error.strerror}: {error.filename}" if error.strerror and error.filename else error
        return fail(f"report not written: {cause}; {rebuild}", EXIT_NOT_WRITTEN)
    except StoreError as error:
        return fail(f"report not written: {error}; {rebuild}", EXIT_NOT_WRITTEN)
    say(f"report: {report}")
    failed = [r for r in records
              if r["status"] != "ok" and not r.get("extra", {}).get("unavailable")]
    return 1 if failed else 0
