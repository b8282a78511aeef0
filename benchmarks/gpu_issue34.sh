#!/usr/bin/env bash
# 2 x H200, after gpu_issue4.sh: what it did not reach (1b, torch-native PP after its stride fix, bench's
# single at micro-batch 2) and issue 3's remaining runs (gpt2 fp16 ZeRO 0-3 on one GPU, ZeRO-3 +
# optimizer offload, ZeRO 1-3 at DeepSpeed's defaults).  Most important first.
#   bash benchmarks/gpu_issue34.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs34; RESULTS=issue34_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops  # FusedAdam and DeepSpeedCPUAdam build in the background while the first runs go
S="steps=20 warmup_steps=6 run_timeout_s=120 metrics.profile_steps=2"
M3="model=300m model.global_batch=16"
M1="model=1b model.global_batch=16"
phase() {
  run --multirun $M3 world_size=2 strategy=pp strategy.impl=torch strategy.microbatches=p,4p $S hydra.sweep.dir=$R/300m_torch_pp
  run $M3 strategy=single strategy.micro_batch_size=2 $S hydra.run.dir=$R/300m_single_micro2
  run --multirun $M1 strategy=single,megatron $S hydra.sweep.dir=$R/1b_1gpu
  run --multirun $M1 world_size=2 strategy=tp,megatron $S hydra.sweep.dir=$R/1b_tp_dp
  run --multirun $M1 world_size=2 strategy=pp strategy.microbatches=p,4p $S hydra.sweep.dir=$R/1b_pp
  wait_ds_ops
  run --multirun model=gpt2 precision=fp16 strategy=zero strategy.zero_stage=0,1,2,3 $S hydra.sweep.dir=$R/gpt2_fp16_zero
  run $M3 world_size=2 strategy=zero strategy.zero_stage=3 strategy.offload_optimizer=cpu $S hydra.run.dir=$R/300m_zero3_offload_opt
  run --multirun $M3 world_size=2 strategy=zero strategy.zero_stage=1,2,3 $S hydra.sweep.dir=$R/300m_zero_defaults
  run model=gpt2 precision=fp16 strategy=zero strategy.zero_stage=0 compile=true $S hydra.run.dir=$R/gpt2_fp16_zero0_compile
  run --multirun $M1 world_size=2 strategy=tp,pp strategy.impl=torch $S hydra.sweep.dir=$R/1b_torch
}
export -f phase; export R OUT RESULTS S M3 M1
timeout ${2:-540} bash -c phase
finish
