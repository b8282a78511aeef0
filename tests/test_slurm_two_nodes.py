"""hydra/launcher=slurm on two SLURM nodes: runs whose ranks span both, and faults across them.

    pytest -k "slurm and two_nodes"

The cluster (tests/slurm_cluster.py, ``nodes=2``): slurmctld and two slurmd, each node a network
namespace of this machine (``node1`` at 10.77.0.1, ``node2`` at 10.77.0.2, joined by a veth pair
named ``bench0`` on both sides; munge shared through its socket file).  Needs root, iproute2 and
SLURM: skipped, with the reason, where the namespaces or the daemons cannot be created.  The sweeps run
in node1's namespace (a head node that also computes), with ``hydra.launcher.gpus_per_node=2``: a
world_size=4 run is 2 nodes x 2 tasks, CPU ranks over gloo, ``GLOO_SOCKET_IFNAME=bench0`` set by a
``hydra.launcher.setup`` line, as a user sets it on a real cluster (this machine's hostname resolves
to 127.0.0.1 in the namespaces too: without it gloo advertises 127.0.0.1 to the other node).

* DDP, FSDP2 and FSDP2 x TP (``strategy=fsdp strategy.tp=2``) at world_size 4: each matches
  ``single``'s per-step losses within 1e-5; ranks 0-1 ran on node1, 2-3 on node2, and every rank
  resolved the master address (node1) to node1's veth address;
* HSDP (``strategy=fsdp strategy.dp_replicate=2``) at world_size 4: sharded inside each node, replicated
  across the two, the same losses;
* a job SLURM cannot place (world_size=8: 4 nodes of 2): recorded ``failed`` with SLURM's reason;
* faults across nodes, mid-run: node2 dies (SIGKILL to everything in its namespace: slurmd, slurmstepd,
  its ranks), or only node2's slurmd is killed: the run is ``failed`` naming node2, well within
  run_timeout_s (the lost connections in seconds; SLURM's NODE_FAIL within ~30 s), the sweep ends once
  SLURM has ended the job, and no process of the job is left on either node; node2 is then started
  again;
* without GLOO_SOCKET_IFNAME the run fails at once, and its error says how to fix it;
* the cluster itself: taken down with a job running on both nodes, nothing is left (namespaces,
  daemons, the job's processes, its folder).

Waits are on SLURM's job and node states (squeue, sinfo) and on the ranks' own logs, never on fixed sleeps.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import CPU_FAST, REPO, fault_env, processes_left
from tests.slurm_cluster import (IFACE, SUBNET, SlurmCluster, namespaces_unavailable, read_json as _json, start,
                                 stop_all, wait_job_running, wait_sweep as _wait)

pytestmark = pytest.mark.slow

TOL = 1e-5
NODE1, NODE2 = f"{SUBNET}.1", f"{SUBNET}.2"
GLOO_IF = f'hydra.launcher.setup=["export GLOO_SOCKET_IFNAME={IFACE}"]'
LAUNCH = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=2", "hydra.launcher.timeout_min=10"]


def _cluster(oversubscribe: int = 4):
    """A started two-node cluster, or pytest.skip with the reason."""
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    root = tempfile.mkdtemp(prefix="bench-2n-")  # short: the munge socket path must fit a unix socket
    cluster, reason = start(root, nodes=2, oversubscribe=oversubscribe)
    if cluster is None:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"two-node SLURM not available: {reason}")
    return cluster


def _assert_gone(cluster: SlurmCluster) -> None:
    """Nothing of the cluster is left: namespaces (and their veth pair), daemons, folder."""
    assert not cluster.net.left(), f"namespaces left: {cluster.net.left()}"
    assert not cluster.leftovers(), f"cluster processes left: {cluster.leftovers()}"
    assert not cluster.root.exists(), f"{cluster.root} left"


@pytest.fixture(scope="module")
def two_nodes():
    cluster = _cluster()
    try:
        yield cluster
    finally:
        cluster.down()
        _assert_gone(cluster)


@pytest.fixture
def sweep(two_nodes):
    """Start `python -m bench --multirun hydra/launcher=slurm ...` in node1's namespace (output in
    <sweep dir>.log); one still running when the test ends (it failed) is killed."""
    procs: list[subprocess.Popen] = []

    def _start(sweep_dir: Path, env: dict, *overrides: str) -> subprocess.Popen:
        args = [sys.executable, "-m", "bench", "--multirun", *LAUNCH, *CPU_FAST, *overrides,
                f"hydra.sweep.dir={sweep_dir}"]
        with open(sweep_dir.with_suffix(".log"), "w") as log:
            procs.append(subprocess.Popen(two_nodes.client(args), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          env={**two_nodes.env, "PYTHONUNBUFFERED": "1", **env}))
        return procs[-1]
    yield _start
    stop_all(procs)


def _when_training(cluster: SlurmCluster, run: Path, log: Path, ranks: int, timeout: float = 240) -> str:
    """The job id of ``run`` once SLURM runs it and each of its ranks has set up (its log says "setup done":
    the process group is up, the steps start)."""
    def ready(jid: str) -> bool:
        logs = [run / f"rank{r}.log" for r in range(ranks)]
        return all(p.exists() and "setup done" in p.read_text(errors="replace") for p in logs)
    return wait_job_running(run, log, cluster.job_state, ready, timeout, f"training on {ranks} ranks")


def _no_jobs_left(cluster: SlurmCluster, tag: dict) -> None:
    deadline = time.time() + 20  # an ended job stays listed for MinJobAge=5 s
    while cluster.jobs() and time.time() < deadline:
        time.sleep(1)
    assert not cluster.jobs(), subprocess.run(cluster.client(["squeue"]), env=cluster.env, capture_output=True,
                                              text=True).stdout
    assert not processes_left(tag, wait_s=10)


def _nodes_emptied(cluster: SlurmCluster, timeout: float = 90) -> float:
    """Wait until no process is left on either node but the cluster's daemons (slurmctld, slurmd): after
    its tasks, a slurmstepd whose slurmd or srun is gone retries its last messages to them
    (MessageTimeout) before it exits.  Returns when; fails the test with what is left."""
    deadline = time.time() + timeout
    while True:
        daemons = {cluster.daemon_pid("slurmctld")} | {cluster.daemon_pid("slurmd", n) for n in cluster.nodes}
        left = [pid for n in cluster.nodes for pid in cluster.net.pids(n)
                if pid not in daemons and _ppid(pid) != cluster.daemon_pid("slurmctld")]  # its slurmscriptd
        if not left:
            return time.time()
        if time.time() > deadline:
            pytest.fail(f"processes left on the nodes {timeout:.0f} s after the job ended: {_cmdlines(left)}")
        time.sleep(0.5)


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid} " + Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            out.append(f"{pid} (gone)")
    return out


def _assert_spans_both_nodes(d: Path, m: dict, st: dict) -> None:
    """Ranks 0-1 on node1, 2-3 on node2, numbered globally; every rank reached the master (node1) at
    node1's veth address, gloo on the named interface."""
    ranks = sorted(m["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["placement"]["node"] for r in ranks] == ["node1", "node1", "node2", "node2"], ranks
    assert [r["placement"]["local_rank"] for r in ranks] == [0, 1, 0, 1]
    for r in ranks:
        p = r["placement"]
        assert p["master_addr"] == "node1" and p["master_ip"] == NODE1, p
        assert p["addresses"] == [NODE1 if p["node"] == "node1" else NODE2], p
        assert p["socket_ifname"] == {"GLOO_SOCKET_IFNAME": IFACE}, p
    assert m["placement"]["nodes"] == {"node1": [0, 1], "node2": [2, 3]}, m["placement"]
    assert m["placement"]["master_addr"] == "node1" and m["placement"]["master_port"] > 0
    logs = sorted((d.parent / ".submitit" / st["submitit_job_id"]).glob("*_log.out"))
    assert len(logs) == 4, logs
    for r, log in enumerate(logs):  # submitit's view: global rank r of 4, on node r // 2 of 2
        assert f"node={r // 2}(2), global_rank={r}(4)" in log.read_text()


def test_slurm_two_nodes_ddp_fsdp_tp_match_single(two_nodes, sweep, single_cpu, tmp_path):
    t0 = time.time()
    tag = fault_env()
    dp, tp = tmp_path / "dp", tmp_path / "tp"
    pa = sweep(dp, tag, GLOO_IF, "strategy=ddp,fsdp", "world_size=4")
    pb = sweep(tp, tag, GLOO_IF, "strategy=fsdp", "strategy.tp=2", "world_size=4")
    out_a, out_b = _wait(pa, dp.with_suffix(".log"), 420), _wait(pb, tp.with_suffix(".log"), 420)
    assert pa.returncode == 0, out_a[-4000:]
    assert pb.returncode == 0, out_b[-4000:]
    assert "nodes=2, tasks_per_node=2" in out_a and "nodes=2, tasks_per_node=2" in out_b
    want = _json(single_cpu / "metrics.json")["loss"]["per_step"]
    runs = {(r["strategy"], r["dir"]): dp for r in _json(dp / "summary.json")["rows"]}
    runs.update({("fsdp_tp", r["dir"]): tp for r in _json(tp / "summary.json")["rows"]})
    layouts = {}
    for (name, sub), folder in runs.items():
        d = folder / sub
        st, m = _json(d / "status.json"), _json(d / "metrics.json")
        assert st["status"] == m["status"] == "completed", (name, st, m.get("error"))
        got = m["loss"]["per_step"]
        assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) <= TOL, (name, got, want)
        _assert_spans_both_nodes(d, m, st)
        layouts[name] = (m["layout"]["dp"], m["layout"].get("tp", 1))
    assert layouts == {"ddp": (4, 1), "fsdp": (4, 1), "fsdp_tp": (2, 2)}, layouts
    _no_jobs_left(two_nodes, tag)
    print(f"two-node DDP, FSDP2, FSDP2 x TP: {time.time() - t0:.0f} s")



def test_slurm_two_nodes_hsdp_shards_inside_replicates_across(two_nodes, sweep, single_cpu, tmp_path):
    """HSDP (strategy.dp_replicate=2) at world_size 4 on 2 nodes x 2: the replicas are the outer index of the
    dp ranks, so each node's two ranks are one shard group and only the gradient shards' all-reduce crosses
    nodes; the losses match single's."""
    tag = fault_env()
    d = tmp_path / "hsdp"
    p = sweep(d, tag, GLOO_IF, "strategy=fsdp", "strategy.dp_replicate=2", "world_size=4")
    out = _wait(p, d.with_suffix(".log"), 420)
    assert p.returncode == 0, out[-4000:]
    st, m = _json(d / "0" / "status.json"), _json(d / "0" / "metrics.json")
    assert st["status"] == m["status"] == "completed", (st, m.get("error"))
    want, got = _json(single_cpu / "metrics.json")["loss"]["per_step"], m["loss"]["per_step"]
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) <= TOL, (got, want)
    _assert_spans_both_nodes(d / "0", m, st)  # ranks 0-1 on node1, 2-3 on node2: one shard group each
    lay = m["layout"]
    assert (lay["dp"], lay["dp_replicate"], lay["dp_shard"]) == (4, 2, 2), lay
    assert lay["device_mesh"] == {"shape": [1, 2, 2, 1, 1], "dims": ["pp", "dp_replicate", "dp_shard", "cp", "tp"]}
    _no_jobs_left(two_nodes, tag)

def test_slurm_two_nodes_job_that_cannot_be_placed(two_nodes, sweep, tmp_path):
    """world_size=8 is 4 nodes of 2 tasks: sbatch accepts it, SLURM keeps it pending (PartitionConfig)."""
    tag = fault_env()
    d = tmp_path / "big"
    p = sweep(d, tag, GLOO_IF, "strategy=ddp", "world_size=8")
    out = _wait(p, d.with_suffix(".log"), 180)
    assert p.returncode == 1, out[-4000:]
    assert "nodes=4, tasks_per_node=2" in out
    st, m = _json(d / "0" / "status.json"), _json(d / "0" / "metrics.json")
    assert st["status"] == m["status"] == "failed", st
    assert "SLURM cannot start job" in st["reason"] and "PartitionConfig" in st["reason"], st["reason"]
    assert st["reason"] == m["error"]["message"]
    _no_jobs_left(two_nodes, tag)


def test_slurm_two_nodes_gloo_without_interface_says_how_to_fix(two_nodes, sweep, tmp_path):
    """No GLOO_SOCKET_IFNAME: the hostname resolves to 127.0.0.1, gloo advertises it, the other node's
    ranks cannot connect: the run fails at once, and says what to set."""
    tag = fault_env()
    d = tmp_path / "loopback"
    p = sweep(d, tag, "strategy=ddp", "world_size=4", "run_timeout_s=120")
    out = _wait(p, d.with_suffix(".log"), 240)
    assert p.returncode == 1, out[-4000:]
    st = _json(d / "0" / "status.json")
    assert st["status"] == "failed" and "127.0.0.1" in st["reason"], st
    assert "GLOO_SOCKET_IFNAME" in st["reason"], st["reason"]
    assert st["wall_s"] < 60, st
    _no_jobs_left(two_nodes, tag)


@pytest.mark.parametrize("fault", ["node_dies", "slurmd_killed"])
def test_slurm_two_nodes_fault_mid_run(fault, two_nodes, sweep, tmp_path):
    """node_dies: SIGKILL to everything in node2's namespace (slurmd, slurmstepd, ranks 2-3): node1's ranks
    lose their connections at once, and the run names node2.  slurmd_killed: node2's slurmd alone; the
    run goes on until SLURM finds node2 not responding (SlurmdTimeout), ends the job (NODE_FAIL) and
    SIGTERMs node1's ranks: rank 0 asks SLURM why, and the run names node2.  Either way the sweep ends
    once SLURM has ended the job, and no process of it is left on either node."""
    tag = fault_env()
    d = tmp_path / fault
    timeout_s = 300
    p = sweep(d, tag, GLOO_IF, "strategy=ddp", "world_size=4", "steps=600", f"run_timeout_s={timeout_s}")
    log = d.with_suffix(".log")
    jid = _when_training(two_nodes, d / "0", log, ranks=4)
    t_kill = time.time()
    if fault == "node_dies":
        assert two_nodes.kill_node("node2") and not two_nodes.net.pids("node2")
    else:
        two_nodes.kill_slurmd("node2")
    out = _wait(p, log, timeout_s + 60)
    t_sweep = time.time() - t_kill

    assert p.returncode == 1, out[-4000:]
    st, m = _json(d / "0" / "status.json"), _json(d / "0" / "metrics.json")
    assert st["status"] == m["status"] == "failed", st
    assert st["time"] - t_kill < timeout_s, (st["time"] - t_kill, st)
    assert m["placement"]["nodes"] == {"node1": [0, 1], "node2": [2, 3]}, m["placement"]
    if fault == "node_dies":
        assert "lost node node2 (ranks 2-3)" in st["reason"] and NODE2 in st["reason"], st["reason"]
        assert "left no failure record" in st["reason"], st["reason"]
        assert {f["node"] for f in m["failures"]} == {"node1"}, m["failures"]
    else:
        assert m["error"]["type"] == "NodeFail", m["error"]
        assert "because a node failed: node2 down" in st["reason"] and "Not responding" in st["reason"], st["reason"]
    # SLURM's side: node2 stopped answering, so it is DOWN and the job was ended on its account
    assert two_nodes.node_states()["node2"].startswith("down"), two_nodes.node_states()
    assert f"Killing JobId={jid} on failed node node2" in (two_nodes.root / "log" / "slurmctld.log").read_text()
    _no_jobs_left(two_nodes, tag)
    t_empty = _nodes_emptied(two_nodes) - t_kill
    two_nodes.restart_node("node2")  # back to idle (ReturnToService=2) for what comes next
    print(f"{fault}: run failed {st['time'] - t_kill:.1f} s after, sweep over {t_sweep:.0f} s after, nodes empty "
          f"{t_empty:.0f} s after: {st['reason'][-260:]}")


def _tasks_on(cluster: SlurmCluster, tag: dict, node: str) -> list[int]:
    """The job's processes (they carry ``tag``) running on ``node``."""
    job = {int(line.split()[0]) for line in processes_left(tag, wait_s=0)}
    return [pid for pid in cluster.net.pids(node) if pid in job]


def test_slurm_two_nodes_cluster_teardown_leaves_nothing(tmp_path):
    """Taken down with a job running on both nodes: no namespace, daemon, job process or folder is left."""
    cluster = _cluster(oversubscribe=0)
    tag = fault_env()
    try:
        p = subprocess.run(cluster.client(["sbatch", "-N", "2", "--ntasks-per-node=1", "-o", str(tmp_path / "job.out"),
                                           "--wrap", "srun sleep 300"]),
                           cwd=tmp_path, env={**cluster.env, **tag}, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        jid = p.stdout.split()[-1]
        deadline = time.time() + 60
        while time.time() < deadline and not _tasks_on(cluster, tag, "node2"):
            time.sleep(0.5)
        assert cluster.job_state(jid) == "RUNNING|None" and _tasks_on(cluster, tag, "node1"), cluster.job_state(jid)
        assert _tasks_on(cluster, tag, "node2")
    finally:
        cluster.down()
    _assert_gone(cluster)
    assert not processes_left(tag, wait_s=5)
