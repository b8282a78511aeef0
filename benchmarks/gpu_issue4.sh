#!/usr/bin/env bash
# Issue 4 on 2 x H200: Megatron / torch-native TP, PP (m=p, m=4p) and DP on 300m and 1b, bf16,
# global batch 16, with the 1-GPU baselines and per-micro-batch ceilings; profiles (metrics.profile_steps)
# say where each step's time goes.  Most important first: the timeout cuts the tail.
#   bash benchmarks/gpu_issue4.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs4; RESULTS=issue4_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
S="steps=24 warmup_steps=8 run_timeout_s=150 metrics.profile_steps=3"
M3="model=300m model.global_batch=16"
M1="model=1b model.global_batch=16"
phase() {
  # 1 GPU: bench's single, Megatron tp=pp=dp=1 (fused and foreach AdamW), Megatron with 2 / 8 micro-batches
  # (each PP stage's micro-batch size at m=p / m=4p: the per-micro-batch ceiling of the pipeline runs)
  run --multirun $M3 strategy=single,megatron $S hydra.sweep.dir=$R/300m_1gpu
  run --multirun $M3 strategy=megatron strategy.microbatches=2,8 $S hydra.sweep.dir=$R/300m_1gpu_micro
  run $M3 strategy=megatron strategy.fused_adam=false $S hydra.run.dir=$R/300m_1gpu_foreach
  # 2 GPUs, Megatron
  run --multirun $M3 world_size=2 strategy=tp strategy.sequence_parallel=false,true $S hydra.sweep.dir=$R/300m_tp2
  run --multirun $M3 world_size=2 strategy=pp strategy.microbatches=p,4p $S hydra.sweep.dir=$R/300m_pp2
  run --multirun $M3 world_size=2 strategy=megatron strategy.use_distributed_optimizer=false,true $S hydra.sweep.dir=$R/300m_dp2
  # 2 GPUs, torch-native
  run --multirun $M3 world_size=2 strategy=tp,pp strategy.impl=torch $S hydra.sweep.dir=$R/300m_torch
  run $M3 world_size=2 strategy=pp strategy.impl=torch strategy.microbatches=p $S hydra.run.dir=$R/300m_torch_pp_mp
  # 1b
  run --multirun $M1 strategy=single,megatron $S hydra.sweep.dir=$R/1b_1gpu
  run --multirun $M1 world_size=2 strategy=tp,pp,megatron $S hydra.sweep.dir=$R/1b_2gpu
  run $M1 world_size=2 strategy=pp strategy.microbatches=p $S hydra.run.dir=$R/1b_pp_mp
  run --multirun $M1 world_size=2 strategy=tp,pp strategy.impl=torch $S hydra.sweep.dir=$R/1b_torch
}
export -f phase; export R OUT RESULTS S M3 M1
timeout ${2:-540} bash -c phase
finish
