"""Multi-node transports for real: network namespaces, tc-shaped links, sshd, Slurm.

The emulated cluster needs root (CI runs as root); without it these tests are skipped with
the reason, and the one-line error a user gets is checked instead.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, cli_command, default_sigint, run_cli, worker_processes

FAST = ["--iterations", "3", "--repeats", "2", "--warmup", "1", "--profile-iterations", "1"]
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="network namespaces and tc need root")


def cluster_leftovers() -> dict:
    """Namespaces, links and helper folders of emulated clusters whose campaign has ended
    (a campaign still running elsewhere on this machine is not a leftover)."""
    from launchers.cluster.emulated import _owner_of, leftovers, owner_alive

    orphans = {key: [name for name in names if not owner_alive(_owner_of(name))]
               for key, names in leftovers().items()}
    return {key: names for key, names in orphans.items() if names}


def stored(out: Path) -> list[dict]:
    with sqlite3.connect(out / "results.sqlite") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM runs ORDER BY run_id")]


def error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("dlcompare: error: ")
    return lines[0]


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args,needle", [
    (["--cluster", "moon"], "--cluster takes"),
    (["--nodes", "2"], "cluster transport"),
    (["--bandwidth", "1Gbit"], "emulated"),
    (["--cluster", "emulated", "--nodes", "2", "--bandwidth", "fast"], "cannot read bandwidth"),
    (["--cluster", "emulated", "--nodes", "2", "--latency", "3 parsecs"], "cannot read latency"),
    (["--cluster", "emulated", "--nodes", "32"], "at most 16"),
])
def test_bad_cluster_input_is_one_line_and_exit_2(tmp_path, args, needle):
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--out", str(tmp_path / "c"), *args, timeout=120)
    assert needle in error_line(result)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("text,needle", [
    ("node1 slots=2\nnode2 slots=two\n", "line 2"),
    ("node1 slots=2 colour=blue\n", "line 1"),
    ("# only a comment\n", "no node"),
    ("node1\nnode1\n", "twice"),
])
def test_malformed_hostfile_is_one_line_and_exit_2(tmp_path, text, needle):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "2", "--cluster", f"hostfile:{hostfile}",
                     "--out", str(tmp_path / "c"), timeout=120)
    line = error_line(result)
    assert needle in line and str(hostfile) in line


def test_missing_hostfile_is_one_line_and_exit_2(tmp_path):
    result = run_cli("launchers.compare", "--nodes", "2", "--cluster",
                     f"hostfile:{tmp_path / 'absent'}", "--out", str(tmp_path / "c"), timeout=120)
    assert "cannot read hostfile" in error_line(result)


@pytest.mark.skipif(ROOT, reason="the error is for users without root")
def test_emulated_without_root_is_one_line(tmp_path):
    result = run_cli("launchers.compare", "--nodes", "2", "--cluster", "emulated",
                     "--model", "alexnet-tiny", "--out", str(tmp_path / "c"), timeout=600)
    assert "needs root" in error_line(result)
    assert not (tmp_path / "c").exists()  # said before anything was built or stored


def test_dry_run_prints_each_nodes_commands_and_environment(tmp_path):
    result = run_cli("launchers.compare", "--frameworks", "torch,tf:collective,mxnet:dist_sync,"
                     "caffe-mpi-style,horovod:gloo", "--model", "alexnet-tiny", "--nodes", "2",
                     "--workers", "1", "--cluster", "emulated", "--bandwidth", "1Gbit,10Gbit",
                     "--latency", "0.2ms", "--out", str(tmp_path / "c"), "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stderr
    assert "-bw1Gbit-lat0.2ms-" in text and "-bw10Gbit-lat0.2ms-" in text  # sweep dims in run ids
    assert "worker1 on dlc-" in text and "ip netns exec dlc-" in text
    assert "MASTER_ADDR=10.213.K.1" in text and "GLOO_SOCKET_IFNAME=eth0" in text
    assert "TF_CONFIG=" in text and "DMLC_PS_ROOT_URI=10.213.K.1" in text
    assert "DMLC_INTERFACE=eth0" in text and "OMPI_MCA_plm_rsh_agent=" in text
    assert "btl_tcp_if_include eth0" in text and "horovod.runner.launch" in text
    assert not (tmp_path / "c").exists()  # a dry run creates and stores nothing


# --------------------------------------------------------------------------- emulated, real runs

def sweep_leftovers():
    """Nothing of an earlier failed test may confuse the next."""
    from launchers.cluster.emulated import sweep

    sweep()


@needs_root
@pytest.mark.slow
def test_every_framework_on_two_emulated_nodes_with_a_capped_link(tmp_path, torch_python):
    """torch, CNTK-style, Caffe-MPI-style (mpirun through the namespace agent), MXNet
    (ps-lite), TensorFlow (gRPC collectives) and Horovod (horovodrun through the ssh stand-in)
    with one rank per namespace: every run ok, its ranks' traffic crossed the capped link,
    nothing left behind."""
    sweep_leftovers()
    out = tmp_path / "emulated"
    frameworks = "torch,cntk-style,caffe-mpi-style,mxnet:dist_sync,tf:collective,horovod:gloo"
    result = run_cli("launchers.compare", "--frameworks", frameworks, "--model", "alexnet-tiny",
                     "--nodes", "2", "--workers", "1", "--cluster", "emulated",
                     "--bandwidth", "200Mbit", "--timeout", "300", "--out", str(out), *FAST,
                     timeout=3000)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = stored(out)
    unavailable = [r for r in runs if json.loads(r["extra_json"] or "{}").get("unavailable")]
    ran = [r for r in runs if r not in unavailable]
    assert {r["framework"] for r in ran} >= {"torch", "cntk-style", "caffe-mpi-style", "mxnet", "tf"}
    gradient_bytes = 567_272  # alexnet-tiny (python -m models summary alexnet-tiny)
    steps = 1 + 3 * 2  # warm-up + timed iterations
    for run in ran:
        assert run["status"] == "ok", (run["run_id"], run["error"])
        assert run["nodes"] == 2 and run["bandwidth"] == "200Mbit"
        extra = json.loads(run["extra_json"])
        assert extra["cluster"] == "emulated"
        sent = extra["link_bytes_sent"]
        assert len(sent) == 2 and min(sent) > gradient_bytes * steps / 2, (run["run_id"], sent)
    assert cluster_leftovers() == {}
    assert worker_processes(str(out)) == []


@needs_root
@pytest.mark.slow
def test_all_reduce_time_follows_the_calibrated_alpha_beta_model_at_two_bandwidths(tmp_path, torch_python):
    """Calibrate gloo (torch.distributed's all-reduce) on 2 emulated nodes at 20 and 50 Mbit/s;
    run the gloo all-reduce schemes (PyTorch DDP, CNTK-style: same transport) there: the
    measured communication phase is within 15% of the model's prediction at both bandwidths,
    and the fitted per-byte cost follows the link's rate."""
    sweep_leftovers()
    out = tmp_path / "alphabeta"
    calibrated = run_cli("launchers.calibrate", "--frameworks", "torch", "--nodes", "2",
                         "--workers", "1", "--cluster", "emulated", "--bandwidth", "20Mbit,50Mbit",
                         "--min-bytes", "128K", "--max-bytes", "2M", "--repeats", "5",
                         "--out", str(out), timeout=1200)
    assert calibrated.returncode == 0, calibrated.stderr[-3000:]
    with sqlite3.connect(out / "results.sqlite") as db:
        beta = dict(db.execute("SELECT bandwidth, beta_s_per_byte FROM calibration"))
    wire = {"20Mbit": 20e6 / 8, "50Mbit": 50e6 / 8}  # bytes per second
    for bandwidth, per_byte in beta.items():  # the link is what costs: 1/beta near its rate
        assert 0.7 < 1 / per_byte / wire[bandwidth] < 1.0, beta
    result = run_cli("launchers.compare", "--frameworks", "torch,cntk-style", "--model",
                     "alexnet-tiny", "--nodes", "1,2", "--workers", "1", "--cluster", "emulated",
                     "--bandwidth", "20Mbit,50Mbit", "--iterations", "3", "--repeats", "2",
                     "--warmup", "1", "--profile-iterations", "5", "--out", str(out), timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    from analysis.store import ResultStore

    phases = ResultStore.for_campaign(out).phases_frame()
    comm = phases[phases.phase == "comm"]
    lines, errors = [], []
    for run in [r for r in stored(out) if r["nodes"] == 2]:
        extra = json.loads(run["extra_json"])
        # both ranks' separated comm phase: the later one to finish backward starts its clock
        # after its peer has begun sending, the earlier one waits for its peer; on two nodes
        # the mean cancels the skew
        measured = sum(extra["rank_comm_s"]) / len(extra["rank_comm_s"])
        predicted = float(comm[comm.run_id == run["run_id"]].predicted_s.iloc[0])
        errors.append(abs(predicted - measured) / measured)
        lines.append(f"{run['framework']} {run['bandwidth']}: measured {measured * 1e3:.1f} ms, "
                     f"predicted {predicted * 1e3:.1f} ms")
    print("\n".join(lines))
    assert len(errors) == 4 and max(errors) <= 0.15, "\n".join(lines)
    by_bw = {run["bandwidth"]: json.loads(run["extra_json"])["rank_comm_s"] for run in stored(out)
             if run["framework"] == "torch" and run["nodes"] == 2}
    assert min(by_bw["20Mbit"]) > 1.8 * min(by_bw["50Mbit"]), by_bw  # the cap is what limits
    # the bandwidth sweep's figure: a line per scheme along the two link rates
    assert (out / "figures" / "sweep_bandwidth.png").stat().st_size > 10_000
    drawn = json.loads((out / "figures" / "sweep_bandwidth.json").read_text())["series"]
    efficiency = [s for s in drawn if s["metric"] == "efficiency" and s["kind"] == "measured"]
    assert {s["scheme"] for s in efficiency} == {"PyTorch DDP", "CNTK-style"}
    assert all([x for x, _ in s["points"]] == pytest.approx([0.02, 0.05]) for s in efficiency), efficiency
    assert "Against link bandwidth" in (out / "report.html").read_text()
    assert cluster_leftovers() == {}


@needs_root
@pytest.mark.slow
def test_latency_is_shaped_with_netem_or_said_to_be_unshaped(tmp_path, torch_python):
    """With the kernel's netem the asked latency is on the links (ping's round trip shows
    it); without it (this project's machines) the campaign says in one line that only
    bandwidth is shaped, and the record says latency_shaped: false."""
    from launchers.cluster.emulated import netem_available

    sweep_leftovers()
    out = tmp_path / "latency"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "2", "--workers", "1", "--cluster", "emulated", "--bandwidth",
                     "1Gbit", "--latency", "5ms", "--out", str(out), *FAST, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = stored(out)
    assert run["latency"] == "5ms" and "-lat5ms-" in run["run_id"]
    shaped = json.loads(run["extra_json"])["latency_shaped"]
    assert shaped == netem_available()
    if not shaped:
        assert "no netem" in result.stderr and "only bandwidth is shaped" in result.stderr
    assert cluster_leftovers() == {}


# --------------------------------------------------------------------------- teardown

def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def start_hanging_campaign(out: Path) -> subprocess.Popen:
    command, env = cli_command(
        "launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny", "--nodes", "2",
        "--workers", "1", "--cluster", "emulated", "--bandwidth", "100Mbit", "--inject-fault",
        "hang:1", "--timeout", "600", "--out", str(out), *FAST)
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_sigint)


def namespaces_with_ranks(campaign: subprocess.Popen) -> list[str]:
    from launchers.cluster.emulated import leftovers, namespace_pids

    names = leftovers(campaign.pid)["netns"]
    return names if len(names) == 2 and all(namespace_pids(n) for n in names) else []


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_killed_campaign_leaves_no_namespace_link_or_process(tmp_path, torch_python, how):
    """Ctrl-C and SIGTERM: the campaign tears down before it exits. SIGKILL: it cannot, so its
    reaper (a process in its own session waiting on a pipe only the campaign holds) does."""
    sweep_leftovers()
    out = tmp_path / "killed"
    campaign = start_hanging_campaign(out)
    try:
        names = wait_for(lambda: namespaces_with_ranks(campaign), 240, "ranks in both namespaces")
        assert worker_processes(str(out))
        time.sleep(1)
        campaign.send_signal(how)
        code = campaign.wait(timeout=60)
        if how != signal.SIGKILL:
            assert code == 130, campaign.stderr.read()[-2000:]
            assert cluster_leftovers() == {}  # torn down before the campaign exited
        wait_for(lambda: cluster_leftovers() == {} and not worker_processes(str(out)), 30,
                 f"{names} and their processes to go")
    finally:
        if campaign.poll() is None:
            os.killpg(campaign.pid, signal.SIGKILL)
            campaign.wait()


@needs_root
def test_sweep_removes_what_a_dead_owner_left(tmp_path):
    """The next campaign's sweep removes a dead campaign's namespace, its process, its link."""
    from launchers.cluster.emulated import leftovers, namespace_pids, sweep

    dead = subprocess.Popen(["true"])
    dead.wait()
    namespace, link = f"dlc-{dead.pid}-n0", f"dlc{dead.pid}v0"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0",
                    "netns", namespace], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", namespace, "sleep", "600"])
    try:
        wait_for(lambda: namespace_pids(namespace), 10, "the process in the namespace")
        assert set(leftovers(dead.pid)["netns"]) == {namespace}
        removed = sweep()
        assert namespace in removed and link in removed
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert leftovers(dead.pid) == {"netns": [], "links": [], "dirs": []}
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


# --------------------------------------------------------------------------- ssh, real sshd

@pytest.fixture
def sshd_nodes(tmp_path):
    """Two nodes, each a network namespace on a bridge running Debian's real sshd, reachable
    from here with a key made for the test: (hostfile path, namespaces, sshd processes)."""
    import shutil

    from launchers.cluster.emulated import EmulatedCluster

    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    sweep_leftovers()
    keys = tmp_path / "ssh"
    keys.mkdir(mode=0o700)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)],
                       check=True)
    (keys / "authorized_keys").write_text((keys / "client_key.pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    cluster = EmulatedCluster(2)
    cluster.up()
    daemons, lines = [], []
    try:
        for node in range(2):
            config = keys / f"sshd_config{node}"
            config.write_text(
                f"ListenAddress {cluster.address(node)}\nPort 22\nHostKey {keys / 'host_key'}\n"
                f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                f"StrictModes no\nPidFile {keys / f'sshd{node}.pid'}\n")
            log = open(keys / f"sshd{node}.log", "wb")
            daemons.append(subprocess.Popen(
                ["ip", "netns", "exec", cluster.namespace(node), "/usr/sbin/sshd", "-D", "-e",
                 "-f", str(config)], stdout=log, stderr=log))
            client = keys / "ssh_config"
            client.write_text(f"IdentityFile {keys / 'client_key'}\nUserKnownHostsFile /dev/null\n"
                              "StrictHostKeyChecking no\nLogLevel ERROR\nUser root\n")
            lines.append(f"{cluster.address(node)} slots=1 interface=eth0 config={client}")
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("# two sshd in two namespaces\n" + "\n".join(lines) + "\n")
        for node in range(2):
            wait_for(lambda: subprocess.run(
                ["ssh", "-F", str(keys / "ssh_config"), "-o", "BatchMode=yes", cluster.address(node),
                 "true"], capture_output=True, timeout=30).returncode == 0, 30, "sshd to accept")
        yield hostfile, cluster, daemons, keys
    finally:
        for daemon in daemons:
            daemon.kill()
            daemon.wait()
        cluster.close()


def processes_in(cluster, node: int, besides: set[int]) -> list[int]:
    from launchers.cluster.emulated import namespace_pids

    return [pid for pid in namespace_pids(cluster.namespace(node)) if pid not in besides]


@needs_root
@pytest.mark.slow
def test_ssh_hostfile_runs_ranks_on_the_nodes_through_real_sshd(tmp_path, torch_python, sshd_nodes):
    """torch and Caffe-MPI-style (mpirun on the first node reaching the second with ssh) on
    two nodes reached through sshd; then a hanging rank: the run times out and finish()
    kills the remote process groups: no rank is left on any node."""
    hostfile, cluster, daemons, keys = sshd_nodes
    sshd = {d.pid for d in daemons}
    out = tmp_path / "ssh"
    result = run_cli("launchers.compare", "--frameworks", "torch,caffe-mpi-style", "--model",
                     "alexnet-tiny", "--nodes", "2", "--workers", "1", "--cluster",
                     f"hostfile:{hostfile}", "--timeout", "300", "--out", str(out), *FAST,
                     timeout=1500)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = stored(out)
    assert [(r["framework"], r["status"], r["nodes"]) for r in runs] == [
        ("caffe-mpi-style", "ok", 2), ("torch", "ok", 2)], [r["error"] for r in runs]
    for node in range(2):  # the ranks came in through each node's sshd
        assert b"Accepted publickey for root" in (keys / f"sshd{node}.log").read_bytes()
    for node in range(2):
        wait_for(lambda: not processes_in(cluster, node, sshd), 20, "the nodes to be idle")

    hung = tmp_path / "ssh-hang"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "2", "--workers", "1", "--cluster", f"hostfile:{hostfile}",
                     "--timeout", "40", "--inject-fault", "hang:1", "--out", str(hung), *FAST,
                     timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    (run,) = stored(hung)
    assert run["status"] == "timeout"
    for node in range(2):
        wait_for(lambda: not processes_in(cluster, node, sshd), 20, f"node {node}'s ranks to go")


def test_dry_run_on_a_hostfile_prints_the_ssh_commands(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("alpha slots=2 interface=ib0 address=10.0.0.1\nbeta slots=2 address=10.0.0.2 user=bob\n")
    result = run_cli("launchers.compare", "--frameworks", "torch,caffe-mpi-style", "--model",
                     "alexnet-tiny", "--nodes", "2", "--workers", "2", "--cluster",
                     f"hostfile:{hostfile}", "--out", str(tmp_path / "c"), "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stderr
    assert "worker2 on beta: ssh" in text and "bob@beta" in text
    assert "MASTER_ADDR=10.0.0.1" in text and "GLOO_SOCKET_IFNAME=ib0" in text
    assert "-H alpha:2,beta:2" in text and " -x DLC_WORLD_SIZE" in text


# --------------------------------------------------------------------------- Slurm, real daemons

SLURM_CONF = """ClusterName=dlctest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmUser=root
SlurmdUser=root
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@pytest.fixture
def slurm(tmp_path):
    """A real single-host Slurm (Debian slurm-wlm: munged, slurmctld, slurmd) on private
    ports with its own config, state and munge key; yields the environment that points the
    Slurm clients at it."""
    import shutil
    import socket

    from launchers.rendezvous import free_port

    if not all(shutil.which(tool) for tool in ("munged", "slurmctld", "slurmd", "sbatch")) \
            and not Path("/usr/sbin/slurmctld").exists():
        pytest.skip("slurm-wlm is not installed (.ci/run installs it)")
    folder = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True)
    key = folder / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], dir=folder,
                                      ctld_port=free_port(), d_port=free_port(),
                                      cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(
        ["/usr/sbin/munged", "--foreground", "--force", f"--socket={folder / 'munge.sock'}",
         f"--key-file={key}", f"--pid-file={folder / 'munged.pid'}",
         f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munge.seed'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for(lambda: (folder / "munge.sock").exists(), 20, "munged")
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([f"/usr/sbin/{daemon}", "-D", "-f", str(conf)]
                                            + (["-i"] if daemon == "slurmctld" else []),
                                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env,
                                                  capture_output=True, text=True).stdout, 60,
                 "the Slurm node to be idle")
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.mark.slow
def test_slurm_runs_each_run_as_a_job_and_collects_its_record(tmp_path, torch_python, slurm):
    """torch (ranks started by srun) and Caffe-MPI-style (mpirun inside the job) through real
    sbatch on a single-host Slurm (one node, two tasks: several nodes need several hosts);
    then a hanging rank: the job is cancelled or times out, nothing stays queued or running."""
    out = tmp_path / "slurm-campaign"
    result = run_cli("launchers.compare", "--frameworks", "torch,caffe-mpi-style", "--model",
                     "alexnet-tiny", "--nodes", "1", "--workers", "2", "--cluster", "slurm",
                     "--timeout", "300", "--out", str(out), *FAST, env={"SLURM_CONF": slurm["SLURM_CONF"]},
                     timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    runs = stored(out)
    assert [(r["framework"], r["status"], r["world_size"]) for r in runs] == [
        ("caffe-mpi-style", "ok", 2), ("torch", "ok", 2)], [r["error"] for r in runs]
    for run in runs:
        run_dir = out / "runs" / run["run_id"]
        assert "#SBATCH --ntasks-per-node=2" in (run_dir / "job.sbatch").read_text()
        assert list(run_dir.glob("slurm-*.out"))  # it ran as a job
        assert json.loads((run_dir / "outcome.json").read_text())["status"] == "ok"
    script = next((out / "runs").glob("torch-*/job.sbatch"))
    test_only = subprocess.run(["sbatch", "--test-only", str(script)], env=slurm,
                               capture_output=True, text=True, timeout=60)
    assert test_only.returncode == 0 and "to start at" in test_only.stderr, test_only.stderr

    hung = tmp_path / "slurm-hang"
    result = run_cli("launchers.compare", "--frameworks", "torch", "--model", "alexnet-tiny",
                     "--nodes", "1", "--workers", "2", "--cluster", "slurm", "--timeout", "30",
                     "--inject-fault", "hang:1", "--out", str(hung), *FAST,
                     env={"SLURM_CONF": slurm["SLURM_CONF"]}, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    (run,) = stored(hung)
    assert run["status"] == "timeout", run["error"]
    wait_for(lambda: subprocess.run(["squeue", "-h"], env=slurm, capture_output=True,
                                    text=True).stdout.strip() == "", 60, "the queue to empty")
    wait_for(lambda: not worker_processes(str(hung)), 30, "the ranks to go")


def test_slurm_dry_run_prints_the_job_script(tmp_path):
    result = run_cli("launchers.compare", "--frameworks", "torch,horovod:gloo", "--model",
                     "alexnet-tiny", "--nodes", "2,4", "--workers", "2", "--cluster", "slurm",
                     "--out", str(tmp_path / "c"), "--dry-run", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "#SBATCH --nodes=4" in result.stderr and "#SBATCH --ntasks-per-node=2" in result.stderr
    assert "launchers.cluster.slurm inside" in result.stderr and "--kind horovod" in result.stderr


# --------------------------------------------------------------------------- links in the model

def test_calibration_lookup_prefers_the_same_links_and_relinks_others():
    """A run at a bandwidth with its own calibration uses it; at another bandwidth the closest
    calibration's link share of beta (1 / payload rate) is swapped for the run's, its
    software share kept."""
    from analysis.calibration import PAYLOAD_EFFICIENCY, CalibrationFit, lookup

    def fit(bandwidth: str, beta: float) -> CalibrationFit:
        return CalibrationFit("torch", "ddp", "gloo", "allreduce", "ring", "cpu", 2, 1, 2, 0,
                              1e-3, beta, 0.01, 5e-4, beta, 0.0, 6, 5, bandwidth, "")

    wire_20 = 1 / (20e6 / 8 * PAYLOAD_EFFICIENCY)
    stack = 30e-9  # seconds per byte the software adds
    fits = [fit("20Mbit", wire_20 + stack), fit("", stack)]
    found, how = lookup(fits, framework="torch", transport="gloo", world_size=2, nodes=2,
                        device_kind="cpu", bandwidth="20Mbit")
    assert how == "calibrated" and found.beta_s_per_byte == pytest.approx(wire_20 + stack)
    found, how = lookup(fits, framework="torch", transport="gloo", world_size=2, nodes=2,
                        device_kind="cpu", bandwidth="50Mbit")
    assert how == "calibrated (other links)" and found.bandwidth == "50Mbit"
    assert found.beta_s_per_byte == pytest.approx(1 / (50e6 / 8 * PAYLOAD_EFFICIENCY) + stack)
    found, _ = lookup(fits, framework="torch", transport="gloo", world_size=2, nodes=2,
                      device_kind="cpu", bandwidth=None)
    assert found.bandwidth == "" and found.beta_s_per_byte == pytest.approx(stack)


def test_bandwidth_and_latency_are_plan_dimensions():
    """Every multi-node run once per bandwidth x latency, each in its id; one-node runs once."""
    from launchers import plan as planning
    from launchers.campaign import campaign_from_args
    from launchers.compare import build_parser

    args = build_parser().parse_args(["--frameworks", "torch", "--model", "alexnet-tiny",
                                      "--nodes", "1,2", "--workers", "1", "--cluster", "emulated",
                                      "--bandwidth", "1Gbit,10Gbit", "--latency", "0.2ms,1ms", "--launches", "1"])
    runs = planning.expand(campaign_from_args(args))
    assert [(r.nodes, r.bandwidth, r.latency) for r in runs] == [
        (1, None, None), (2, "1Gbit", "0.2ms"), (2, "1Gbit", "1ms"), (2, "10Gbit", "0.2ms"),
        (2, "10Gbit", "1ms")]
    assert len({r.run_id for r in runs}) == 5 and "-bw10Gbit-lat1ms-" in runs[-1].run_id
