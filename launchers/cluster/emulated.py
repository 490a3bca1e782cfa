"""Emulated cluster: every node a network namespace on this host, links shaped with `tc`.

Layout (created by `up`, removed by `close`, all names carrying the owner's pid so that
`sweep` can find what a killed campaign left):

    bridge  dlc<pid>b  10.213.K.254/24 (this host's side; K picked free)
    node i  netns dlc-<pid>-n<i>, interface eth0 = 10.213.K.(i+1)/24, veth peer dlc<pid>v<i>
            on the bridge; /etc/netns/dlc-<pid>-n<i>/hosts names every node (`ip netns exec`
            bind-mounts it over /etc/hosts), and a process started there gets its own UTS
            namespace whose hostname is the node's name, so MPI and Horovod see distinct hosts
    helpers /tmp/dlc-<pid>-bin/{ssh,mpi-agent}: what horovodrun (ssh on PATH) and mpirun
            (OMPI_MCA_plm_rsh_agent) use to start processes on a node: enter its namespace

Shaping: an `htb` at `bandwidth` on both ends of each node's link (eth0 inside the namespace:
what the node sends; the bridge port: what it receives), TCP ACKs ahead of data (see
`link_qdiscs`), so every node has a full-duplex link of that rate to a non-blocking switch,
like the study's 56 Gbit/s InfiniBand ports.
Latency needs `netem`; where the kernel has it, half the one-way latency sits on each end,
where it does not the run goes on with bandwidth shaped only and says so (`latency_shaped`
in the record's extra). Runs of 1 node stay on the namespace's loopback (intra-node, like
shared memory on a real node).

Teardown is layered: `close()` (normal end, exceptions, Ctrl-C, SIGTERM), a reaper process
in its own session that tears down when this process dies however it dies (it waits on a
pipe only this process holds), and `sweep()` at the next campaign's start for leftovers of
owners that are gone.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from analysis.units import parse_bandwidth, parse_latency
from core.cli import OneLineParser
from launchers.cluster import Transport, TransportError
from launchers.local import start_reaper, stop_reaper, wait_for_owner
from launchers.rendezvous import Host

PREFIX = "dlc"
INTERFACE = "eth0"
MAX_NODES = 16
NETNS_RE = re.compile(rf"^{PREFIX}-(\d+)-n(\d+)$")
LINK_RE = re.compile(rf"^{PREFIX}(\d+)[bv]\d*$")
BIN_RE = re.compile(rf"^{PREFIX}-(\d+)-bin$")
ETC_NETNS = Path("/etc/netns")
SUBNET_BASE = "10.213"

# The stand-in for ssh (horovodrun) and mpirun's rsh agent: `NAME [ssh options] HOST CMD...`
# runs CMD through a shell inside node HOST's namespace, with the node's hostname.
AGENT = r"""#!/bin/sh
# dlcompare emulated cluster: start a command on node HOST (a network namespace on this host).
# Options may come before and after HOST, as OpenSSH accepts them (horovodrun puts -o after).
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host="$1"; shift; else break; fi ;;
  esac
done
case "$host" in *@*) host="${host#*@}" ;; esac
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def run_ip(*args: str, check: bool = True, namespace: str | None = None) -> subprocess.CompletedProcess:
    """`ip ARGS` (or `ip -n NS ARGS`); a failure is a TransportError with ip's own message."""
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise TransportError(f"{' '.join(command)}: {done.stderr.strip() or 'failed'}")
    return done


def run_tc(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["tc", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise TransportError(f"{' '.join(command)}: {done.stderr.strip() or 'failed'}")
    return done


def link_qdiscs(device: str, bytes_per_s: float, parent: str = "root") -> list[list[str]]:
    """`tc` commands shaping `device` to the rate: an htb whose two classes share it, pure
    TCP ACKs (IP packets under 64 bytes) first, everything else after them.

    One FIFO for both would queue the ACKs of the data a node receives behind the data it
    sends (a full-duplex all-reduce does both at once), stretch the round trip by the queue
    and stall TCP well below the rate; a real NIC and switch port do not, and a plain tbf
    measured 75-80% of the rate for a 2-node all-reduce. The bucket holds about 1 ms of
    traffic (at least 16 KiB, which the kernel's timer granularity needs): a larger one
    would let small messages pass at line speed and hide the rate from the α-β fit."""
    bits = int(bytes_per_s * 8)
    burst = str(max(16 * 1024, int(bytes_per_s / 1000)))
    ack_rate = max(8000, bits // 20)
    return [
        ["qdisc", "add", "dev", device, *(["root"] if parent == "root" else ["parent", parent]),
         "handle", "2:", "htb", "default", "20", "r2q", str(max(1, bits // 8 // 60000))],
        ["class", "add", "dev", device, "parent", "2:", "classid", "2:1", "htb", "rate", f"{bits}bit",
         "burst", burst, "cburst", burst],
        ["class", "add", "dev", device, "parent", "2:1", "classid", "2:10", "htb", "rate",
         f"{ack_rate}bit", "ceil", f"{bits}bit", "prio", "0", "burst", burst, "cburst", burst],
        ["class", "add", "dev", device, "parent", "2:1", "classid", "2:20", "htb", "rate",
         f"{bits - ack_rate}bit", "ceil", f"{bits}bit", "prio", "1", "burst", burst, "cburst", burst],
        ["qdisc", "add", "dev", device, "parent", "2:20", "handle", "20:", "pfifo", "limit", "10000"],
        ["filter", "add", "dev", device, "parent", "2:", "protocol", "ip", "prio", "1", "u32",
         "match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xffc0", "at", "2",
         "flowid", "2:10"],
    ]


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                          timeout=30)
    return [int(pid) for pid in done.stdout.split() if pid.isdigit()]


def kill_namespace_processes(namespace: str, timeout: float = 10.0) -> None:
    """SIGKILL every process inside the namespace, and wait until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = namespace_pids(namespace)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def leftovers(owner: int | None = None) -> dict[str, list[str]]:
    """Namespaces, links and helper folders of the emulated clusters of `owner` (a pid), or
    of every owner when None."""
    found = {"netns": [], "links": [], "dirs": []}

    def mine(match) -> bool:
        return match is not None and (owner is None or int(match.group(1)) == owner)

    if shutil.which("ip"):
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
        found["netns"] = [line.split()[0] for line in listed.stdout.splitlines()
                          if line.split() and mine(NETNS_RE.match(line.split()[0]))]
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30)
        for line in links.stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if mine(LINK_RE.match(name)):
                    found["links"].append(name)
    tmp = Path("/tmp")
    found["dirs"] = [str(p) for p in tmp.glob(f"{PREFIX}-*-bin") if mine(BIN_RE.match(p.name))]
    return found


def remove(found: dict[str, list[str]]) -> None:
    """Kill processes, delete namespaces (their veth ends go with them), links, folders."""
    for namespace in found["netns"]:
        kill_namespace_processes(namespace)
        run_ip("netns", "del", namespace, check=False)
        shutil.rmtree(ETC_NETNS / namespace, ignore_errors=True)
    for link in found["links"]:
        run_ip("link", "del", link, check=False)
    for folder in found["dirs"]:
        shutil.rmtree(folder, ignore_errors=True)


def sweep(log=None) -> list[str]:
    """Remove what emulated clusters of owners no longer running left behind (a campaign
    killed with SIGKILL before its reaper could act, a reaper killed too). Returns names."""
    if os.geteuid() != 0:
        return []
    found = leftovers()
    dead = {key: [name for name in names if not owner_alive(_owner_of(name))]
            for key, names in found.items()}
    names = [name for names in dead.values() for name in names]
    if names:
        remove(dead)
        if log:
            log(f"emulated cluster: removed leftovers of a killed campaign: {', '.join(names)}")
    return names


def _owner_of(name: str) -> int:
    base = Path(name).name
    for pattern in (NETNS_RE, LINK_RE, BIN_RE):
        match = pattern.match(base)
        if match:
            return int(match.group(1))
    return -1


def netem_available() -> bool:
    """Whether this kernel has sch_netem (tried on a throw-away veth pair)."""
    probe = f"{PREFIX}{os.getpid()}v99"
    if run_ip("link", "add", probe, "type", "veth", "peer", "name", f"{PREFIX}{os.getpid()}v98",
              check=False).returncode != 0:
        return False
    try:
        return run_tc("qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms",
                      check=False).returncode == 0
    finally:
        run_ip("link", "del", probe, check=False)


class EmulatedCluster(Transport):
    """`nodes` network namespaces on a private bridge; see the module docstring."""

    kind = "emulated"
    summary = "network namespaces on this host with links shaped by tc; root"
    max_nodes = MAX_NODES
    shapes_links = True
    nodes_share_this_machine = True

    def __init__(self, nodes: int = 0, owner: int | None = None, dry_run: bool = False):
        if nodes > MAX_NODES:
            raise TransportError(f"--cluster emulated runs at most {MAX_NODES} nodes on one host, "
                                 f"asked for {nodes}")
        self.nodes = nodes
        self.owner = owner or os.getpid()
        self.dry_run = dry_run
        self.subnet: str | None = None
        self.bin_dir = Path(f"/tmp/{PREFIX}-{self.owner}-bin")
        self.bridge = f"{PREFIX}{self.owner}b"
        self.shaped: tuple | None = None
        self.netem: bool | None = None
        self.reaper: subprocess.Popen | None = None
        self.created = False

    def check_machine(self) -> None:
        check_can_emulate()

    def open(self, campaign, dry_run: bool = False) -> "EmulatedCluster":
        """As many nodes as the campaign's largest run; netem probed when it asks for latency."""
        self.nodes, self.dry_run = max(campaign.nodes), dry_run
        if not dry_run:
            self.up()
            if any(campaign.latencies):
                self.netem = netem_available()
        return self

    # -- names ------------------------------------------------------------------------------

    def namespace(self, node: int) -> str:
        return f"{PREFIX}-{self.owner}-n{node}"

    def host_veth(self, node: int) -> str:
        return f"{PREFIX}{self.owner}v{node}"

    def address(self, node: int) -> str:
        return f"{self._prefix()}.{node + 1}"

    def _prefix(self) -> str:
        """10.213.K (K is picked when the cluster is created; a dry run shows 'K')."""
        return (self.subnet or f"{SUBNET_BASE}.K.0").rsplit(".", 1)[0]

    # -- life cycle -------------------------------------------------------------------------

    def up(self) -> None:
        """Create the bridge, the namespaces and their links; start the reaper."""
        check_can_emulate()
        sweep()
        self.subnet = free_subnet()
        self._start_reaper()
        self.created = True
        try:
            run_ip("link", "add", self.bridge, "type", "bridge")
            run_ip("addr", "add", f"{self._prefix()}.254/24", "dev", self.bridge)
            run_ip("link", "set", self.bridge, "up")
            hosts_file = "127.0.0.1 localhost\n" + "".join(
                f"{self.address(i)} {self.namespace(i)}\n" for i in range(self.nodes))
            for node in range(self.nodes):
                self._add_node(node, hosts_file)
            self._write_helpers()
        except BaseException:
            self.close()
            raise

    def _add_node(self, node: int, hosts_file: str) -> None:
        namespace, veth = self.namespace(node), self.host_veth(node)
        run_ip("netns", "add", namespace)
        etc = ETC_NETNS / namespace
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        run_ip("link", "add", veth, "type", "veth", "peer", "name", INTERFACE, "netns", namespace)
        run_ip("link", "set", veth, "master", self.bridge)
        run_ip("link", "set", veth, "up")
        run_ip("addr", "add", f"{self.address(node)}/24", "dev", INTERFACE, namespace=namespace)
        run_ip("link", "set", INTERFACE, "up", namespace=namespace)
        run_ip("link", "set", "lo", "up", namespace=namespace)
        tune_tcp(namespace)

    def _write_helpers(self) -> None:
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for name in ("ssh", "mpi-agent"):
            path = self.bin_dir / name
            path.write_text(AGENT)
            path.chmod(0o755)

    def _start_reaper(self) -> None:
        """A process that removes this cluster once this process is gone, however it ends
        (launchers.local.start_reaper)."""
        self.reaper = start_reaper("launchers.cluster.emulated", str(self.owner))

    def close(self) -> None:
        """Kill every process inside the nodes, remove namespaces, links and helpers."""
        if not self.created:
            return
        remove(leftovers(self.owner))
        self.created = False
        stop_reaper(self.reaper)  # nothing left to reap
        self.reaper = None

    # -- shaping ----------------------------------------------------------------------------

    def prepare(self, run) -> dict:
        """Shape the links for the run's bandwidth and latency (unchanged ones are kept);
        returns facts for the record's extra."""
        wanted = (run.bandwidth, run.latency)
        if self.dry_run:
            return {}
        if wanted != self.shaped:
            self.shape(run.bandwidth, run.latency)
            self.shaped = wanted
        return {"cluster": "emulated", "emulated_subnet": self.subnet,
                "latency_shaped": bool(run.latency) and bool(self.netem)}

    def shape(self, bandwidth: str | None, latency: str | None) -> None:
        rate = parse_bandwidth(bandwidth) if bandwidth else None
        delay = parse_latency(latency) if latency else 0.0
        if delay and self.netem is None:
            self.netem = netem_available()
        for node in range(self.nodes):
            for device, namespace in ((INTERFACE, self.namespace(node)), (self.host_veth(node), None)):
                run_tc("qdisc", "del", "dev", device, "root", namespace=namespace, check=False)
                parent = "root"
                if delay and self.netem:
                    run_tc("qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay",
                           f"{delay / 2 * 1e6:.1f}us", namespace=namespace)
                    parent = "1:1"
                for command in link_qdiscs(device, rate, parent) if rate else []:
                    run_tc(*command, namespace=namespace)

    def finish(self, run) -> None:
        """After each run: nothing may stay inside a node (the local transport already killed
        the run's process group and descendants; this catches anything that escaped both)."""
        if self.created:
            for node in range(self.nodes):
                kill_namespace_processes(self.namespace(node))

    def traffic(self) -> list[int]:
        """Bytes each node has sent through its shaped link so far (its eth0's counter):
        the record keeps the run's difference, the proof its ranks talked across nodes."""
        if self.dry_run or not self.created:
            return []
        sent = []
        for node in range(self.nodes):
            path = f"/sys/class/net/{INTERFACE}/statistics/tx_bytes"
            done = subprocess.run(["ip", "netns", "exec", self.namespace(node), "cat", path],
                                  capture_output=True, text=True, timeout=30)
            sent.append(int(done.stdout.strip() or 0))
        return sent

    def latency_note(self, latency: str | None) -> str | None:
        if latency and self.netem is False:
            return (f"latency {latency} asked, but this kernel has no netem (sch_netem): only "
                    "bandwidth is shaped; the records say latency_shaped: false")
        return None

    # -- placing processes ------------------------------------------------------------------

    def hosts(self, run) -> list[Host]:
        return [Host(address=self.address(i), name=self.namespace(i), interface=INTERFACE,
                     slots=run.workers_per_node) for i in range(run.nodes)]

    def wrappers(self, run) -> list:
        return [self.wrap]

    def wrap(self, spec, argv: list[str], env: dict[str, str]):
        """Start the process inside its node's namespace, with the node's hostname, its
        ranks on the node's interface, and mpirun's / horovodrun's way to the other nodes."""
        namespace = spec.host.name
        argv = ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', namespace, *argv]
        env = {**env, "GLOO_SOCKET_IFNAME": INTERFACE, "TP_SOCKET_IFNAME": INTERFACE,
               "NCCL_SOCKET_IFNAME": INTERFACE, "HOROVOD_GLOO_IFACE": INTERFACE,
               "OMPI_MCA_plm_rsh_agent": str(self.bin_dir / "mpi-agent"),
               "PATH": f"{self.bin_dir}:{env.get('PATH', os.defpath)}"}
        return argv, env

    def describe(self) -> list[str]:
        lines = [f"emulated: {self.nodes} network namespaces on bridge {self.bridge} "
                 f"({self._prefix()}.0/24), links shaped by tc htb per run"]
        lines += [f"  node {i}: netns {self.namespace(i)}  {INTERFACE} {self.address(i)}"
                  for i in range(self.nodes)]
        return lines


def tune_tcp(namespace: str) -> None:
    """No TCP slow start after idle inside the node (net.ipv4 is per network namespace): a
    data-parallel job sends a burst per iteration after a compute pause, and restarting from
    a small window each time would add a round-trip-bound ramp to every message. Cluster
    nodes for distributed training are commonly tuned this way; best effort."""
    subprocess.run(["ip", "netns", "exec", namespace, "sysctl", "-q", "-w",
                    "net.ipv4.tcp_slow_start_after_idle=0"], capture_output=True, timeout=30)


def check_can_emulate() -> None:
    """Root and the tools, or one line saying what is missing."""
    if os.geteuid() != 0:
        raise TransportError("--cluster emulated creates network namespaces and shapes links: "
                           "it needs root (run as root, or use --cluster hostfile:FILE / slurm)")
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        raise TransportError(f"--cluster emulated needs {', '.join(missing)} "
                           "(Debian: apt-get install iproute2 util-linux)")


def free_subnet() -> str:
    """A 10.213.K.0/24 no interface of this host's namespace uses (another campaign's bridge)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                          timeout=30).stdout
    taken = set()
    for match in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/(\d+)", used):
        taken.add(ipaddress.ip_interface(f"{match.group(1)}/{match.group(2)}").network)
    for k in range(1, 255):
        candidate = ipaddress.ip_network(f"{SUBNET_BASE}.{k}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return f"{SUBNET_BASE}.{k}.0"
    raise TransportError(f"no free {SUBNET_BASE}.K.0/24 subnet for the emulated cluster")


def reap(owner: int) -> int:
    """The reaper: once the owner is gone (or has closed its cluster), remove whatever of its
    cluster is left."""
    wait_for_owner(owner, done=lambda: not any(leftovers(owner).values()))
    remove(leftovers(owner))
    return 0


def main(argv: list[str]) -> int:
    """`python -m launchers.cluster.emulated sweep|reap PID|list`."""
    parser = OneLineParser(prog="python -m launchers.cluster.emulated",
                           description="What emulated clusters left on this host.")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("sweep", help="remove every leftover of a dead campaign")
    sub.add_parser("list", help="list namespaces, links and bridges of emulated clusters")
    reaper = sub.add_parser("reap", help="(internal) remove what campaign PID made once it ends")
    reaper.add_argument("pid", type=int)
    args = parser.parse_args(argv)
    if args.action == "reap":
        return reap(args.pid)
    if args.action == "sweep":
        names = sweep(log=print)
        print(f"removed {len(names)} leftover(s)")
        return 0
    for key, names in leftovers().items():
        print(key, " ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
