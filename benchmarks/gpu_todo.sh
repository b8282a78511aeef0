#!/usr/bin/env bash
# Prepared, not yet run; 2 GPUs (nvidia-h200-x2), most important first:
#   - issue 6: fixed overhead per run with ranks spawned vs forked from a sweep's server that has
#     imported torch._dynamo, megatron.core and TorchInductor once (bench/launch.py preload), and a
#     check that forked ranks start CUDA (and NCCL) normally after that
#   - issue 4: the Megatron 1-GPU test (its setup-phase check failed before 058cb81); compiled vs eager
#     torch-native PP m=4p with ranks[].compile (graphs built, graphs in the timed window, breaks)
#   bash benchmarks/gpu_todo.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs_preload; RESULTS=preload_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > $OUT/machine.txt 2>&1
build_ds_ops
phase() {
  CUDA_DEVICE_MAX_CONNECTIONS=1 python -m pytest -q "tests/test_model_parallel.py::test_gpu_megatron_one_gpu_matches_single" > $OUT/gpu_test.txt 2>&1
  wait_ds_ops
  run --multirun start_method=spawn,forkserver strategy=single,megatron,ddp,zero model=300m model.global_batch=16 steps=8 warmup_steps=3 run_timeout_s=120 hydra.sweep.dir=$R/preload
  run --multirun strategy=pp strategy.impl=torch world_size=2 model=300m model.global_batch=16 strategy.microbatches=4p compile=false,true steps=20 warmup_steps=6 run_timeout_s=180 metrics.profile_steps=2 hydra.sweep.dir=$R/pp_compile
}
export -f phase; export R OUT RESULTS
timeout ${2:-540} bash -c phase
finish
python - <<'PY' | tee $OUT/overhead.txt
import json, pathlib
for d in sorted(pathlib.Path("/tmp/runs_preload").glob("*/[0-9]*")):
    m = json.loads((d / "metrics.json").read_text()); j, r = m["job"], m["ranks"][0]
    print(d.name, m["config"]["start_method"], m["config"]["strategy"]["name"], m["status"],
          "overhead", j.get("overhead_s"), "startup", j.get("startup_s"), "setup", r.get("setup_s"),
          "preloaded", r.get("preloaded_modules"), "phases", r.get("setup_phases_s"), "compile", r.get("compile"))
PY
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d) 2>/dev/null
