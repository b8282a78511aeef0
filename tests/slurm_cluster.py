"""A SLURM cluster on this machine, one node or two, for tests (tests/test_slurm_real.py,
tests/test_slurm_two_nodes.py) and by hand.

    python tests/slurm_cluster.py up DIR [--nodes 2]   # start it; prints how clients reach it
    python tests/slurm_cluster.py down DIR             # cancel its jobs, stop everything, remove DIR

Everything lives in DIR: a private munge key and socket (the system's munged, if any, is not used),
slurm.conf, the controller's state, each slurmd's spool, the daemons' logs and pid files.  Clients
(sbatch, squeue, scancel, sinfo, and submitit through them) find the cluster through
``SLURM_CONF=DIR/slurm.conf``.

One node (the default): this host, its daemons on free ports of 127.0.0.1, so a system SLURM on this
machine is not disturbed.

Two nodes (``nodes=2``; needs root, iproute2's ``ip`` and util-linux's ``nsenter`` / ``unshare``): each
node is a network namespace (:class:`NodeNetwork`), ``bench-<tag>-node1`` and ``-node2``, joined by one
veth pair whose two ends are both named ``bench0``, with 10.77.0.1/24 and 10.77.0.2/24 - addresses that
exist only inside those two namespaces (nothing is added to this machine's own network, and no traffic
leaves them).  What runs on a node runs in its namespace and in a private mount namespace whose
/etc/hosts is DIR/net/<node>.hosts: this machine's entries plus ``node1`` and ``node2`` at their
addresses - so, as on many real clusters, the machine's own hostname still resolves to 127.0.0.1, and
gloo needs its socket interface named (``GLOO_SOCKET_IFNAME=bench0``).  slurmctld and node1's slurmd run
on node1 (a head node that also computes), node2's slurmd on node2 (``slurmd -N node1`` / ``-N node2``:
one binary, its node name given; SlurmctldHost is this machine's hostname at node1's address, since
slurmctld checks its own name); munged runs outside both and is shared through its socket file (the
namespaces are network-only: one filesystem, one process tree).  Clients reach the controller from
node1: :meth:`SlurmCluster.client` prefixes a command with what enters node1 (a sweep runs there too).
``down`` stops the daemons, SIGKILLs whatever is left in the namespaces or carries the cluster's mark,
deletes the namespaces (the veth pair goes with them), then DIR.

What the configuration is for:

* each node: this host's CPUs and sockets/cores/threads as ``slurmd -C`` sees them (two nodes share
  this machine's cores), RealMemory a bit below the total; one partition ``debug`` (the default);
* ``select/cons_tres`` with ``CR_CPU``: jobs share a node by CPUs (memory is not a consumable, so a
  job without ``--mem`` does not take the whole node); ``oversubscribe=N`` lets N jobs share a CPU
  (``OverSubscribe=FORCE:N``: a test runs more idle ranks than this machine has cores);
* no cgroups (a container has none to give): ``proctrack/linuxproc``, ``task/none``; no GPUs or GRES;
  no accounting (no slurmdbd: ``sacct`` does not work, as on some small clusters);
* fast ends: ``OverTimeLimit=0`` (a job is ended at its time limit), ``KillWait=5`` (SIGKILL 5 s after
  SIGTERM), ``MinJobAge`` small (an ended job leaves squeue within seconds), ``InactiveLimit=0``;
  two nodes: ``SlurmdTimeout=`` NODE_TIMEOUT_S (a node that stops answering is DOWN, and its jobs
  ended NODE_FAIL, about half a minute later rather than SLURM's default five minutes) and
  ``JobRequeue=0`` (such a job is not requeued: this cluster has no other node to run it on).

As a module: ``cluster, reason = start(dir, nodes=...)``; ``cluster`` is None when SLURM cannot run
here (binaries missing; for two nodes not root, no ``ip``, or no namespace; a daemon did not start: ``reason`` says
why, with the daemon's log tail); else ``cluster.env`` is the environment for clients,
``cluster.client(cmd)`` the command line that reaches the controller, and ``cluster.down()`` stops
everything.
"""
from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun", "munge", "unmunge")
MARKER = "cluster.json"  # in DIR: what `down` needs (and proof that DIR is one of ours)
IFACE = "bench0"  # both ends of the two-node cluster's veth pair, one in each namespace
SUBNET = "10.77.0"  # node i's address: SUBNET.i (only inside the namespaces)
NODE_TIMEOUT_S = 10  # two nodes: SlurmdTimeout, how soon a node that stopped answering is DOWN
READY = ("idle", "mixed", "allocated")


class ClusterError(RuntimeError):
    """SLURM cannot run here: the message says why."""


def _which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def missing_binaries() -> list[str]:
    return [b for b in DAEMONS + CLIENTS if _which(b) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path}: no log)"
    return f"--- {path.name} (last {min(n, len(lines))} lines) ---\n" + "\n".join(lines[-n:])


def _node_hardware() -> dict:
    """This node as slurmd sees it (`slurmd -C`): CPUs, Boards, SocketsPerBoard, CoresPerSocket,
    ThreadsPerCore, RealMemory.  slurmd refuses a node declared bigger than what it finds."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    first = out.splitlines()[0] if out else ""
    hw = dict(kv.split("=", 1) for kv in first.split() if "=" in kv)
    hw.pop("NodeName", None)
    if "CPUs" not in hw:
        hw = {"CPUs": str(os.cpu_count() or 1)}
    mem = int(hw.get("RealMemory") or 0)
    if not mem:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    hw["RealMemory"] = str(max(64, int(mem * 0.9)))  # a bit below the total: slurmd must find at least this
    return hw


def _pid(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _stop(pid: Optional[int], wait_s: float = 10) -> None:
    """SIGTERM, then SIGKILL if it is still there after wait_s."""
    if not _alive(pid):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.time() + wait_s
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([_which("ip") or "ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed (exit {p.returncode}): {p.stderr.strip()}")
    return p


def namespaces_unavailable() -> Optional[str]:
    """Why this machine cannot have the two-node cluster's network namespaces, or None."""
    if os.geteuid() != 0:
        return "two SLURM nodes need network namespaces: run as root"
    miss = [b for b in ("ip", "nsenter", "unshare") if _which(b) is None]
    if miss:
        return f"two SLURM nodes need network namespaces: {', '.join(miss)} not installed (iproute2, util-linux)"
    return None


class NodeNetwork:
    """The two-node cluster's network: one namespace per node, joined by a veth pair (both ends named
    IFACE), node i at SUBNET.i/24 inside its namespace only, and a hosts file per namespace that names
    the nodes.  ``destroy`` undoes all of it, whatever ``create`` got to."""

    def __init__(self, tag: str, nodes: list[str], hosts_dir: Path) -> None:
        self.nodes = nodes
        self.ns = [f"bench-{tag}-{n}" for n in nodes]
        self.addrs = [f"{SUBNET}.{i + 1}" for i in range(len(nodes))]
        self.hosts = [hosts_dir / f"{n}.hosts" for n in nodes]

    def prefix(self, node: str) -> list[str]:
        """What runs a command in ``node``'s namespace: nsenter into its network namespace, then a private
        mount namespace (unshare) whose /etc/hosts is the node's hosts file.  Not ``ip netns exec``: it
        also mounts a fresh /sys, without the cgroup mounts slurmd needs."""
        i = self.nodes.index(node)
        return [_which("nsenter") or "nsenter", f"--net=/var/run/netns/{self.ns[i]}",
                _which("unshare") or "unshare", "--mount", "--propagation", "private",
                "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts[i])]

    def create(self) -> None:
        for ns in self.ns:
            _ip("netns", "add", ns)
        _ip("link", "add", IFACE, "netns", self.ns[0], "type", "veth", "peer", "name", IFACE, "netns", self.ns[1])
        try:
            own = Path("/etc/hosts").read_text()
        except OSError:
            own = "127.0.0.1 localhost\n"
        names = "".join(f"{a} {n}\n" for a, n in zip(self.addrs, self.nodes))
        for ns, addr in zip(self.ns, self.addrs):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", IFACE, "up")
        for hosts in self.hosts:
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(own.rstrip("\n") + "\n# tests/slurm_cluster.py: the two nodes\n" + names)

    def pids(self, node: str) -> list[int]:
        """The processes whose network namespace is ``node``'s."""
        p = _ip("netns", "pids", self.ns[self.nodes.index(node)], check=False)
        return [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]

    def kill(self, node: str, wait_s: float = 10) -> list[int]:
        """SIGKILL every process in ``node``'s namespace (its slurmd, slurmstepd, tasks: the node dies);
        returns the pids killed, once they are gone."""
        killed = []
        deadline = time.time() + wait_s
        while time.time() < deadline:
            left = [p for p in self.pids(node) if _alive(p)]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except OSError:
                    pass
            time.sleep(0.1)
        return sorted(set(killed))

    def destroy(self) -> None:
        existing = set(_ip("netns", "list", check=False).stdout.split())
        for node, ns in zip(self.nodes, self.ns):
            if ns in existing:
                self.kill(node)
                _ip("netns", "delete", ns, check=False)  # the veth pair goes with its namespaces

    def left(self) -> list[str]:
        """The namespaces of this network that still exist (none after destroy)."""
        existing = set(_ip("netns", "list", check=False).stdout.split())
        return [ns for ns in self.ns if ns in existing]


def slurm_conf(c: "SlurmCluster", oversubscribe: int = 0) -> str:
    """slurm.conf of cluster ``c`` (one node on 127.0.0.1, or two in their namespaces)."""
    r = c.root
    hw = " ".join(f"{k}={v}" for k, v in _node_hardware().items())
    user = getpass.getuser()
    share = f" OverSubscribe=FORCE:{oversubscribe}" if oversubscribe > 1 else ""
    if c.net is None:
        head = [f"SlurmctldHost={c.host}(127.0.0.1)", f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
                f"SlurmdSpoolDir={r / 'spool'}", f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
                f"SlurmdLogFile={r / 'log' / 'slurmd.log'}", "SlurmdTimeout=60"]
        nodes = [f"NodeName={c.host} NodeHostname={c.host} NodeAddr=127.0.0.1 {hw} State=UNKNOWN"]
    else:  # fresh namespaces: SLURM's own ports are free there
        head = [f"SlurmctldHost={c.host}({c.net.addrs[0]})", "SlurmctldPort=6817", "SlurmdPort=6818",
                f"SlurmdSpoolDir={r / 'spool' / '%n'}", f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
                f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}", f"SlurmdTimeout={NODE_TIMEOUT_S}", "JobRequeue=0"]
        nodes = [f"NodeName={n} NodeAddr={a} {hw} State=UNKNOWN" for n, a in zip(c.nodes, c.net.addrs)]
    lines = [
        f"# written by tests/slurm_cluster.py: a {len(c.nodes)}-node cluster on this host",
        "ClusterName=benchtest", *head,
        f"SlurmUser={user}", f"SlurmdUser={user}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={c.munge_socket}",
        "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SwitchType=switch/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "ReturnToService=2", "KillWait=5", "OverTimeLimit=0", "InactiveLimit=0", "MinJobAge=5",
        "MessageTimeout=20", "SlurmctldTimeout=30",
        f"StateSaveLocation={r / 'state'}", f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", "SlurmctldDebug=info", "SlurmdDebug=info",
        *nodes,
        f"PartitionName=debug Nodes={','.join(c.nodes)} Default=YES MaxTime=INFINITE State=UP{share}",
    ]
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """A SLURM cluster (``nodes`` = 1 or 2) whose files all live in ``root``."""

    def __init__(self, root: Path | str, nodes: int = 1, tag: Optional[str] = None) -> None:
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if nodes not in (1, 2):
            raise ValueError(f"nodes={nodes}: 1 or 2")
        self.nodes = [self.host] if nodes == 1 else ["node1", "node2"]
        self.net = NodeNetwork(tag or secrets.token_hex(3), self.nodes, self.root / "net") if nodes == 2 else None

    def client(self, cmd: list[str]) -> list[str]:
        """``cmd`` (a SLURM client: sbatch, squeue, ... or a sweep) as it reaches the controller: two
        nodes: in node1's namespace."""
        return (self.net.prefix(self.nodes[0]) if self.net else []) + cmd

    def job_state(self, jid: str) -> Optional[str]:
        """SLURM's "state|reason" of a job (squeue -t all), or None once squeue no longer lists it."""
        p = self._run("squeue", "-h", "-t", "all", "-j", jid, "-o", "%T|%r")
        out = p.stdout.strip()
        return out.splitlines()[0] if p.returncode == 0 and out else None

    def _run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(self.client([_which(cmd[0]) or cmd[0], *cmd[1:]]), capture_output=True, text=True,
                              env=self.env, timeout=timeout)

    # ------------------------------------------------------------------ daemons
    def write_config(self, oversubscribe: int = 0) -> None:
        r = self.root
        for d in ("state", "spool", "munge", "log", "run", *(f"spool/{n}" for n in self.nodes if self.net)):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        if not key.exists():  # a private key: only this cluster's daemons and clients use this munged
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        self.conf.write_text(slurm_conf(self, oversubscribe))

    def _daemon_env(self) -> dict:
        return {**self.env, "BENCH_SLURM_CLUSTER": str(self.root)}

    def _start_munge(self) -> None:
        m, log = self.root / "munge", self.root / "log" / "munged.log"
        cmd = [_which("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
               f"--pid-file={self.root / 'run' / 'munged.pid'}", f"--log-file={log}", f"--seed-file={m / 'munged.seed'}"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._daemon_env(), timeout=30)
        if p.returncode != 0:
            raise ClusterError(f"munged did not start (exit {p.returncode}): {p.stderr.strip()}\n{_tail(log)}")
        deadline = time.time() + 10
        while time.time() < deadline:  # a credential that munge encodes and unmunge decodes
            enc = subprocess.run([_which("munge"), "-n", "-S", str(self.munge_socket)], capture_output=True)
            if enc.returncode == 0:
                dec = subprocess.run([_which("unmunge"), "-S", str(self.munge_socket)], input=enc.stdout,
                                     capture_output=True)
                if dec.returncode == 0:
                    return
            time.sleep(0.2)
        raise ClusterError(f"munged does not answer on {self.munge_socket}\n{_tail(log)}")

    def _log(self, name: str, node: Optional[str] = None) -> Path:
        return self.root / "log" / (f"{name}-{node}.log" if self.net and node else f"{name}.log")

    def _pidfile(self, name: str, node: Optional[str] = None) -> Path:
        return self.root / "run" / (f"{name}-{node}.pid" if self.net and node else f"{name}.pid")

    def _start(self, name: str, node: Optional[str] = None) -> None:
        """Start slurmctld, or the slurmd of ``node`` (two nodes: in its namespace, ``-N node``)."""
        cmd = [_which(name), "-f", str(self.conf)]
        # a killed daemon's pid file names a dead pid until the new daemon (forked off after this call returns)
        # writes its own: wait_ready read it as "slurmd node2 exited" a second after a restart (2026-12-04)
        self._pidfile(name, node).unlink(missing_ok=True)
        if self.net is not None:
            cmd = self.net.prefix(node or self.nodes[0]) + cmd + (["-N", node] if node else [])
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._daemon_env(), timeout=60)
        if p.returncode != 0:
            raise ClusterError(f"{name} did not start (exit {p.returncode}): {p.stderr.strip()}\n"
                               f"{_tail(self._log(name, node))}")

    def node_states(self) -> dict[str, str]:
        """{node: sinfo's state} ({"?": why} where sinfo fails)."""
        p = self._run("sinfo", "-h", "-N", "-o", "%N %T")
        if p.returncode != 0:
            return {"?": f"(sinfo: {p.stderr.strip()})"}
        return dict(line.split()[:2] for line in p.stdout.splitlines() if len(line.split()) >= 2)

    def node_state(self) -> str:
        return self.node_states().get(self.nodes[0], "")

    def wait_ready(self, nodes: Optional[list[str]] = None, timeout_s: float = 60) -> None:
        """Wait until each of ``nodes`` (all) is idle (or running jobs); ClusterError with the logs if not."""
        want = nodes or self.nodes
        deadline = time.time() + timeout_s
        states: dict = {}
        while time.time() < deadline:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*~#") in READY for n in want):
                return
            for name, node in [("slurmctld", None)] + [("slurmd", n) for n in want]:
                pidfile = self._pidfile(name, node)
                if pidfile.exists() and not _alive(_pid(pidfile)):
                    raise ClusterError(f"{name} {node or ''} exited\n{_tail(self._log(name, node))}")
            time.sleep(0.5)
        reason = self._run("sinfo", "-R").stdout.strip()
        logs = "\n".join(_tail(self._log("slurmd", n)) for n in want)
        raise ClusterError(f"nodes {want} not idle after {timeout_s:.0f} s (sinfo: {states}; sinfo -R: {reason})\n"
                           f"{_tail(self._log('slurmctld'))}\n{logs}")

    def up(self, timeout_s: float = 60, oversubscribe: int = 0) -> "SlurmCluster":
        """Start munged, slurmctld and the slurmd(s) and wait until every node is idle; ClusterError if not."""
        miss = missing_binaries()
        if miss:
            raise ClusterError(f"SLURM/munge binaries not found: {', '.join(miss)} (Debian: apt-get install "
                               "slurmctld slurmd slurm-client munge)")
        if self.net is not None and namespaces_unavailable():
            raise ClusterError(namespaces_unavailable())
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text(json.dumps({"conf": str(self.conf), "host": self.host, "nodes": self.nodes,
                                                    "namespaces": self.net.ns if self.net else []}))
        try:
            if self.net is not None:
                self.net.create()
            self.write_config(oversubscribe)
            self._start_munge()
            self._start("slurmctld")
            for node in self.nodes:
                self._start("slurmd", node if self.net else None)
            self.wait_ready(timeout_s=timeout_s)
            return self
        except BaseException:
            self.down(remove=False)
            raise

    def kill_node(self, node: str) -> list[int]:
        """Two nodes: ``node`` dies - SIGKILL to every process in its namespace (slurmd, slurmstepd, the
        job's tasks there).  Returns the pids killed."""
        assert self.net is not None, "kill_node needs two nodes"
        return self.net.kill(node)

    def daemon_pid(self, name: str, node: Optional[str] = None) -> Optional[int]:
        """The pid of slurmctld, munged, or ``node``'s slurmd, while it runs."""
        pid = _pid(self._pidfile(name, node))
        return pid if _alive(pid) else None

    def kill_slurmd(self, node: str) -> int:
        """SIGKILL ``node``'s slurmd alone (its jobs' slurmstepd and tasks go on); returns its pid."""
        pid = _pid(self._pidfile("slurmd", node))
        assert _alive(pid), f"slurmd of {node} is not running"
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
        return pid

    def restart_node(self, node: str, timeout_s: float = 60) -> None:
        """Start ``node``'s slurmd again and wait until SLURM has it back (ReturnToService=2)."""
        self._start("slurmd", node)
        self.wait_ready([node], timeout_s)

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue still shows (any state)."""
        p = self._run("squeue", "-h", "-o", "%i %T")
        return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]

    def down(self, remove: bool = True) -> None:
        """Cancel the jobs, stop the daemons (SIGTERM, then SIGKILL), kill what is left of the jobs,
        delete the namespaces, remove the folder."""
        if _alive(_pid(self._pidfile("slurmctld"))) and _which("scancel"):
            self._run("scancel", "--full", "-u", getpass.getuser())
            deadline = time.time() + 15
            while time.time() < deadline and self.jobs():
                time.sleep(0.5)
        for node in self.nodes:  # the slurmds first, munged last
            _stop(_pid(self._pidfile("slurmd", node)))
        for name in ("slurmctld", "munged"):
            _stop(_pid(self._pidfile(name)))
        for pid in self.leftovers():  # slurmstepd started by this cluster's slurmd(s)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.net is not None:
            self.net.destroy()
        if remove and (self.root / MARKER).exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """The processes this cluster started (its daemons, their slurmstepd): they carry its mark."""
        mark = f"BENCH_SLURM_CLUSTER={self.root}".encode()
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                continue
        return found

    @classmethod
    def of(cls, root: Path | str) -> "SlurmCluster":
        """The cluster ``up`` started in ``root`` (from its marker file), e.g. to take it down."""
        try:
            info = json.loads((Path(root) / MARKER).read_text())
        except (OSError, ValueError):
            return cls(root)
        ns = info.get("namespaces") or []
        tag = ns[0].split("-")[1] if ns else None
        return cls(root, nodes=len(info.get("nodes") or [1]), tag=tag)


def start(root: Path | str, timeout_s: float = 60, oversubscribe: int = 0,
          nodes: int = 1) -> tuple[Optional[SlurmCluster], Optional[str]]:
    """(the running cluster, None), or (None, why SLURM cannot run here)."""
    try:
        return SlurmCluster(root, nodes).up(timeout_s, oversubscribe), None
    except ClusterError as e:
        return None, str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{type(e).__name__}: {e}"


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("up", "down"))
    ap.add_argument("dir", help="the cluster's folder (config, state, logs)")
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2), help="2: two nodes in network namespaces")
    ap.add_argument("--oversubscribe", type=int, default=0, help="jobs per CPU (OverSubscribe=FORCE:N)")
    a = ap.parse_args(argv)
    if a.action == "down":
        SlurmCluster.of(a.dir).down()
        print(f"stopped; removed {a.dir}")
        return 0
    cluster, reason = start(a.dir, oversubscribe=a.oversubscribe, nodes=a.nodes)
    if cluster is None:
        print(f"SLURM did not start: {reason}", file=sys.stderr)
        return 1
    print(f"{len(cluster.nodes)}-node SLURM cluster up ({', '.join(cluster.nodes)}); for clients:\n"
          f"export SLURM_CONF={cluster.conf}")
    if cluster.net is not None:
        print(f"and run them in node1's namespace: {' '.join(cluster.client([]))} <command>")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ------------------------------------------------------------------------------ what the SLURM tests share
def read_json(path) -> dict:
    """A JSON file the sweep writes, or {} while it is not (yet) there or half written."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def stop_all(procs) -> None:
    """Kill the sweep processes a test started that are still running (its fixture's teardown)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def wait_sweep(p, log, timeout: float) -> str:
    """The sweep process's end (the test fails with its log's tail past ``timeout``); its log."""
    import pytest

    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        pytest.fail(f"sweep did not end within {timeout:.0f} s:\n{Path(log).read_text()[-4000:]}")
    return Path(log).read_text()


def wait_job_running(run, log, job_state, ready, timeout: float, what: str) -> str:
    """Wait until SLURM runs the job of the run folder ``run`` (job #run.name of the sweep writing ``log``,
    followed by ``job_state(jid)``: squeue's "state|reason", None once unlisted) and ``ready(jid)`` holds;
    its job id.  A job SLURM ends first fails the test at once with its state; ``timeout`` only bounds a job
    that never starts."""
    import re

    import pytest

    deadline, jid, state = time.time() + timeout, None, None
    while time.time() < deadline:
        if jid is None:
            m = re.search(rf"\[slurm\] #{int(Path(run).name)} submitted as (\d+)", Path(log).read_text())
            jid = m.group(1) if m else None
        if jid:
            state = job_state(jid)
            if state and state.startswith("RUNNING|") and ready(jid):
                return jid
            if state is None or state.split("|")[0] not in ("PENDING", "CONFIGURING", "RUNNING"):
                pytest.fail(f"SLURM job {jid} of {run} ended ({state or 'no longer listed'}) before it was seen "
                            f"{what}:\n{Path(log).read_text()[-4000:]}")
        time.sleep(0.5)
    pytest.fail(f"SLURM job {jid} of {run} was not {what} within {timeout:.0f} s (SLURM: {state}):\n"
                f"{Path(log).read_text()[-4000:]}")
