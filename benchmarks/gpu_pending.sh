#!/usr/bin/env bash
# Follow-up GPU runs (made on 2026-11-22, 4 x H200 host, GPUs 0-1; results/2026-11-22-h200x4-followups):
#   gpt2 fp16 ZeRO-0 with compile (issue 3's 200k target), torch-native TP/PP compiled (300m) and on 1b (issue 4),
#   DDP with larger buckets / compile (issue 2's scaling gap), the rest of the paper_zero sweep (issue 6).
#   bash benchmarks/gpu_pending.sh OUTDIR [seconds]
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs_pending; RESULTS=pending_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
build_ds_ops
S="steps=20 warmup_steps=6 run_timeout_s=240 metrics.profile_steps=2"
M3="model=300m model.global_batch=16"
phase() {
  wait_ds_ops
  run --multirun model=gpt2 precision=fp16 strategy=zero strategy.zero_stage=0 compile=false,true $S hydra.sweep.dir=$R/gpt2_zero0
  run --multirun $M3 world_size=2 strategy=tp,pp strategy.impl=torch compile=true $S hydra.sweep.dir=$R/300m_torch_compiled
  run --multirun model=1b model.global_batch=16 world_size=2 strategy=tp,pp strategy.impl=torch $S hydra.sweep.dir=$R/1b_torch
  run --multirun $M3 strategy=ddp world_size=2 strategy.bucket_cap_mb=25,100 compile=false,true $S hydra.sweep.dir=$R/ddp
  # resume the committed sweep: runs only its 3 unfinished jobs
  cp -r results/2026-11-22-h200x2-paper-sweeps/runs/paper_zero $R/paper_zero
  run --multirun +experiment=paper_zero model=300m world_size=1,2 steps=20 warmup_steps=5 run_timeout_s=120 resume=true hydra.sweep.dir=$R/paper_zero
}
export -f phase; export R OUT RESULTS S M3
timeout ${2:-540} bash -c phase
finish
