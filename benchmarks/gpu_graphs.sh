#!/usr/bin/env bash
# Issue 4: Megatron's forward-backward as one CUDA graph per step (strategy.cuda_graph), 2 GPUs
# (nvidia-h200-x2): eager vs graph on 300m at global batch 16 for the layouts (1 GPU;
# DDP=2; TP=2; PP=2 m=4p and m=p), PP m=4p without Megatron's device sync after each pipeline
# send/receive, then the fp32 loss tests.  Every timed step synchronizes (the timing of all
# earlier recorded results).
#   bash benchmarks/gpu_graphs.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs_graphs; RESULTS=graph_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > $OUT/machine.txt 2>&1
phase() {
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=100"
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/ws12
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/tp2
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=4p,p strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/pp2
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=4p strategy.batch_p2p_sync=false $S hydra.sweep.dir=$R/pp2_nosync
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 python -m pytest -q tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph)" > $OUT/gpu_tests.txt 2>&1
}
export -f phase; export R OUT RESULTS
timeout ${2:-540} bash -c phase
finish
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d -o -name 'rank0.log') 2>/dev/null
