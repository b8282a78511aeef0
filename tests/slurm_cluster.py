"""A one-node SLURM cluster on this machine, for tests (tests/test_slurm_real.py) and by hand.

    python tests/slurm_cluster.py up DIR      # start munged, slurmctld, slurmd; prints `export SLURM_CONF=...`
    python tests/slurm_cluster.py down DIR    # cancel its jobs, stop the daemons, remove DIR

Everything lives in DIR: a private munge key and socket (the system's munged, if any, is not used),
slurm.conf, the controller's state, slurmd's spool, the daemons' logs and pid files.  The daemons
listen on free ports, so a system SLURM on this machine is not disturbed.  Clients (sbatch, squeue,
scancel, sinfo, and submitit through them) find the cluster through ``SLURM_CONF=DIR/slurm.conf``.

What the configuration is for:

* one node (this host: its CPUs and sockets/cores/threads as ``slurmd -C`` sees them, RealMemory
  a bit below the total), one partition ``debug`` (the default);
* ``select/cons_tres`` with ``CR_CPU``: jobs share the node by CPUs (memory is not a consumable, so a
  job without ``--mem`` does not take the whole node); ``oversubscribe=N`` lets N jobs share a CPU
  (``OverSubscribe=FORCE:N``: a test runs more idle ranks than this machine has cores);
* no cgroups (a container has none to give): ``proctrack/linuxproc``, ``task/none``; no GPUs or GRES;
  no accounting (no slurmdbd: ``sacct`` does not work, as on some small clusters);
* fast ends: ``OverTimeLimit=0`` (a job is ended at its time limit), ``KillWait=5`` (SIGKILL 5 s after
  SIGTERM), ``MinJobAge`` small (an ended job leaves squeue within seconds), ``InactiveLimit=0``.

As a module: ``cluster, reason = start(dir)``; ``cluster`` is None when SLURM cannot run here (binaries
missing, a daemon did not start: ``reason`` says why, with the daemon's log tail); else
``cluster.env`` is the environment for clients and ``cluster.down()`` stops everything.
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


class SlurmCluster:
    """A one-node SLURM cluster whose files all live in ``root``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ configuration
    def write_config(self, oversubscribe: int = 0) -> None:
        r = self.root
        for d in ("state", "spool", "munge", "log", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        if not key.exists():  # a private key: only this cluster's daemons and clients use this munged
            key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        hw = _node_hardware()
        user = getpass.getuser()
        share = f" OverSubscribe=FORCE:{oversubscribe}" if oversubscribe > 1 else ""
        lines = [
            "# written by tests/slurm_cluster.py: a one-node cluster on this host",
            "ClusterName=benchtest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "KillWait=5",
            "OverTimeLimit=0",
            "InactiveLimit=0",
            "MinJobAge=5",
            "MessageTimeout=20",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"NodeName={self.host} NodeHostname={self.host} NodeAddr=127.0.0.1 "
            + " ".join(f"{k}={v}" for k, v in hw.items()) + " State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP{share}",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ daemons
    def _daemon_env(self) -> dict:
        return {**self.env, "BENCH_SLURM_CLUSTER": str(self.root)}

    def _start_munge(self) -> None:
        m = self.root / "munge"
        cmd = [_which("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
               f"--pid-file={self.root / 'run' / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
               f"--seed-file={m / 'munged.seed'}"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self._daemon_env(), timeout=30)
        if p.returncode != 0:
            raise ClusterError(f"munged did not start (exit {p.returncode}): {p.stderr.strip()}\n"
                               f"{_tail(self.root / 'log' / 'munged.log')}")
        deadline = time.time() + 10
        while time.time() < deadline:  # a credential that munge encodes and unmunge decodes
            enc = subprocess.run([_which("munge"), "-n", "-S", str(self.munge_socket)], capture_output=True)
            if enc.returncode == 0:
                dec = subprocess.run([_which("unmunge"), "-S", str(self.munge_socket)], input=enc.stdout,
                                     capture_output=True)
                if dec.returncode == 0:
                    return
            time.sleep(0.2)
        raise ClusterError(f"munged does not answer on {self.munge_socket}\n{_tail(self.root / 'log' / 'munged.log')}")

    def _start(self, name: str) -> None:
        p = subprocess.run([_which(name), "-f", str(self.conf)], capture_output=True, text=True,
                           env=self._daemon_env(), timeout=60)
        if p.returncode != 0:
            raise ClusterError(f"{name} did not start (exit {p.returncode}): {p.stderr.strip()}\n"
                               f"{_tail(self.root / 'log' / f'{name}.log')}")

    def node_state(self) -> str:
        p = subprocess.run([_which("sinfo"), "-h", "-N", "-n", self.host, "-o", "%T"], capture_output=True,
                           text=True, env=self.env, timeout=30)
        return p.stdout.strip() if p.returncode == 0 else f"(sinfo: {p.stderr.strip()})"

    def up(self, timeout_s: float = 60, oversubscribe: int = 0) -> "SlurmCluster":
        """Start munged, slurmctld and slurmd and wait until the node is idle; ClusterError if not."""
        miss = missing_binaries()
        if miss:
            raise ClusterError(f"SLURM/munge binaries not found: {', '.join(miss)} (Debian: apt-get install "
                               "slurmctld slurmd slurm-client munge)")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text(json.dumps({"conf": str(self.conf), "host": self.host}))
        try:
            self.write_config(oversubscribe)
            self._start_munge()
            self._start("slurmctld")
            self._start("slurmd")
            deadline = time.time() + timeout_s
            state = ""
            while time.time() < deadline:
                state = self.node_state()
                if state.rstrip("*") in ("idle", "mixed", "allocated"):
                    return self
                for name in ("slurmctld", "slurmd"):
                    pidfile = self.root / "run" / f"{name}.pid"
                    if pidfile.exists() and not _alive(_pid(pidfile)):
                        raise ClusterError(f"{name} exited\n{_tail(self.root / 'log' / f'{name}.log')}")
                time.sleep(0.5)
            reason = subprocess.run([_which("sinfo"), "-R"], capture_output=True, text=True, env=self.env).stdout
            raise ClusterError(f"node {self.host} is not idle after {timeout_s:.0f} s (state {state!r}; sinfo -R: "
                               f"{reason.strip()})\n{_tail(self.root / 'log' / 'slurmctld.log')}\n"
                               f"{_tail(self.root / 'log' / 'slurmd.log')}")
        except BaseException:
            self.down(remove=False)
            raise

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue still shows (any state)."""
        p = subprocess.run([_which("squeue"), "-h", "-o", "%i %T"], capture_output=True, text=True, env=self.env,
                           timeout=30)
        return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]

    def down(self, remove: bool = True) -> None:
        """Cancel the jobs, stop the daemons (SIGTERM, then SIGKILL), remove the folder."""
        run = self.root / "run"
        if _alive(_pid(run / "slurmctld.pid")) and _which("scancel"):
            subprocess.run([_which("scancel"), "--full", "-u", getpass.getuser()], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.time() + 15
            while time.time() < deadline and self.jobs():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):  # slurmd first, munged last
            pid = _pid(run / f"{name}.pid")
            if not _alive(pid):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 10
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in self._leftovers():  # slurmstepd started by this cluster's slurmd
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if remove and (self.root / MARKER).exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def _leftovers(self) -> list[int]:
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


def start(root: Path | str, timeout_s: float = 60,
          oversubscribe: int = 0) -> tuple[Optional[SlurmCluster], Optional[str]]:
    """(the running cluster, None), or (None, why SLURM cannot run here)."""
    try:
        return SlurmCluster(root).up(timeout_s, oversubscribe), None
    except ClusterError as e:
        return None, str(e)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{type(e).__name__}: {e}"


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("up", "down"))
    ap.add_argument("dir", help="the cluster's folder (config, state, logs)")
    ap.add_argument("--oversubscribe", type=int, default=0, help="jobs per CPU (OverSubscribe=FORCE:N)")
    a = ap.parse_args(argv)
    if a.action == "down":
        SlurmCluster(a.dir).down()
        print(f"stopped; removed {a.dir}")
        return 0
    cluster, reason = start(a.dir, oversubscribe=a.oversubscribe)
    if cluster is None:
        print(f"SLURM did not start: {reason}", file=sys.stderr)
        return 1
    print(f"one-node SLURM cluster up ({cluster.host}); for clients:\nexport SLURM_CONF={cluster.conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
