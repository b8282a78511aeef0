#!/usr/bin/env bash
# GPU session 3 (2 x H200): the ZeRO/FSDP2 runs that fit the remaining device time (results/2026-11-22-h200x2-sharding).
#   bash benchmarks/gpu_call3.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs3; RESULTS=call3_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops
S="steps=25 warmup_steps=8 run_timeout_s=120"
M="model=300m model.global_batch=16"
phase() {
  run $M strategy=single $S hydra.run.dir=$R/single_300m
  run $M world_size=2 strategy=fsdp strategy.reshard_after_forward=false strategy.prefetch=2 $S hydra.run.dir=$R/fsdp_noreshard
  run $M world_size=2 strategy=fsdp strategy.reshard_after_forward=true strategy.prefetch=2 $S hydra.run.dir=$R/fsdp_reshard
  wait_ds_ops
  run $M world_size=2 strategy=zero strategy.zero_stage=2 strategy.overlap_comm=true strategy.reduce_bucket_size=5e7 strategy.allgather_bucket_size=2e8 $S hydra.run.dir=$R/zero2_tuned
  run $M world_size=2 strategy=zero strategy.zero_stage=3 strategy.reduce_bucket_size=5e7 strategy.prefetch_bucket_size=1e8 strategy.param_persistence_threshold=2e6 $S hydra.run.dir=$R/zero3_tuned
  run $M world_size=2 strategy=zero strategy.zero_stage=1 strategy.overlap_comm=true strategy.reduce_bucket_size=5e7 strategy.allgather_bucket_size=2e8 $S hydra.run.dir=$R/zero1_tuned
  run $M strategy=zero strategy.zero_stage=0 $S hydra.run.dir=$R/zero0_1gpu
  run model=gpt2 precision=fp16 strategy=zero strategy.zero_stage=0 $S hydra.run.dir=$R/gpt2_zero0
}
export -f phase; export R OUT RESULTS S M BUILD
timeout ${2:-150} bash -c phase
finish
