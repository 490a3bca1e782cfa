"""Cluster transports: where the processes of a run are placed (`--cluster`).

Each module of this package holds one transport: a subclass of `Transport` with its `kind`,
the word `--cluster` names it by. `transports()` finds them, so a new transport (Kubernetes,
say) is one new file here and nothing else (docs/adding-a-transport.md); `dlcompare run
--help` lists them with their summaries.

The contract has the shape of Lightning's `ClusterEnvironment`: facts as class attributes and
hooks with defaults here, called by the campaign (launchers/campaign.py), the plan
(launchers/plan.py) and the calibration (launchers/calibration_runs.py), which know no
transport by name. In the order they are called:

  parse        `from_argument(text)`: the transport from what follows `KIND:` in --cluster
  validate     `validate(campaign)`: the campaign's nodes and link shaping this transport can
               give, its own input (a hostfile) read: bad input, before anything runs
               (`check_calibration()` besides for `launchers.calibrate`)
  pre-check    `check_machine()`: what this machine needs (root, tools), before anything is
               built or stored (not on a dry run)
  set up       `open(campaign, dry_run)`: create what the campaign's runs need (namespaces,
               resolved addresses); on a dry run name it only
  per run      `launch(run, ...)` calls `prepare(run)` (link shaping: facts for the record's
               extra), `start(...)` (place and run the processes; default: the local launcher,
               launchers/local.py, with `hosts(run)` and `wrappers(run)`), `traffic()` before
               and after (bytes each node sent), and always `finish(run)` (what a run left on
               other nodes)
  dry run      `describe()` and `commands(run, ...)`: the lines --dry-run prints
  notes        `latency_note(latency)`: a line when the asked latency cannot be shaped
  end          `close()`: remove what `open` created (also on Ctrl-C: used as a context manager)

`start` gets a run's processes from its framework's rendezvous (launchers/rendezvous/) and
places each through `hosts(run)` (one `Host` per node: address, launcher name, interface) and
`wrappers(run)` (command wrappers such as `ip netns exec NS ...` or `ssh NODE ...`), so every
framework runs unchanged on any transport, and a container runtime's wrapper composes with
them (innermost first).

This package is read before the command moves into the launcher's environment (the parsers'
--help lists the transports), so its modules import only the standard library and the
project's standard-library modules at their top; what needs more is imported where it is used.
"""

from __future__ import annotations

import importlib
import pkgutil
import shlex
from functools import cache
from pathlib import Path
from typing import ClassVar

from core.envs import REPO_ROOT
from launchers.rendezvous import Host

DEFAULT_TRANSPORT = "local"  # --cluster when not given: this machine


class TransportError(ValueError):
    """Bad --cluster input or a transport that cannot be used here; one line for the CLI."""


class Transport:
    """Where a campaign's processes run; see the module docstring for when each hook is called.

    `campaign` in the hooks is a launchers.plan.Campaign, or anything with its `nodes`,
    `bandwidths` and `latencies` lists (the calibration's settings); `run` is a RunConfig."""

    kind: ClassVar[str] = ""  # the --cluster word; a subclass without one is not registered
    argument: ClassVar[str | None] = None  # what follows `KIND:` (e.g. "FILE"), None: nothing
    summary: ClassVar[str] = ""  # one line for --help
    max_nodes: ClassVar[int] = 10 ** 6  # nodes a run may have
    shapes_links: ClassVar[bool] = False  # --bandwidth / --latency set its links
    # Its nodes share this machine's cores, so a rank's threads are this machine's cores over
    # the run's workers on every node (else over the workers of one node).
    nodes_share_this_machine: ClassVar[bool] = False

    # -- parse ------------------------------------------------------------------------------

    @classmethod
    def syntax(cls) -> str:
        """How --cluster spells it: `KIND` or `KIND:ARGUMENT`."""
        return f"{cls.kind}:{cls.argument}" if cls.argument else cls.kind

    @classmethod
    def from_argument(cls, argument: str) -> "Transport":
        """The transport of `--cluster KIND:ARGUMENT` (ARGUMENT empty for a transport that takes
        none; `transport_for` has checked it is given exactly when `argument` is set)."""
        return cls()

    @property
    def label(self) -> str:
        """What --cluster said, as the plan prints and stores it."""
        return self.kind

    def identity(self, bandwidth: str | None, latency: str | None) -> dict:
        """What this transport adds to a run's configuration hash (where the nodes are and
        how they are linked change what is measured)."""
        return {"cluster": self.kind, "bandwidth": bandwidth, "latency": latency}

    # -- validate and pre-check ---------------------------------------------------------------

    def validate(self, campaign) -> None:
        """The campaign's nodes and link shaping, checked against what this transport gives
        (TransportError; the plan turns it into bad input)."""
        shaped = list(campaign.bandwidths) != [None] or list(campaign.latencies) != [None]
        if shaped and not self.shapes_links:
            shaping = " or ".join(f"--cluster {t.syntax()}" for t in transports().values()
                                  if t.shapes_links)
            raise TransportError(f"--bandwidth and --latency shape the links of {shaping}; "
                                 f"the network of --cluster {self.label} is what it is")
        if max(campaign.nodes) > self.max_nodes:
            raise TransportError(f"--cluster {self.label} runs at most {self.max_nodes} nodes, "
                                 f"asked for {max(campaign.nodes)}")

    def check_calibration(self) -> None:
        """TransportError when `launchers.calibrate` cannot run through this transport."""

    def check_machine(self) -> None:
        """What this machine needs for the transport (root, tools): TransportError in one
        line, before anything is built or stored."""

    # -- set up, place, run ------------------------------------------------------------------

    def open(self, campaign, dry_run: bool = False) -> "Transport":
        """Create what the campaign's runs need; on a dry run only name it. Returns self."""
        return self

    def hosts(self, run) -> list[Host]:
        """One Host per node of the run (default: this machine, loopback)."""
        return [Host()] * run.nodes

    def wrappers(self, run) -> list:
        """Command wrappers placing each process on its node (launchers.local.CommandWrapper)."""
        return []

    def prepare(self, run) -> dict:
        """Set what this run changes (link shaping); facts for the record's extra."""
        return {}

    def start(self, run, python: str, rendezvous: str, timeout: float, on_progress=None,
              extra_env: dict[str, str] | None = None, wrappers=()):
        """Start the run's processes, wait for them (or the first failure, or the timeout) and
        return its launchers.local.RunOutcome; `wrappers` (a container runtime's) go inside
        the transport's own. Default: the local launcher with `hosts` and `wrappers`."""
        # the local launcher needs psutil, from the launcher's environment
        from launchers.local import run_local

        return run_local(run, python, Path(run.rank_dir), rendezvous, REPO_ROOT, timeout,
                         on_progress, extra_env=extra_env, hosts=self.hosts(run),
                         wrappers=[*wrappers, *self.wrappers(run)])

    def finish(self, run) -> None:
        """After each run, however it ended: remove what it may have left on other nodes."""

    def traffic(self) -> list[int]:
        """Bytes each node has sent so far over its link ([]: not counted); the record keeps
        each run's difference."""
        return []

    def launch(self, run, python: str, rendezvous: str, timeout: float, on_progress=None,
               extra_env: dict[str, str] | None = None, wrappers=()):
        """One run through this transport: prepare, start, finish (always). Returns its
        outcome and the facts for its record's extra (with the bytes each node sent)."""
        try:
            placed = self.prepare(run)
            sent_before = self.traffic()
            outcome = self.start(run, python, rendezvous, timeout, on_progress, extra_env, wrappers)
            if sent_before:
                placed["link_bytes_sent"] = [after - before for after, before in
                                             zip(self.traffic(), sent_before)][:run.nodes]
        finally:
            self.finish(run)
        return outcome, placed

    # -- dry run, notes, end -----------------------------------------------------------------

    def describe(self) -> list[str]:
        """What the dry run says about the transport before the runs' commands."""
        return [f"{self.label}: {self.summary}"]

    def commands(self, run, python: str, rendezvous: str, timeout: float) -> list[str]:
        """What the dry run prints for one run: each process with where it runs, its command
        and the environment it gets beyond this process's own."""
        # planning the commands reads the local launcher, which needs psutil (launcher's environment)
        from launchers.local import planned_commands

        try:
            placed = planned_commands(run, python, rendezvous, REPO_ROOT, hosts=self.hosts(run),
                                      wrappers=self.wrappers(run))
        except (ValueError, RuntimeError) as error:
            return [f"  cannot place: {error}"]
        lines = []
        for spec, argv, env in placed:
            shown = {k: v for k, v in sorted(env.items()) if k != "PATH"}
            lines += [f"  {spec.name} on {spec.host.target}: {shlex.join(argv)}",
                      "    env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())]
        return lines

    def latency_note(self, latency: str | None) -> str | None:
        """A warning line when `latency` was asked but cannot be shaped, else None."""
        return None

    def close(self) -> None:
        """Remove what `open` created."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@cache
def transports() -> dict[str, type[Transport]]:
    """Every transport by kind, the default first, then by kind: the `Transport` subclass each
    module of this package defines with a `kind` of its own."""
    found: dict[str, type[Transport]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, Transport)
                    and value.__module__ == module.__name__ and "kind" in vars(value)):
                if value.kind in found:
                    raise TypeError(f"two transports of kind {value.kind!r}: "
                                    f"{found[value.kind].__module__} and {value.__module__}")
                found[value.kind] = value
    return dict(sorted(found.items(), key=lambda item: (item[0] != DEFAULT_TRANSPORT, item[0])))


def transport_for(text: str | None) -> Transport:
    """The transport `--cluster` names (`KIND` or `KIND:ARGUMENT`); TransportError otherwise."""
    text = (text or DEFAULT_TRANSPORT).strip()
    kind, colon, argument = text.partition(":")
    chosen = transports().get(kind.strip())
    argument = argument.strip()
    if chosen is None or bool(chosen.argument) != bool(argument) or (colon and not chosen.argument):
        known = ", ".join(t.syntax() for t in transports().values())
        raise TransportError(f"--cluster takes {known}; got {text!r}")
    return chosen.from_argument(argument)


def cluster_help() -> str:
    """--cluster's help: every transport with its summary."""
    return "where the nodes are: " + "; ".join(
        f"{t.syntax()} ({t.summary})" for t in transports().values()) + \
        f" (default: {DEFAULT_TRANSPORT})"
