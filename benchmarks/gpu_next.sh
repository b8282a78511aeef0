#!/usr/bin/env bash
# A GPU call after the layout sweeps (gpu_issue7_layouts.sh), on the same machine; runs on GPUs 0-1,
# most important first: the timeout cuts the tail.
#   - issue 4: torch-native TP=2 after the all-reduce fix (300m, 1b; before it: 41,477 / 37,103 tokens/s)
#   - issue 6: start_method=forkserver vs spawn on a GPU host; where Megatron's and DeepSpeed's start-up
#     goes (metrics.json ranks[].setup_phases_s)
#   - issue 3: ZeRO-1 at 1 and 2 GPUs again, on this machine
#   bash benchmarks/gpu_next.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs_next; RESULTS=next_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops
S="steps=20 warmup_steps=6 run_timeout_s=180 metrics.profile_steps=2"
M3="model=300m model.global_batch=16"
M1="model=1b model.global_batch=16"
phase() {
  # issue 6: per-run overhead with ranks forked from a preloaded server (the new default) vs spawned
  run --multirun $M3 world_size=2 strategy=ddp,megatron start_method=spawn,forkserver steps=8 warmup_steps=3 run_timeout_s=120 hydra.sweep.dir=$R/start_method
  run --multirun $M3 world_size=2 strategy=tp strategy.impl=torch compile=false,true $S hydra.sweep.dir=$R/300m_torch_tp
  run $M1 world_size=2 strategy=tp strategy.impl=torch $S hydra.run.dir=$R/1b_torch_tp
  run $M3 strategy=megatron $S hydra.run.dir=$R/300m_megatron_1gpu
  wait_ds_ops
  run --multirun $M3 strategy=zero strategy.zero_stage=1 world_size=1,2 $S hydra.sweep.dir=$R/300m_zero1
}
export -f phase; export R OUT RESULTS S M3 M1
timeout ${2:-540} bash -c phase
finish
