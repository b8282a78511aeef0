#!/usr/bin/env bash
# Issue 6 on 2 x H200: the seed paper's Megatron and ZeRO matrices restricted to world sizes 1 and 2
# (and, to fit one 10-minute device call, to the models and steps below), each as one sweep.
#   bash benchmarks/gpu_paper_sweeps.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/sweeps; RESULTS=paper_sweeps; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops
S="steps=20 warmup_steps=5 run_timeout_s=120"
phase() {
  run --multirun +experiment=paper_megatron model=300m,1b world_size=1,2 $S hydra.sweep.dir=$R/paper_megatron
  wait_ds_ops
  run --multirun +experiment=paper_zero model=300m world_size=1,2 $S hydra.sweep.dir=$R/paper_zero
}
export -f phase; export R OUT RESULTS S
timeout ${2:-500} bash -c phase
finish
cp $R/*/summary.json $OUT/ 2>/dev/null; for d in $R/*/; do cp $d/summary.json $OUT/$(basename $d)_summary.json 2>/dev/null; done
tar czf $OUT/sweep_status.tgz $(find $R -name status.json -o -name metrics.json -o -name summary.json -o -name .hydra -type d) 2>/dev/null
