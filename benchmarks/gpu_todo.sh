#!/usr/bin/env bash
# Prepared, not yet run; 2 GPUs (nvidia-h200-x2), most important first:
#   - issue 4: the GPU loss tests of strategy.cuda_graph (1 GPU; TP=2, PP=2 m=4p, DDP=2 in fp32),
#     then eager vs graph for PP=2 (m=p, m=4p; Megatron's batch_p2p_sync on and off) and DDP=2 / TP=2
#     again, now that a hung exit keeps the result and the graph is reset before the group goes
#   - metrics.step_timing=events (CUDA events, one sync after the window) vs sync (the default):
#     its GPU test, then single / Megatron / DDP under both
#   - issue 6: the forkserver sweep test (single, megatron, zero ranks start CUDA after the
#     preloads) and the overhead of a sweep's later single / ddp / zero runs
#   bash benchmarks/gpu_todo.sh OUTDIR graphs|timing|teardown [seconds]   (one device call each)
set -u
OUT=${1:-/tmp/out}; PHASE=${2:-graphs}; R=/tmp/runs_$PHASE; RESULTS=${PHASE}_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > $OUT/machine.txt 2>&1
graphs() {
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 python -m pytest -q tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph)" > $OUT/gpu_tests_graph.txt 2>&1
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=90"
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=4p,p strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/pp2
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/ws12
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/tp2
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=4p,p strategy.batch_p2p_sync=false $S hydra.sweep.dir=$R/pp2_nosync
}
timing() {
  build_ds_ops
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=90"
  timeout 120 python -m pytest -q tests/test_gpu.py -k test_step_timing_source > $OUT/gpu_test_timing.txt 2>&1
  run --multirun strategy=single,megatron world_size=1 metrics.step_timing=sync,events $S hydra.sweep.dir=$R/timing1
  run --multirun strategy=ddp,megatron world_size=2 metrics.step_timing=sync,events $S hydra.sweep.dir=$R/timing2
  wait_ds_ops
  timeout 200 python -m pytest -q tests/test_model_parallel.py -k test_gpu_fork_server_sweep_ranks_use_cuda > $OUT/gpu_test_fork.txt 2>&1
  run --multirun strategy=single,ddp,zero seed=0,1 model=300m model.global_batch=16 steps=8 warmup_steps=3 run_timeout_s=120 hydra.sweep.dir=$R/overhead
}
teardown() {  # after teardown_timeout_s and step_timing=events (default): graph runs again, 1-GPU m=8 x 2
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=90 teardown_timeout_s=15"
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/ws12
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/tp2
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=4p,p strategy.cuda_graph=true $S hydra.sweep.dir=$R/pp2
  run --multirun strategy=megatron world_size=1 strategy.microbatches=8 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/m8
  PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 220 python -m pytest -q --durations=0 tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph)" > $OUT/gpu_tests_graph.txt 2>&1
}
export -f graphs timing teardown; export R OUT RESULTS
timeout ${3:-520} bash -c "$PHASE"
finish
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d -o -name 'rank*.log') 2>/dev/null
