"""Real nodes over ssh: `--cluster hostfile:FILE`.

The hostfile has one node per line, OpenMPI's style plus optional ssh settings:

    # comment
    node1 slots=4
    node2 slots=4 interface=ib0 user=alice port=22 identity=~/.ssh/id_ed25519
    node3 slots=4 config=~/cluster_ssh_config

`slots` defaults to 1; `interface` is the network interface the ranks use on that node (the
same name on every node; default: the framework picks); `address` overrides the address the
other nodes reach it by (default: the name, resolved here). ssh must work without a password
(keys; BatchMode is set, so a prompt is an error, not a hang), and the repository, the
framework environments (~/.cache/dlcompare) and the campaign folder must be at the same path
on every node, as a cluster's shared file system gives: rank 0 writes the record there.

Node names and addresses must be host names (letters, digits, '-', '_', dots; no leading
'-') or IP addresses, users and interfaces plain names: a hostfile is read before anything
runs (the dry run too), and a name that ssh could take for an option is bad input. The
destination is passed after `--` all the same.

Each process of a run is started as `ssh -- NODE 'cd REPO && echo $$ > PIDFILE; WATCH &
exec env VARS... ARGV'`: the environment the run sets travels on the command line (ssh passes
none), and sshd starts the command as the leader of a new session, so when the run ends
(success, failure, timeout, Ctrl-C) `finish` kills that whole process group on the node by
the pid the command wrote, because killing the local ssh client alone would leave the remote
ranks running. When the launcher cannot do that (it was killed, the connection was lost),
WATCH does it: it reads the session's stdin, which ssh carries from the launcher's lifeline
pipe (launchers/local.py), and kills the session's process group at its end-of-file, which
comes when the launcher or its ssh client is gone or the connection breaks.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from core.envs import REPO_ROOT
from launchers.cluster import Transport, TransportError
from launchers.rendezvous import Host

OPTIONS = ("slots", "interface", "address", "user", "port", "identity", "config")
# RFC 1123 host names (underscores allowed: ssh_config aliases use them), IPs separately
HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")  # IFNAMSIZ: 15 characters
# In the remote command: kill the session's process group ($$ leads it) when the session's
# stdin ends (the launcher or its ssh client gone, the connection lost). Its own output goes
# nowhere, or sshd would wait for it before closing the session. `kill -9 -PGID`: dash's kill
# takes no `--`.
REMOTE_WATCH = "exec 3<&0; (cat <&3 >/dev/null 2>&1; kill -9 -$$) >/dev/null 2>&1 &"


def valid_host(name: str) -> bool:
    """A host name or an IP address (what may follow `ssh --` and go into a hosts list)."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return 0 < len(name) <= 253 and all(HOST_LABEL.match(label) for label in name.split("."))
# Variables of this machine that make no sense on another one.
LOCAL_ONLY = ("PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "SSH_AUTH_SOCK", "SSH_CLIENT",
              "SSH_CONNECTION", "SSH_TTY", "TERM", "DISPLAY", "XDG_RUNTIME_DIR", "MAIL", "LS_COLORS")


@dataclass(frozen=True)
class Node:
    name: str
    slots: int = 1
    interface: str | None = None
    address: str = ""
    user: str = ""
    port: int = 0
    identity: str = ""
    config: str = ""  # an ssh_config file for this node (ssh -F)

    def ssh_options(self) -> list[str]:
        """ssh's options for this node (config file, identity, port, no prompts)."""
        options = ["-F", os.path.expanduser(self.config)] if self.config else []
        options += ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
                    "-o", "ConnectTimeout=20"]
        if self.port:
            options += ["-p", str(self.port)]
        if self.identity:
            options += ["-i", os.path.expanduser(self.identity)]
        return options

    def ssh(self) -> list[str]:
        """The ssh command that reaches this node, without the remote command; the
        destination after `--`, so that it can never be read as an option."""
        return ["ssh", *self.ssh_options(), "--", f"{self.user}@{self.name}" if self.user else self.name]


def read_hostfile(path: str) -> list[Node]:
    """The nodes of a hostfile; any malformed line is a TransportError naming file and line."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as error:
        raise TransportError(f"cannot read hostfile {path}: {error.strerror or error}") from None
    nodes = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *options = line.split()
        values = {}
        for option in options:
            key, sep, value = option.partition("=")
            if not sep or key not in OPTIONS or not value:
                raise TransportError(f"hostfile {path} line {number}: cannot read {option!r} "
                                   f"(expected NAME [{'=... '.join(OPTIONS)}=...])")
            values[key] = value
        for key in ("slots", "port"):
            if key in values:
                if not values[key].isdigit() or not 1 <= int(values[key]) <= (65535 if key == "port" else 10**6):
                    raise TransportError(f"hostfile {path} line {number}: {key} must be a positive "
                                       f"whole number, got {values[key]!r}")
                values[key] = int(values[key])
        check_names(path, number, name, values)
        if any(node.name == name for node in nodes):
            raise TransportError(f"hostfile {path} line {number}: node {name} listed twice")
        nodes.append(Node(name, **values))
    if not nodes:
        raise TransportError(f"hostfile {path} lists no node")
    return nodes


def check_names(path: str, number: int, name: str, values: dict) -> None:
    """The node's name, address, user and interface as ssh, the ranks and a shell will see
    them: a TransportError naming file and line otherwise."""
    checks = [("node name", name, valid_host), ("address", values.get("address"), valid_host),
              ("user", values.get("user"), USER_NAME.match),
              ("interface", values.get("interface"), INTERFACE_NAME.match)]
    for what, value, valid in checks:
        if value is not None and not valid(value):
            raise TransportError(f"hostfile {path} line {number}: {what} {value!r} is not a valid "
                               f"{'host name or address' if valid is valid_host else what}")


class SshCluster(Transport):
    """The hostfile's nodes, reached over ssh; see the module docstring."""

    kind = "hostfile"
    argument = "FILE"
    summary = "real nodes over ssh, one 'host slots=N' line per node"

    def __init__(self, path: str):
        self.path = path
        self.nodes: list[Node] = []
        self.addresses: dict[str, str] = {}
        self.started: dict[str, list[tuple[Node, Path]]] = {}

    @classmethod
    def from_argument(cls, argument: str) -> "SshCluster":
        return cls(argument)

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.path}"

    def validate(self, campaign) -> None:
        """The hostfile read now (a malformed one is bad input) and long enough for --nodes."""
        super().validate(campaign)
        listed = read_hostfile(self.path)
        if max(campaign.nodes) > len(listed):
            raise TransportError(f"--nodes {max(campaign.nodes)} but {self.path} lists "
                                 f"{len(listed)} node(s)")

    def open(self, campaign=None, dry_run: bool = False) -> "SshCluster":
        """The hostfile's nodes with the addresses they resolve to (named only on a dry run)."""
        self.nodes = read_hostfile(self.path)
        self.addresses = {node.name: node.address or (node.name if dry_run else _resolve(node.name))
                          for node in self.nodes}
        return self

    def hosts(self, run) -> list[Host]:
        if run.nodes > len(self.nodes):
            raise TransportError(f"run needs {run.nodes} nodes, the hostfile lists {len(self.nodes)}")
        return [Host(address=self.addresses[node.name], name=node.name, interface=node.interface,
                     slots=node.slots) for node in self.nodes[:run.nodes]]

    def wrappers(self, run) -> list:
        run_dir = Path(run.rank_dir)
        own = dict(os.environ)

        def wrap(spec, argv: list[str], env: dict[str, str]):
            node = next(n for n in self.nodes if n.name == spec.host.name)
            pidfile = run_dir / f"{spec.name}.remote-pid"
            self.started.setdefault(run.run_id, []).append((node, pidfile))
            env = dict(env)
            for name in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if node.interface:  # the node's network, not the launcher's loopback
                    env[name] = node.interface
                else:
                    env.pop(name, None)
            sent = {k: v for k, v in env.items() if own.get(k) != v and k not in LOCAL_ONLY}
            sent.setdefault("PYTHONPATH", env.get("PYTHONPATH", ""))
            unset = " ".join(f"-u {name}" for name in ("GLOO_SOCKET_IFNAME",) if name not in env)
            argv = forward_to_mpi_ranks(argv, sent, node)
            remote = (f"cd {shlex.quote(str(REPO_ROOT))} && echo $$ > {shlex.quote(str(pidfile))} "
                      f"|| exit 1; {REMOTE_WATCH} "
                      f"exec env {unset} {' '.join(f'{k}={shlex.quote(v)}' for k, v in sorted(sent.items()))} "
                      f"{shlex.join(argv)} 0</dev/null 3<&-")
            return [*node.ssh(), remote], env

        return [wrap]

    def prepare(self, run) -> dict:
        return {"cluster": self.kind, "hosts": [n.name for n in self.nodes[:run.nodes]]}

    def finish(self, run) -> None:
        """Kill what the run left on each node: the process group each command led."""
        self._kill_started(run.run_id)

    def _kill_started(self, run_id: str) -> None:
        for node, pidfile in self.started.pop(run_id, []):
            try:
                pid = int(pidfile.read_text().strip())
            except (OSError, ValueError):
                continue
            subprocess.run([*node.ssh(), f"kill -9 -{pid} 2>/dev/null; true"],
                           capture_output=True, timeout=60, stdin=subprocess.DEVNULL)

    def describe(self) -> list[str]:
        return [f"hostfile: {len(self.nodes)} nodes over ssh"] + [
            f"  {node.name} ({self.addresses[node.name]}) slots={node.slots}"
            + (f" interface={node.interface}" if node.interface else "") for node in self.nodes]

    def close(self) -> None:
        for run_id in list(self.started):
            self._kill_started(run_id)


def forward_to_mpi_ranks(argv: list[str], sent: dict[str, str], node: Node) -> list[str]:
    """mpirun's ranks on the other nodes get only what mpirun forwards: `-x NAME` for every
    variable the run sets, and mpirun's own ssh to the other nodes with this node's ssh
    settings (config file, identity, port)."""
    if not argv or Path(argv[0]).name != "mpirun":
        return argv
    forwarded = [item for name in sorted(sent) if not name.startswith("OMPI_")
                 for item in ("-x", name)]
    return [argv[0], *forwarded, "--mca", "plm_rsh_args", " ".join(node.ssh_options()), *argv[1:]]


def _resolve(name: str) -> str:
    """The node's address as this machine resolves it (ranks rendezvous on addresses)."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        raise TransportError(f"cannot resolve node {name!r} of the hostfile") from None
