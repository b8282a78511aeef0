"""One reusable GPU runner: sweeps of conf/experiment/ presets, then a compact record of them in a folder.

    python -m benchmarks.gpu OUT "PRESET[:override override ...]" [PRESET...] [--deadline-s S] [-- EXTRA...]

Each PRESET runs as ``python -m bench --multirun +experiment=PRESET <its overrides> <EXTRA>`` into
``<work>/<PRESET>[_<n>]`` (the n-th entry of one preset) with ``resume=true`` (a call cut off by its limit is continued by the next with the
same work folder: ``--work DIR``), one after the other, until the deadline; then OUT receives few
files (a device call returns at most 8):

    progress.log   every sweep's log lines, with wall times
    table.txt      one line per run: tokens/s, MFU, memory (measured and predicted), loss (benchmarks/collect.py)
    runs.json      every run's metrics.json, minus the bulky per-rank lists (benchmarks/unpack_runs.py reverts it)
    machine.txt    nvidia-smi, the link topology, CPU, torch / package versions
    tune.json      the knob search's trials and winners (presets that search: +experiment=tune)
    traces.tar.gz  the Perfetto traces of profiled runs (metrics.profile_steps)

``benchmarks/gpu_env.sh`` (sourced first on the GPU image) installs the carried wheels and sets the
environment (NCCL_NVLS_ENABLE=0, TORCH_CUDA_ARCH_LIST=9.0, TORCH_EXTENSIONS_DIR).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BULKY = ("all", "per_step")  # step_time_s.all, loss.per_step stay; per-rank step lists go


def run_preset(preset: str, folder: str, work: Path, extra: list[str], deadline: float, log) -> None:
    name, _, ov = preset.partition(":")
    overrides = ov.split()
    left = deadline - time.time()
    if left < 30:
        log(f"[gpu] {preset}: skipped, {left:.0f} s left before the deadline")
        return
    cmd = [sys.executable, "-m", "bench", "--multirun", f"+experiment={name}", *overrides, *extra,
           f"hydra.sweep.dir={work / folder}", "resume=true"]
    log(f"[gpu] {' '.join(cmd[1:])} (limit {left:.0f} s)")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        out = p.stdout + p.stderr
        log("\n".join(line for line in out.splitlines() if "[sweep]" in line or "[tune]" in line or "Error" in line))
        log(f"[gpu] {name}: exit {p.returncode} in {time.time() - t0:.0f} s")
    except subprocess.TimeoutExpired:
        log(f"[gpu] {name}: stopped at the deadline after {time.time() - t0:.0f} s (resume=true continues it)")


def machine(out: Path) -> None:
    lines = []
    for cmd in (["nvidia-smi"], ["nvidia-smi", "topo", "-m"], ["lscpu"]):
        try:
            lines.append(subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout)
        except Exception as e:  # noqa: BLE001
            lines.append(f"{cmd}: {e}")
    import importlib.metadata as md

    for pkg in ("torch", "deepspeed", "megatron-core", "hydra-core"):
        try:
            lines.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            lines.append(f"{pkg} not installed")
    (out / "machine.txt").write_text("\n".join(lines))


def pack(work: Path, out: Path) -> None:
    runs, traces = [], []
    for m in sorted(work.rglob("metrics.json")):
        if ".attempts" in m.parts:
            continue
        try:
            d = json.loads(m.read_text())
        except Exception:  # noqa: BLE001
            continue
        d["run_dir"] = str(m.parent.relative_to(work))
        for r in d.get("ranks") or []:
            r.pop("step_times", None)
        runs.append(d)
        traces += sorted(m.parent.glob("trace_rank*.json.gz"))
    (out / "runs.json").write_text(json.dumps(runs))
    tunes = {str(t.parent.relative_to(work)): json.loads(t.read_text()) for t in work.rglob("tune.json")}
    if tunes:
        (out / "tune.json").write_text(json.dumps(tunes, indent=1))
    if traces:
        with tarfile.open(out / "traces.tar.gz", "w:gz") as tar:
            for t in traces[:6]:
                tar.add(t, arcname=str(t.relative_to(work)))
    p = subprocess.run([sys.executable, "benchmarks/collect.py", str(work)], capture_output=True, text=True)
    (out / "table.txt").write_text(p.stdout + p.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--work", default="/tmp/bench_gpu", help="where the sweeps run (kept on the machine)")
    ap.add_argument("--deadline-s", type=float, default=540, help="start no sweep after this; stop the running one")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.deadline_s
    logf = open(out / "progress.log", "a")

    def log(s: str) -> None:
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    machine(out)
    seen: dict[str, int] = {}
    for preset in a.presets:
        name = preset.partition(":")[0]
        seen[name] = seen.get(name, 0) + 1
        folder = name if seen[name] == 1 else f"{name}_{seen[name]}"
        run_preset(preset, folder, work, extra, deadline - 25, log)  # 25 s kept for packing
    pack(work, out)
    log(f"[gpu] packed {work} into {out}")


if __name__ == "__main__":
    main()
