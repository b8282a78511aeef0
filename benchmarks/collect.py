"""Print a compact table of the runs under some folders and save their metrics as one JSON.

    python benchmarks/collect.py RUNS_DIR [...] --out results.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _overhead(m: dict) -> str:
    """The run's time outside its steps (launch -> first step, the warm-up beyond its steps, last step -> recorded;
    the fixed overhead alone in records older than job.outside_steps_s), from job / status.json."""
    j = m.get("job") or {}
    o = j.get("outside_steps_s") or j.get("overhead_s")  # as the sweep's summary (bench/sweep/status_report.py)
    return f"{o:5.1f}" if o is not None else f"{'-':>5}"


def _profile(m: dict) -> str:
    """Rank 0's profiled step (metrics.profile_steps): GPU busy fraction, communication kernel ms."""
    p = (m.get("profile") or [None])[0]
    if not p or "gpu_busy_fraction" not in p:
        return f"{'-':>5} {'-':>5}"
    return f"{100 * p['gpu_busy_fraction']:5.1f} {p['kernel_ms_per_step'].get('communication', 0.0):5.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for d in a.dirs:
        for p in sorted(Path(d).rglob("metrics.json")):
            try:
                m = json.loads(p.read_text())
            except Exception as e:  # noqa: BLE001
                print(f"{p}: unreadable ({e})")
                continue
            m["run_dir"] = str(p.parent)
            rows.append(m)
    hdr = (f"{'run':64} {'status':9} {'tok/s':>10} {'step ms':>8} {'MFU':>6} {'MFUmeas':>7} {'alloc GiB':>9} "
           f"{'pred GiB':>8} {'loss':>7} {'out s':>5} {'busy%':>5} {'comm':>5}")
    print(hdr)
    for m in rows:
        r, t, f = m["run"], m["throughput"], m["flops"]
        lay = m.get("layout") or {}
        mode = (m.get("config") or {}).get("compile_mode", "default")
        comp = (" c" + ("" if mode == "default" else ":" + mode[:6])) if r["compile"] else ""
        name = f"{r['model']}/{r['strategy']} ws{r['world_size']} {r['precision']}" \
               f"{' ac' if lay.get('autocast') else ''}{comp} b{r['global_batch']}"
        cfg = m.get("config") or {}
        extra = (f" {lay['impl']}" if lay.get("impl") in ("torch", "megatron") and r["strategy"] != "fsdp" else "") + \
            "".join(f" {k}={lay[k]}" for k in ("zero_stage", "reshard_after_forward", "tp", "pp", "microbatches")
                    if k in lay and lay[k] not in (1, None)) + (f" rc={cfg['recompute']}" if cfg.get("recompute", "none") != "none" else "") + \
            (" best" if cfg.get("tuning") == "best" else "")
        name = (name + extra)[:64]
        if m["status"] != "completed":
            print(f"{name:64} {m['status']:9} {(m.get('error') or {}).get('message', '')[:80]}")
            continue
        pct = lambda x: f"{100 * x:.1f}" if x is not None else "-"  # noqa: E731
        alloc = m["memory"]["max_allocated_mb"]
        pred = ((m["memory"].get("plan") or {}).get("predicted_peak_allocated_mb") or 0) / 1024
        print(f"{name:64} {m['status']:9} {t['tokens_per_s']:10,.0f} {1e3 * m['step_time_s']['median']:8.1f} "
              f"{pct(f['mfu']):>6} {pct(f['mfu_vs_measured_peak']):>7} "
              f"{(alloc / 1024 if alloc else 0):9.2f} {pred:8.2f} {m['loss']['last']:7.4f} {_overhead(m)} {_profile(m)}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
