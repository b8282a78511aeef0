# The slow-link regimes on one GPU host (results/2026-11-27-h100x4-slow-links): probe each regime, then run each
# GPU_RUNS entry ("REGIME|MODEL|WORLD|ARMS") at tuning=best, planned with that regime's probe profile.
#   . benchmarks/gpu_env.sh && PROBE="default p2p_off" GPU_RUNS="p2p_off|llama3_1b|4|ddp,fsdp" bash benchmarks/slow_links.sh $OUT 540
# Files in OUT: hardware/h100x4_<regime>.yaml (the profiles) and benchmarks/gpu.py's progress.log, table.txt,
# runs.json, machine.txt.  HW_DIR: a folder whose hardware/ holds the profiles of an earlier call (default: OUT).
# sockets and few_channels are probed --quick (messages up to 64 MiB: a full probe of sockets takes minutes).
# PROBE_AFTER=1 probes each regime again after the runs, into hardware/h100x4_<regime>_after.yaml.
# RUN_EXTRA: overrides added to every run (metrics.profile_steps=1: each run's profiled step, its kernels by kind).
set -u
OUT=$1; DEADLINE=$(( $(date +%s) + $2 )); N=$(nvidia-smi -L | wc -l)
mkdir -p "$OUT/hardware"
probe() {  # probe REGIME SUFFIX: one profile, hardware/h100x4_<regime><suffix>.yaml
  local q=""; case $1 in sockets|few_channels) q=--quick;; esac
  timeout $(( DEADLINE - $(date +%s) - 60 )) python -m bench.probe --world-size "$N" --regime "$1" $q \
    --out "$OUT/hardware/h100x4_$1$2.yaml" 2>&1 | grep -v "^\[W" | tail -3
}
for r in ${PROBE:-}; do probe "$r" ""; done
presets=()
for run in ${GPU_RUNS:-}; do
  IFS='|' read -r regime model world arms <<< "$run"
  presets+=("gpu_predict_x2:model=$model world_size=$world +experiment/arm=$arms link_regime=$regime \
hardware=h100x4_$regime hydra.searchpath=[file://${HW_DIR:-$OUT}] steps=${STEPS:-10} warmup_steps=${WARMUP:-3} ${RUN_EXTRA:-}")
done
left=$(( DEADLINE - $(date +%s) ))
[ ${#presets[@]} -gt 0 ] && python -m benchmarks.gpu "$OUT" "${presets[@]}" --deadline-s $(( left - 10 ${PROBE_AFTER:+- 120} ))
# PROBE_AFTER=1: each regime probed again after the runs (hardware/h100x4_<regime>_after.yaml): how far its link
# moved during the call (three sockets probes of one kind of host moved 1.48x, docs/results.md)
if [ -n "${PROBE_AFTER:-}" ]; then for r in ${PROBE:-}; do probe "$r" "_after"; done; fi
python - "$OUT/runs.json" <<'PY'
import json, sys
for m in json.load(open(sys.argv[1])) if len(sys.argv) > 1 else []:
    n = (m.get("provenance") or {}).get("nccl") or {}
    c, t = m.get("config") or {}, (m.get("throughput") or {}).get("tokens_per_s")
    print(m["run_dir"], m["status"], c.get("link_regime"), n.get("link"), n.get("transports"), t)
PY
