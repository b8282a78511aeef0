#!/usr/bin/env bash
# The full GPU list for issues 2-3 (DDP scaling investigation, ZeRO/FSDP2 incl. defaults, offload, gpt2 ZeRO 0-3).
# Its first attempt (2026-11-22) failed at start-up (a missing wheel on the GPU host): not yet run.
#   bash benchmarks/gpu_call2.sh OUTDIR
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs2; RESULTS=call2_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops  # DeepSpeed's JIT op builds in the background while the DDP runs go (a few of 32 cores)
S="steps=30 warmup_steps=10 run_timeout_s=300"
M="model=300m model.global_batch=16"
phase1() {
  # most important first: the timeout cuts the tail
  run --multirun $M strategy=single $S hydra.sweep.dir=$R/single_300m
  torchrun --nproc-per-node 2 benchmarks/bare_loop.py --model 300m --batch 16 --steps 30 --warmup 10 | tee -a $OUT/bare.jsonl
  run $M strategy=ddp world_size=2 strategy.bucket_cap_mb=100 $S hydra.run.dir=$R/ddp_bucket100
  wait_ds_ops
  run $M strategy=zero strategy.zero_stage=0 $S hydra.run.dir=$R/zero0_1gpu
  run --multirun $M world_size=2 strategy=zero strategy.zero_stage=1,2 strategy.overlap_comm=true strategy.reduce_bucket_size=5e7 strategy.allgather_bucket_size=2e8 $S hydra.sweep.dir=$R/zero12_tuned
  run $M world_size=2 strategy=zero strategy.zero_stage=3 strategy.reduce_bucket_size=5e7 strategy.prefetch_bucket_size=1e8 strategy.param_persistence_threshold=2e6 $S hydra.run.dir=$R/zero3_tuned
  run --multirun $M world_size=2 strategy=fsdp strategy.reshard_after_forward=true,false strategy.prefetch=2 $S hydra.sweep.dir=$R/fsdp2
  run --multirun model=gpt2 precision=fp16 strategy=zero strategy.zero_stage=0,1,2,3 $S hydra.sweep.dir=$R/gpt2_fp16_zero
  run $M world_size=2 strategy=zero strategy.zero_stage=3 strategy.offload_optimizer=cpu strategy.reduce_bucket_size=5e7 strategy.prefetch_bucket_size=1e8 $S hydra.run.dir=$R/zero3_offload
  run --multirun $M world_size=2 strategy=zero strategy.zero_stage=1,2,3 $S hydra.sweep.dir=$R/zero_defaults
  run --multirun $M strategy=ddp world_size=2 compile=true $S hydra.sweep.dir=$R/ddp_compile
}
export -f phase1; export R OUT RESULTS S M BUILD
timeout ${2:-520} bash -c phase1
finish
