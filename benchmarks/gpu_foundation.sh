#!/usr/bin/env bash
# Issue 2's GPU runs (single / DDP). On the GPU host: bash benchmarks/gpu_foundation.sh OUTDIR
set -u
OUT=${1:-/tmp/out}; R=/tmp/runs; RESULTS=foundation_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpus.txt
nvidia-smi topo -m >> $OUT/gpus.txt 2>&1
S="steps=30 warmup_steps=10"
run --multirun model=300m model.global_batch=16 compile=false,true $S hydra.sweep.dir=$R/single_300m_b16
run strategy=ddp world_size=2 model=300m model.global_batch=16 $S hydra.run.dir=$R/ddp_300m_b16
run model=300m model.global_batch=8 $S hydra.run.dir=$R/single_300m_b8
run strategy=ddp world_size=2 model=300m model.global_batch=32 $S hydra.run.dir=$R/ddp_300m_b32
run --multirun model=gpt2 precision=fp16 compile=false,true $S hydra.sweep.dir=$R/single_gpt2_fp16
run --multirun model=1b compile=false,true $S hydra.sweep.dir=$R/single_1b
for c in "" "--compile"; do python benchmarks/bare_loop.py --model 300m --batch 16 --steps 30 --warmup 10 $c; done | tee $OUT/bare_loop.jsonl
finish
python -m pytest -q -m "gpu or gpu2" tests 2>&1 | tail -5 | tee $OUT/pytest_gpu.txt
tail -n 30 $(ls -t $R/log_*.txt | head -1) > $OUT/last_log.txt
