"""Shared helpers: run bench as a user would (a subprocess of `python -m bench`)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a knob search records its winners in the user's store of measured bests (bench/plan/bests.py): the tests' go elsewhere
_BESTS_DIR = tempfile.mkdtemp(prefix="bench-bests-")
os.environ["BENCH_BESTS"] = os.path.join(_BESTS_DIR, "bests.json")
atexit.register(shutil.rmtree, _BESTS_DIR, ignore_errors=True)  # each process that made one removes it
# OpenMP threads (torch's intra-op pool: 2 in a one-rank run on the 2-core CI machine) sleep while they wait instead
# of spinning: the suite runs 3 workers and their ranks on 2 cores, where a spinning thread holds a core that another
# process needs (a one-rank run's steps took twice as long beside two busy processes).  Set before torch is imported
# here; every bench command and spawned rank inherits it.  It changes no result: the same threads, the same order.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Small, fast, exact: fp32 on CPU, a few steps.
CPU_FAST = ["device=cpu", "precision=fp32", "steps=4", "warmup_steps=1"]


def run_bench(*overrides: str, run_dir: Path | None = None, multirun: bool = False,
              timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m bench [--multirun] overrides...` with its output folder under run_dir."""
    args = [sys.executable, "-m", "bench"]
    if multirun:
        args.append("--multirun")
    args += list(overrides)
    if run_dir is not None:
        args.append(f"hydra.{'sweep' if multirun else 'run'}.dir={run_dir}")
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=e)


def _case_yaml(overrides: tuple[str, ...]) -> str:
    """A config of the sweep's ``case`` group that sets these command-line overrides (``strategy=X`` picks
    the strategy, ``a.b=v`` sets a key), so one sweep holds exactly the runs a test compares."""
    groups, body = [], {}
    for o in overrides:
        key, value = o.split("=", 1)
        if key in ("strategy", "model"):
            groups.append(f"  - override /{key}: {value}\n")
            continue
        *parents, leaf = key.split(".")
        node = body
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value

    def dump(d: dict, indent: str) -> str:
        return "".join(f"{indent}{k}:\n{dump(v, indent + '  ')}" if isinstance(v, dict) else f"{indent}{k}: {v}\n"
                       for k, v in d.items())
    return "# @package _global_\n" + ("defaults:\n" + "".join(groups) if groups else "") + dump(body, "")


def case_sweep(d: Path, cases: dict[str, tuple[str, ...]], *common: str, timeout: int = 900,
               all_must_pass: bool = True) -> dict[str, Path]:
    """The runs ``cases`` names ({name: its overrides}), as one `--multirun` over ``+case=<names>`` (one Hydra
    process, the jobs one after another, in d/sweep; the cases are a config group in d/conf) instead of one
    `python -m bench` each: every run is the one its own command line would give.  ``common`` goes to every
    run (a command-line override: it wins over a case's own value of the key).  The sweep must succeed, unless
    ``all_must_pass=False`` (a module's sweep shared by several tests: each test checks its own runs' status, so
    that one failed run fails only the tests that read it); {case name: its run folder}."""
    conf = d / "conf"
    (conf / "case").mkdir(parents=True)
    for case, overrides in cases.items():
        (conf / "case" / f"{case}.yaml").write_text(_case_yaml(overrides))
    sweep = d / "sweep"
    p = run_bench(f"hydra.searchpath=[file://{conf}]", f"+case={','.join(cases)}", *common, run_dir=sweep,
                  multirun=True, timeout=timeout)
    assert p.returncode == 0 or not all_must_pass, p.stdout[-3000:] + p.stderr[-3000:]
    out = {}
    for j in json.loads((sweep / "sweep.json").read_text())["jobs"]:
        case = next(o.split("=", 1)[1] for o in j["overrides"] if o.startswith("+case="))
        out[case] = sweep / j["dir"]
    assert sorted(out) == sorted(cases), out
    return out


# ------------------------------------------------------------------------------ faults: processes left, results lost
TAG = "BENCH_TEST_TAG"  # an environment variable every process of one command inherits (fork server, ranks)


def fault_env() -> dict:
    """An environment that marks every process a command starts (see processes_left)."""
    return {TAG: uuid.uuid4().hex}


def processes_left(env: dict, wait_s: float = 5.0) -> list[str]:
    """The processes still running (zombies aside) that carry env's tag: none may outlive the command
    that started them.  Waits up to ``wait_s`` for processes that are ending."""
    mark = f"{TAG}={env[TAG]}".encode()
    deadline = time.time() + wait_s
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            except OSError:  # gone meanwhile
                continue
            if state != "Z":
                found.append(f"{pid} {cmd}")
        if not found or time.time() > deadline:
            return found
        time.sleep(0.5)


def rank_pid(env: dict, run_dir: Path, rank: int) -> int | None:
    """The pid of one rank of a running command (the process that has run_dir/rank<r>.log open)."""
    mark = f"{TAG}={env[TAG]}".encode()
    want = str(Path(run_dir).resolve() / f"rank{rank}.log")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                    return int(pid)
        except OSError:
            continue
    return None


def record_fault(fault: str, status: str, lost: int, left: int, note: str = "") -> None:
    """One row of the fault table (results/<date>-cpu-stress/faults.md), appended to the file named by
    $BENCH_FAULT_TABLE when it is set (tests/stress.py sets it)."""
    path = os.environ.get("BENCH_FAULT_TABLE")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"fault": fault, "status": status, "lost": lost, "left": left, "note": note}) + "\n")


def metrics_of(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def loss_curve(run_dir: Path) -> list[float]:
    return metrics_of(run_dir)["loss"]["per_step"]


def c10d_threads_left(run_dir: Path) -> list[str]:
    """The ranks' log lines saying a c10d thread outlived the release of the process groups
    (bench/launch/worker.py _close_process_group): none, unless a reference to a destroyed group leaked."""
    from bench.launch.worker import C10D_THREADS_LEFT

    return [line for p in sorted(Path(run_dir).glob("rank*.log"))
            for line in p.read_text(errors="replace").splitlines() if C10D_THREADS_LEFT in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn, world: int, port: int, args: tuple) -> None:
    """One rank of spawn_ranks: a gloo group around fn, released on every path (see bench/launch/teardown.py)."""
    import torch
    import torch.distributed as dist

    from bench.launch.teardown import release_process_groups

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    except BaseException as e:  # a failing assert: its frames would keep the model (and its groups) alive
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        left = release_process_groups()
    # a c10d thread alive here would still be running while this spawned interpreter finalizes (the
    # random "terminate called without an active exception" abort): fail every time instead
    assert not left, f"rank {rank}: c10d threads still running after the process groups were released: {left}"


# What the test process's fork server imports once, before it forks any rank of start_ranks: a spawned rank imported
# them itself (torch and bench: about 2 s of CPU, on the 2-core CI machine beside two other test processes).  Not
# tests.conftest: its import makes a folder of its own (_BESTS_DIR).
RANK_PRELOAD = ["torch", "torch.distributed", "bench.run.config"]


def start_ranks(fn, args: tuple = (), nprocs: int = 1) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, the processes forked from this test process's fork
    server (started at the first call, with RANK_PRELOAD imported; it never runs torch ops, so each process starts
    as after a spawn).  A process inherits the environment the server started with, not this process's of now."""
    import torch.multiprocessing as mp

    mp.set_forkserver_preload(RANK_PRELOAD)  # read when the server starts
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def spawn_ranks(fn, world: int = 2, *args) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes (start_ranks) joined in one gloo group (the
    group is created before fn and released after it, even when fn raises; a rank that leaves a
    c10d thread running fails)."""
    start_ranks(_rank_main, (fn, world, free_port(), args), world)


@pytest.fixture(scope="session")
def single_cpu(tmp_path_factory):
    """One `strategy=single` run (CPU_FAST) shared by every loss-equivalence test."""
    d = tmp_path_factory.mktemp("single")
    p = run_bench(*CPU_FAST, "strategy=single", run_dir=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


@pytest.fixture
def bench_run(tmp_path):
    """Run one benchmark into a fresh folder; returns (completed_process, run_dir)."""
    counter = iter(range(1000))

    def _run(*overrides: str, **kw):
        d = tmp_path / f"run{next(counter)}"
        p = run_bench(*overrides, run_dir=d, **kw)
        return p, d
    return _run


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    """GPU tests skipped without GPUs. The tests of a module that read a module-scoped fixture (a sweep) are one
    unit for pytest-xdist (``--dist loadgroup``: make test), so that the fixture runs once. Work is handed out
    in this order (``--no-loadscope-reorder``): the ``slow`` tests (and the units holding one), then the other
    units, then the rest, so that the longest start early and the suite does not end on one of them alone; a
    unit's tests keep their file order (a later test may read what an earlier one left in the sweep)."""
    import torch

    unit = {item.nodeid: item.module.__name__ if _uses_module_fixture(item) else item.nodeid for item in items}
    rank: dict[str, int] = {}  # a unit's place: 0 slow (a unit with a slow test), 1 a module's unit, 2 the rest
    for item in items:
        u = unit[item.nodeid]
        rank[u] = min(rank.get(u, 2), 0 if "slow" in item.keywords else 1 if u != item.nodeid else 2)
    items.sort(key=lambda item: rank[unit[item.nodeid]])  # stable: a unit's tests keep their file order
    for item in items:
        if unit[item.nodeid] != item.nodeid:
            item.add_marker(pytest.mark.xdist_group(unit[item.nodeid]))
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gpu2" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))
