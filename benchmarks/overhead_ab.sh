# A sweep's time outside its steps at this tree and at a baseline tree, alternating (baseline, this, baseline, this),
# the same sweep each time, on one host: per run its status, start-up, teardown, the warm-up's time beyond its steps,
# the time outside the steps, the median step, the last loss, and what rank 0 logged of c10d threads left after its
# process groups were released.
# BASE is a folder with bench conf hydra_plugins multirun_analysis pyproject.toml of another commit (.baseline/ is
# git-ignored; carry it), made with:
#   mkdir -p .baseline && git archive COMMIT bench conf hydra_plugins multirun_analysis pyproject.toml | tar -x -C .baseline
# then, on the GPU host:
#   . benchmarks/gpu_env.sh && bash benchmarks/overhead_ab.sh OUT .baseline strategy=ddp,fsdp world_size=1 model=100m
set -u
OUT=$1 BASE=$(cd "$2" && pwd)
shift 2
[ -d "$BASE/bench" ] || { echo "$BASE holds no bench/: make it as the header says"; exit 1; }
mkdir -p "$OUT"
for i in 1 2; do
  (cd "$BASE" && PYTHONPATH=$BASE:/tmp/site python -m bench --multirun "$@" hydra.sweep.dir=$OUT/runs/base_$i) \
    > "$OUT/base_$i.log" 2>&1
  python -m bench --multirun "$@" hydra.sweep.dir=$OUT/runs/this_$i > "$OUT/this_$i.log" 2>&1
done
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
rows = []
for m in sorted(Path(sys.argv[1], "runs").glob("*/*/metrics.json")):
    d, log = json.loads(m.read_text()), m.parent / "rank0.log"
    job = d["job"]
    left = [ln.split("released: ", 1)[1] for ln in (log.read_text().splitlines() if log.exists() else [])
            if "c10d threads still running" in ln]
    rows.append({"sweep": m.parent.parent.name, "run": m.parent.name, "status": d["status"],
                 "strategy": d["config"]["strategy"]["name"], "commit": d["provenance"].get("git_commit"),
                 **{k: job.get(k) for k in ("wall_s", "startup_s", "teardown_s", "warmup_extra_s", "outside_steps_s")},
                 "step_ms": 1000 * d["step_time_s"]["median"] if d.get("step_time_s") else None,
                 "last_loss": d["loss"]["per_step"][-1] if d.get("loss") else None,
                 "c10d_threads_left": left})
Path(sys.argv[1], "summary.json").write_text(json.dumps(rows, indent=1))
print("| sweep | run | strategy | status | wall s | start-up s | teardown s | warm-up extra s | outside steps s "
      "| step ms | last loss | c10d threads left |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
f = lambda v: "-" if v is None else f"{v:.2f}"
for r in rows:
    print(f"| {r['sweep']} | {r['run']} | {r['strategy']} | {r['status']} | {f(r['wall_s'])} | {f(r['startup_s'])} "
          f"| {f(r['teardown_s'])} | {f(r['warmup_extra_s'])} | {f(r['outside_steps_s'])} | {f(r['step_ms'])} "
          f"| {'-' if r['last_loss'] is None else format(r['last_loss'], '.4f')} "
          f"| {'; '.join(r['c10d_threads_left']) or 'none'} |")
EOF
