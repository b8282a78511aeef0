#!/usr/bin/env bash
# Issue 7 on 8 x H200 (nvidia-h200-x8): every tp x pp x dp layout of 1b (Megatron, global batch 32,
# m = p micro-batches) at 8 GPUs, then at 4 and 2, with single and Megatron 1-GPU baselines, all on
# one machine. Sweeps run in a folder that persists on the host (/tmp), with resume=true, so a
# call cut off by its limit is continued by the next call on the same (warm) machine.
#   bash benchmarks/gpu_issue7_layouts.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/layouts7; RESULTS=issue7_layouts
mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; nvidia-smi topo -m; nproc; } > $OUT/machine.txt 2>&1
S="model=1b model.global_batch=32 steps=20 warmup_steps=5 run_timeout_s=150 resume=true"
L="strategy=megatron strategy.microbatches=p"
phase() {
  run --multirun $L world_size=8 strategy.tp=1,2,4,8 strategy.pp=1,2,4 $S hydra.sweep.dir=$R/ws8
  run --multirun strategy=single,megatron world_size=1 $S hydra.sweep.dir=$R/ws1
  run --multirun $L world_size=4 strategy.tp=1,2,4 strategy.pp=1,2,4 $S hydra.sweep.dir=$R/ws4
  run --multirun $L world_size=2 strategy.tp=1,2 strategy.pp=1,2 $S hydra.sweep.dir=$R/ws2
}
export -f phase; export R OUT RESULTS S L
timeout ${2:-540} bash -c phase
finish
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d) 2>/dev/null
