"""Where a command's CPU time goes, by process kind and by test: ``python benchmarks/suite_cpu.py OUT.json -- make test``.

The CI machine has 2 cores and the suite keeps both busy, so its wall time follows its CPU time.  This samples
every process of the machine every 0.3 s (/proc: its CPU time so far, its command line, the test it serves: the
PYTEST_CURRENT_TEST its environment inherited), runs the command, then prints the machine's busy CPU seconds, the
CPU seconds by process kind (bench's command, fork servers and the ranks forked from them, SLURM tasks, test
processes, ranks the tests start themselves) and by test module.  A process that ends between two samples loses
its last 0.3 s; one shorter than that is missed.  A forked process has its fork server's environment, so the ranks
a test process's fork server forks count under the test that started that server.  The breakdown is for the machine
it ran on, with that machine's other load (results/2026-12-07-cpu-suite-cost.md)."""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time

from bench.metrics.host import host_cpu_ticks

TICK = os.sysconf("SC_CLK_TCK")


def _busy_s() -> float:
    """The machine's busy CPU seconds since boot (bench/metrics/host.py: steal counted as busy)."""
    return host_cpu_ticks()[0] / TICK


def _sample(seen: dict, me: int) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            rest = stat.rsplit(")", 1)[1].split()
            key = f"{pid}:{rest[19]}"  # pid and start time: one process
            rec = seen.get(key)
            if rec is None:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
                rec = seen[key] = {"pid": int(pid), "ppid": int(rest[1]), "comm": stat[stat.index("(") + 1:
                                   stat.rindex(")")], "cmd": cmd,
                                   "test": env.get(b"PYTEST_CURRENT_TEST", b"").decode(errors="replace")}
            rec["cpu_s"] = (int(rest[11]) + int(rest[12])) / TICK
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue


def kind(p: dict, by_pid: dict) -> str:
    c = p["cmd"]
    if "forkserver" in c:
        return "rank forked by a fork server" if "forkserver" in by_pid.get(p["ppid"], {}).get("cmd", "") \
            else "fork server"
    if "execnet" in c or "import sys;exec(eval" in c:
        return "pytest-xdist worker (the tests' own work)"
    if re.search(r" -m bench( |$)", c):
        return "python -m bench"
    if " -m bench." in c or " -m multirun_analysis" in c:
        return "python -m " + c.split(" -m ", 1)[1].split()[0]
    if "multiprocessing.spawn" in c or "spawn_main" in c:
        return "spawned process (torch.multiprocessing)"
    if "submitit" in c:
        return "SLURM task (submitit)"
    if p["comm"] in ("cc1plus", "c++", "g++", "ninja", "as", "ld", "collect2"):
        return "C++ build (DeepSpeed's JIT ops, Inductor)"
    return "other: " + p["comm"]


def main(out: str, cmd: list[str]) -> int:
    seen: dict = {}
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            _sample(seen, os.getpid())
            time.sleep(0.3)

    sampler = threading.Thread(target=loop, daemon=True)
    b0, t0 = _busy_s(), time.time()
    sampler.start()
    rc = subprocess.call(cmd)
    done.set()
    sampler.join()
    busy, wall = _busy_s() - b0, time.time() - t0
    procs = list(seen.values())
    by_pid = {p["pid"]: p for p in procs}
    kinds, modules = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(float)
    for p in procs:
        k = kinds[kind(p, by_pid)]
        k[0] += p["cpu_s"]
        k[1] += 1
        if p["test"]:
            modules[p["test"].split("::", 1)[0]] += p["cpu_s"]
    with open(out, "w") as f:
        json.dump({"command": cmd, "rc": rc, "wall_s": wall, "busy_cpu_s": busy, "cpus": os.cpu_count(),
                   "processes": procs}, f)
    print(f"rc {rc}; wall {wall:.0f} s; machine busy {busy:.0f} CPU-s ({busy / wall / os.cpu_count():.0%} of "
          f"{os.cpu_count()} CPUs); sampled {sum(p['cpu_s'] for p in procs):.0f} CPU-s in {len(procs)} processes")
    print("\n| process kind | CPU s | processes |\n|---|---:|---:|")
    for name, (cpu, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"| {name} | {cpu:.0f} | {n} |")
    print("\n| test module (its processes; not the xdist worker's own work) | CPU s |\n|---|---:|")
    for name, cpu in sorted(modules.items(), key=lambda kv: -kv[1])[:20]:
        print(f"| {name} | {cpu:.0f} |")
    return rc


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[3:]))
