#!/usr/bin/env bash
# Issue 7 on 4 x H200 (nvidia-h200-x4): the seed paper's Megatron and ZeRO matrices at world sizes
# 1, 2 and 4 on one machine, each as one sweep (restricted, to fit 10-minute device calls, to the
# models and steps below). A sweep cut off by the call's limit is continued in the next call with
# resume=true on its folder (carried back as PREV/<name>).
#   bash benchmarks/gpu_issue7.sh OUTDIR megatron|zero [seconds] [PREV]
set -u
OUT=${1:-/tmp/out}; WHAT=${2:-megatron}; R=/tmp/sweeps7; RESULTS=issue7_$WHAT; PREV=${4:-}
mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; nvidia-smi topo -m; nproc; } > $OUT/machine.txt 2>&1
[ "$WHAT" = zero ] && build_ds_ops
S="world_size=1,2,4 steps=20 warmup_steps=5 run_timeout_s=150"
[ -n "$PREV" ] && cp -r $PREV/* $R/ && S="$S resume=true"
phase() {
  if [ "$WHAT" = megatron ]; then
    run --multirun +experiment=paper_megatron model=300m,1b $S hydra.sweep.dir=$R/paper_megatron
  else
    wait_ds_ops
    run --multirun +experiment=paper_zero model=300m $S hydra.sweep.dir=$R/paper_zero
  fi
}
export -f phase; export R OUT RESULTS S WHAT
timeout ${3:-540} bash -c phase
finish
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d) 2>/dev/null
