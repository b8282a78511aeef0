#!/usr/bin/env bash
# Prepared for one session's device calls (2 GPUs, nvidia-h200-x2), one phase per call:
#   exit     issue 4 (run 2026-11-23 at 92f9a71): the fp32 graph loss tests (then asserting no
#            exit_warning, now test_gpu2_cuda_graph_run_exits_by_itself), then eager vs graph for Megatron
#            1 GPU / DDP=2, TP=2 with and without sequence parallelism, PP=2 m=p / m=4p, DDP=2 graph
#            without overlapped gradient reduction, torch DDP=2 (step timing: events)
#   verify   the graph loss tests and the clean-exit test, then DDP=2 / TP=2 / PP=2 m=p graph runs:
#            does reset-then-destroy exit by itself (else the launcher's teardown deadline ends it)
#   megatron issue 6: the paper_megatron preset, all five models, world sizes 1 and 2, as one sweep
#   zero     issue 6: the paper_zero preset, all five models, world sizes 1 and 2, as one sweep
#   resume   issue 6: that paper_zero sweep resumed from its committed folder (resume=true
#            rerun_failed=true): the 11 runs the zero call's limit cut off
#   ddp      issue 4: where DDP=2's missing efficiency goes: Megatron 1 and 2 GPUs at global batch
#            8 and 16 (the per-rank batch ceiling), gradient reduction in fp32 vs bf16; torch
#            single at 8 and 16, DDP=2; then the verify phase's TP / PP graph runs and tests
#   autocast issue 3 (1 GPU): ZeRO-0 300m bf16 and gpt2 fp16 with DeepSpeed's torch_autocast
#            (fp32 weights, forward under autocast, as single) vs its bf16/fp16 wrappers; single
#   zero2    issue 3 (2 GPUs): ZeRO-0/1/2 with strategy.autocast=true at 2 GPUs (1 GPU: autocast1,
#            zero1), ZeRO-1/2 with CUDA graphs (compile_mode=reduce-overhead), ZeRO-3 with leaf blocks (two
#            prefetch sizes), ZeRO-1/2 with overlap and 5e7 buckets, DeepSpeed's own bf16
#            beside them; then the distopt phase
#   zero2dc  issue 3 (2 GPUs): ZeRO-3 with DeepCompile (its compile alone needs most of a call)
#   autocast1 issue 3 (1 GPU): ZeRO-0..3 and gpt2 fp16 through strategy.autocast=true
#   cmode    issue 3 (1 GPU): gpt2 fp16 single / ZeRO-0 autocast with compile_mode=reduce-overhead,
#            single with max-autotune-no-cudagraphs
#   zero1    issue 3 (1 GPU): ZeRO-0..3 autocast profiled at batch 16 and 8 (the 2-GPU per-rank batch), knobs
#   zero1b   issue 3 (1 GPU): ZeRO-1/2 with CUDA graphs (reduce-overhead), compiled ZeRO-0/3, FSDP2, single at batch 8
#   zero3c   issue 3 (1 GPU): compiled ZeRO-3's different losses: without overlap, DeepSpeed bf16, fp32
#   dc       issue 3 (1 GPU): ZeRO-3's host cost: DeepSpeed's DeepCompile (strategy.deepcompile) and blocks as
#            leaf modules (strategy.leaf_blocks), 300m batch 8 (the 2-GPU per-rank batch), profiled; single
#   dc2      issue 3 (1 GPU): after dc: DeepCompile ZeRO-3 on 10m, ZeRO-1 on 300m; leaf blocks in DeepSpeed's bf16; single
#   dc3      issue 3 (1 GPU): after dc2: leaf blocks at batch 16; 300m ZeRO-3 DeepCompile with a 420 s run limit
#   dcz2     issue 3 (1 GPU): DeepCompile ZeRO-2, 300m batch 8
#   dc12     issue 3 (1 GPU): the same for ZeRO-1/2 (DeepCompile), ZeRO-3 DeepCompile in DeepSpeed's bf16, batch 16
#   fsdp1    issue 3 (1 GPU): FSDP2's host time at the 2-GPU per-rank batch (300m batch 8), compiled:
#            blocks_per_unit 1 / 4 / 24, both reshard settings, profiled; single eager and compiled
#   fsdp1b   issue 3 (1 GPU), after fsdp1: the FSDP2 GPU test; eager FSDP2 and FSDP2 with CUDA graphs
#            (compile_mode=reduce-overhead) per unit size, profiled; single at 16 and compiled at 8, profiled
#   fsdp1c   issue 3 (1 GPU), after fsdp1b: FSDP2 at batch 16 (is its extra time per step fixed?), units of 1 / 4,
#            both reshard settings, compiled; single compiled at 16
#   fsdp2    issue 3 (2 GPUs): FSDP2 against the 85% / 75% targets, compiled, units of 1 / 4 / 24 blocks
#            (fsdp1: 1-GPU ceilings 59% / 55% at units of 24 / 4), explicit prefetch with resharding; single
#   x2a      issue 3 (2 GPUs, session 12): the fsdp2 phase, then the zero2 phase's autocast / CUDA-graph / leaf-block runs
#   x2b      issues 3-4 (2 GPUs, session 12): ZeRO overlap and DeepSpeed bf16; torch TP=2 / PP=2 compiled; the distopt phase
#   x2c      issue 4 (2 GPUs, session 12): Megatron TP=2 / PP=2 (graphs) and torch TP=2 / PP=2 (compiled), profiled
#   x2g      issue 3 (2 GPUs, session 13): FSDP2 units / prefetch, each twice within one call
#   x2h      issues 3-4 (2 GPUs, session 13): ZeRO-1/2 graphs (also without DeepSpeed's per-step
#            gradient norm) and Megatron DDP=2 (+ distributed optimizer), repeated with their 1-GPU runs
#   x2i      issues 3-4 (2 GPUs, session 13): ZeRO-1/2 with strategy.compute_grad_norm=false, FSDP2 units of 8,
#            Megatron DDP=2 with the distributed optimizer
#   x2j      issue 3 (2 GPUs, session 13): FSDP2 units of 8 at global batch 32 against single / DDP there; units 6, 12
#   x2k      issue 3 (2 GPUs, session 14): FSDP2 units of 8 and DDP=2 with cpu_affinity=none,split, twice
#   x2l      issue 3 (2 GPUs, session 14): FSDP2 units of 8 (reshard off / on) and DDP=2 profiled per rank
#            (metrics.profile_steps=2), twice; single compiled profiled (at batch 16: see the phase)
#   distopt  issue 4: Megatron DDP=2 (graph) with the distributed optimizer (param gather overlapped
#            or not), fp32 vs bf16 reduction, bucket sizes; torch single / DDP=2; 30 timed steps
# Earlier phases (graphs, timing, teardown) are this file at commit 0a90dc6.
#   bash benchmarks/gpu_todo.sh OUTDIR exit|verify|megatron|zero|resume|ddp|distopt|autocast|zero2|autocast1|cmode|zero1|zero1b|zero3c|dc|dc12|dc2|dc3|dcz2|zero2dc|fsdp1|fsdp1b|fsdp1c|fsdp2|x2a|x2b|x2c|x2g|x2h|x2i|x2j|x2k|x2l [seconds]
set -u
OUT=${1:-/tmp/out}; PHASE=${2:-exit}; R=/tmp/runs_$PHASE; RESULTS=${PHASE}_runs; mkdir -p $OUT $R
. benchmarks/gpu_env.sh
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > $OUT/machine.txt 2>&1
{ nvidia-smi topo -m; nvidia-smi nvlink -s; lscpu | grep -E "Model name|^CPU\(s\)|NUMA"; } >> $OUT/machine.txt 2>&1  # which link, which host
exit_phase() {
  PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 200 python -m pytest -q --durations=0 tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph)" > $OUT/gpu_tests_graph.txt 2>&1
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=90"
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=false,true $S hydra.sweep.dir=$R/ws12
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=true strategy.sequence_parallel=false,true $S hydra.sweep.dir=$R/tp2
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=p,4p strategy.cuda_graph=true $S hydra.sweep.dir=$R/pp2
  run --multirun strategy=megatron world_size=2 strategy.cuda_graph=true strategy.overlap_grad_reduce=false $S hydra.sweep.dir=$R/dp2_no_overlap
  run --multirun strategy=ddp world_size=2 $S hydra.sweep.dir=$R/torch_ddp2
}
verify_phase() {  # the graph runs' exit (reset, then destroy; launcher's teardown deadline) and loss tests
  PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 300 python -m pytest -v --durations=0 tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph) or test_gpu2_cuda_graph_run_exits_by_itself" \
    > $OUT/gpu_tests_graph.txt 2>&1
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=90"
  run --multirun strategy=megatron world_size=2 strategy.cuda_graph=true $S hydra.sweep.dir=$R/dp
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=true $S hydra.sweep.dir=$R/tp
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=p strategy.cuda_graph=true $S hydra.sweep.dir=$R/pp
}
megatron_phase() {
  run --multirun +experiment=paper_megatron world_size=1,2 steps=20 warmup_steps=5 run_timeout_s=120 hydra.sweep.dir=$R/paper_megatron
}
zero_phase() {
  build_ds_ops; wait_ds_ops
  run --multirun +experiment=paper_zero world_size=1,2 steps=20 warmup_steps=5 run_timeout_s=120 hydra.sweep.dir=$R/paper_zero
}
resume_phase() {
  cp -r results/2026-11-23-h200x2-graph-teardown-paper-sweeps/runs/paper_zero $R/paper_zero
  build_ds_ops; wait_ds_ops
  run --multirun +experiment=paper_zero world_size=1,2 steps=20 warmup_steps=5 run_timeout_s=120 \
    hydra.sweep.dir=$R/paper_zero resume=true rerun_failed=true
}
ddp_phase() {
  S="model=300m steps=20 warmup_steps=6 run_timeout_s=90 teardown_timeout_s=15"
  run --multirun strategy=megatron world_size=1,2 model.global_batch=8,16 strategy.cuda_graph=true \
    strategy.grad_reduce_in_fp32=true,false $S hydra.sweep.dir=$R/megatron_ceiling
  run --multirun strategy=single model.global_batch=8,16 $S hydra.sweep.dir=$R/torch_single
  run --multirun strategy=ddp world_size=2 model.global_batch=16 $S hydra.sweep.dir=$R/torch_ddp
  S="$S model.global_batch=16"
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=true $S hydra.sweep.dir=$R/tp
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=p strategy.cuda_graph=true $S hydra.sweep.dir=$R/pp
  PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=1 timeout 300 python -m pytest -v --durations=0 tests/test_model_parallel.py \
    -k "test_gpu_megatron_cuda_graph_matches_single or (test_gpu2_fp32_matches_single and graph) or test_gpu2_cuda_graph_run_exits_by_itself" \
    > $OUT/gpu_tests_graph.txt 2>&1
}
distopt_phase() {  # 30 timed steps each
  S="model=300m model.global_batch=16 steps=30 warmup_steps=6 run_timeout_s=90 teardown_timeout_s=15"
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=true strategy.grad_reduce_in_fp32=true,false \
    $S hydra.sweep.dir=$R/megatron
  run --multirun strategy=megatron world_size=2 strategy.cuda_graph=true strategy.use_distributed_optimizer=true \
    strategy.overlap_param_gather=false,true strategy.grad_reduce_in_fp32=true,false $S hydra.sweep.dir=$R/distopt
  run --multirun strategy=megatron world_size=2 strategy.cuda_graph=true strategy.grad_reduce_in_fp32=false \
    strategy.bucket_size=10000000,100000000 $S hydra.sweep.dir=$R/buckets
  run --multirun strategy=single $S hydra.sweep.dir=$R/torch_single
  run --multirun strategy=ddp world_size=2 $S hydra.sweep.dir=$R/torch_ddp
}
autocast_phase() {  # one GPU: DeepSpeed ZeRO-0 with its own 16-bit wrapper vs its torch_autocast mode
  A="steps=20 warmup_steps=6 run_timeout_s=150"
  BF="+strategy.ds_config.bf16.enabled=false +strategy.ds_config.torch_autocast.enabled=true +strategy.ds_config.torch_autocast.dtype=bfloat16"
  FP="+strategy.ds_config.fp16.enabled=false +strategy.ds_config.torch_autocast.enabled=true +strategy.ds_config.torch_autocast.dtype=float16"
  build_ds_ops
  run --multirun model=300m model.global_batch=16 strategy=single $A hydra.sweep.dir=$R/single300
  run --multirun model=gpt2 precision=fp16 strategy=single compile=false,true $A hydra.sweep.dir=$R/single_gpt2
  wait_ds_ops
  run --multirun model=300m model.global_batch=16 strategy=zero $A hydra.sweep.dir=$R/zero300_ds
  run --multirun model=300m model.global_batch=16 strategy=zero $BF $A hydra.sweep.dir=$R/zero300_autocast
  run --multirun model=gpt2 precision=fp16 strategy=zero compile=false,true $FP $A hydra.sweep.dir=$R/gpt2_autocast
  run --multirun model=gpt2 precision=fp16 strategy=zero compile=false,true $A hydra.sweep.dir=$R/gpt2_ds
}
zero2_phase() {  # 2 GPUs: ZeRO-1/2/3 with strategy.autocast=true against the 2-GPU targets, then distopt
  A="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150"
  build_ds_ops
  run --multirun strategy=single $A hydra.sweep.dir=$R/single
  wait_ds_ops
  zero2_runs
  zero2_knob_runs
  distopt_phase
}
zero2_runs() {  # the zero2 phase's ZeRO runs, most valuable first (after build_ds_ops / wait_ds_ops; uses $A)
  run --multirun strategy=zero strategy.autocast=true world_size=2 strategy.zero_stage=0,1,2 $A hydra.sweep.dir=$R/zero_autocast
  # zero1b (1 GPU, batch 8) put ZeRO-1/2 with CUDA graphs at 85% / 83% of single: the 2-GPU check,
  # with compiled single in the same mode as the like-for-like baseline
  run --multirun strategy=zero strategy.autocast=true world_size=2 strategy.zero_stage=1,2 compile=true \
    compile_mode=reduce-overhead $A hydra.sweep.dir=$R/zero_autocast_ro
  run --multirun strategy=single compile=true compile_mode=reduce-overhead $A hydra.sweep.dir=$R/single_ro
  # dc / dc3 (1 GPU, batch 8): ZeRO-3 with blocks as leaf modules 2x, with DeepCompile 3x (compiles ~230 s)
  run --multirun strategy=zero strategy.autocast=true world_size=2 strategy.zero_stage=3 strategy.leaf_blocks=true \
    strategy.prefetch_bucket_size=5e7,2e8 $A hydra.sweep.dir=$R/zero3_leaf
}
zero2_knob_runs() {  # ZeRO-1/2 with overlap and 5e7 buckets, and DeepSpeed's own bf16 (uses $A)
  run --multirun strategy=zero strategy.autocast=true world_size=2 strategy.zero_stage=1,2 strategy.overlap_comm=true \
    strategy.reduce_bucket_size=5e7 $A hydra.sweep.dir=$R/zero_autocast_overlap
  run --multirun strategy=zero world_size=2 strategy.zero_stage=1,2,3 $A hydra.sweep.dir=$R/zero_ds
}
zero2dc_phase() {  # 2 GPUs: ZeRO-3 with DeepCompile (~230 s of compiling in its warm-up on one GPU), its own call
  A="model=300m model.global_batch=16 steps=20 warmup_steps=8 strategy=zero strategy.autocast=true"
  build_dc_op
  run --multirun world_size=2 strategy.zero_stage=3 compile=true strategy.deepcompile=true run_timeout_s=450 $A hydra.sweep.dir=$R/zero3_dc
}
autocast1_phase() {  # 1 GPU: the same through strategy.autocast (no 2-GPU machine)
  A="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150"
  build_ds_ops
  run --multirun strategy=single $A hydra.sweep.dir=$R/single
  wait_ds_ops
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=0,1,2,3 $A hydra.sweep.dir=$R/zero_autocast
  run --multirun model=gpt2 precision=fp16 strategy=zero strategy.autocast=true compile=false,true steps=20 warmup_steps=6 \
    hydra.sweep.dir=$R/gpt2_autocast
  PYTHONUNBUFFERED=1 timeout 150 python -m pytest -v tests/test_gpu.py -k autocast > $OUT/gpu_test_autocast.txt 2>&1
}
cmode_phase() {  # 1 GPU: gpt2 fp16 with torch.compile modes (CUDA graphs; autotuned kernels)
  A="model=gpt2 precision=fp16 compile=true steps=20 warmup_steps=6 run_timeout_s=300"
  build_ds_ops
  run --multirun strategy=single compile_mode=reduce-overhead $A hydra.sweep.dir=$R/single_ro
  wait_ds_ops
  PYTHONUNBUFFERED=1 timeout 150 python -m pytest -v tests/test_gpu.py -k autocast > $OUT/gpu_test_autocast.txt 2>&1
  run --multirun strategy=zero strategy.autocast=true $A hydra.sweep.dir=$R/zero_default  # scale read moved after backward
  run --multirun strategy=zero strategy.autocast=true compile_mode=reduce-overhead $A hydra.sweep.dir=$R/zero_ro
  run --multirun strategy=single compile_mode=max-autotune-no-cudagraphs $A hydra.sweep.dir=$R/single_mat
  run --multirun strategy=zero strategy.autocast=true compile_mode=max-autotune-no-cudagraphs $A hydra.sweep.dir=$R/zero_mat
}
zero1_phase() {  # 1 GPU, no 2-GPU machine: where ZeRO-1/2/3 with autocast lose time against ZeRO-0
  # (profiled: host vs GPU time), at the 2-GPU run's per-rank batch 8 as well, and which knob recovers it
  A="model=300m steps=20 warmup_steps=6 run_timeout_s=150 metrics.profile_steps=2"
  build_ds_ops
  run --multirun strategy=single model.global_batch=16,8 $A hydra.sweep.dir=$R/single
  wait_ds_ops
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=0,1,2,3 model.global_batch=16,8 $A hydra.sweep.dir=$R/zero_autocast
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=1,2 model.global_batch=8 compile=true $A hydra.sweep.dir=$R/zero_compile
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=2 model.global_batch=8 strategy.overlap_comm=true $A hydra.sweep.dir=$R/zero2_overlap
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=2 model.global_batch=8 strategy.contiguous_gradients=false $A hydra.sweep.dir=$R/zero2_nocontig
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=3 model.global_batch=8 strategy.param_persistence_threshold=1e9 $A hydra.sweep.dir=$R/zero3_persist
}
zero1b_phase() {  # 1 GPU, after zero1: does taking launches off the host (compile, CUDA graphs) lift ZeRO-1/2/3?
  A="model=300m steps=20 warmup_steps=6 run_timeout_s=150 compile=true"
  build_ds_ops; wait_ds_ops
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=1,2 model.global_batch=8,16 compile_mode=reduce-overhead $A hydra.sweep.dir=$R/zero_ro
  run --multirun strategy=zero strategy.autocast=true strategy.zero_stage=0,3 model.global_batch=8 $A hydra.sweep.dir=$R/zero_c
  run --multirun strategy=fsdp strategy.reshard_after_forward=false,true model.global_batch=8 $A hydra.sweep.dir=$R/fsdp_c
  run --multirun strategy=single model.global_batch=8,16 $A hydra.sweep.dir=$R/single_c
}
zero3c_phase() {  # 1 GPU: compiled ZeRO-3 trained differently in zero1b (loss 9.1167 vs 9.0563): which knob is it?
  A="model=300m model.global_batch=8 steps=8 warmup_steps=3 run_timeout_s=120 strategy=zero strategy.zero_stage=3"
  build_ds_ops; wait_ds_ops
  run --multirun compile=true strategy.autocast=true strategy.overlap_comm=false $A hydra.sweep.dir=$R/no_overlap
  run --multirun compile=true strategy.autocast=false $A hydra.sweep.dir=$R/ds_bf16
  run --multirun compile=false,true precision=fp32 $A hydra.sweep.dir=$R/fp32
  run --multirun compile=false strategy.autocast=false $A hydra.sweep.dir=$R/ds_bf16_eager
}
fsdp1_phase() {  # 1 GPU: FSDP2 is host-bound at batch 8 (45% / 38% ceilings): fewer units, local-shard AdamW
  A="model=300m model.global_batch=8 steps=20 warmup_steps=6 run_timeout_s=150"
  run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single
  run --multirun strategy=fsdp compile=true strategy.reshard_after_forward=false,true strategy.blocks_per_unit=1,4,24 \
    metrics.profile_steps=2 $A hydra.sweep.dir=$R/fsdp_units
}
fsdp1b_phase() {  # 1 GPU, after fsdp1 (units of 24 blocks: 81 ms per step for 40 ms of GPU work)
  PYTHONUNBUFFERED=1 timeout 240 python -m pytest -v --durations=0 tests/test_gpu.py -k fsdp2 > $OUT/gpu_tests_fsdp.txt 2>&1
  tail -3 $OUT/gpu_tests_fsdp.txt >> $OUT/progress.txt
  A="model=300m steps=20 warmup_steps=6 run_timeout_s=150"
  run --multirun strategy=single model.global_batch=16 $A hydra.sweep.dir=$R/single16
  run --multirun strategy=single model.global_batch=8 compile=true metrics.profile_steps=2 $A hydra.sweep.dir=$R/single_c
  run --multirun strategy=fsdp model.global_batch=8 strategy.reshard_after_forward=false strategy.blocks_per_unit=1,24 \
    metrics.profile_steps=2 $A hydra.sweep.dir=$R/fsdp_eager
  run --multirun strategy=fsdp model.global_batch=8 compile=true compile_mode=reduce-overhead \
    strategy.reshard_after_forward=false,true strategy.blocks_per_unit=4,24 $A hydra.sweep.dir=$R/fsdp_graphs
}
fsdp1c_phase() {  # 1 GPU: at batch 8 FSDP2 adds ~40 ms per step to 40 ms of GPU work; does it at 16?
  A="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150 compile=true"
  run --multirun strategy=single $A hydra.sweep.dir=$R/single_c16
  run --multirun strategy=fsdp strategy.reshard_after_forward=false,true strategy.blocks_per_unit=1,4 $A hydra.sweep.dir=$R/fsdp16
}
fsdp2_phase() {  # 2 GPUs, after fsdp1/fsdp1b (one GPU at batch 8: 99.6k tokens/s with units of 24 blocks, 92.1k with 4 and resharding)
  A="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150"
  run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single
  run --multirun strategy=fsdp world_size=2 compile=true strategy.reshard_after_forward=false \
    strategy.blocks_per_unit=1,4,24 $A hydra.sweep.dir=$R/fsdp_keep
  run --multirun strategy=fsdp world_size=2 compile=true strategy.reshard_after_forward=true \
    strategy.blocks_per_unit=1,4 strategy.prefetch=0,1 $A hydra.sweep.dir=$R/fsdp_reshard
}
x2a_phase() {  # 2 GPUs, session 12, call 1: the fsdp2 phase, then the zero2 phase's ZeRO runs
  build_ds_ops
  fsdp2_phase
  wait_ds_ops
  zero2_runs
}
x2b_phase() {  # 2 GPUs, session 12, call 2: torch TP=2 / PP=2 compiled (local-shard AdamW since session 10); the zero2
  # phase's knob runs; the distopt phase (Megatron DDP=2)
  A="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150"
  build_ds_ops
  run --multirun strategy=tp strategy.impl=torch world_size=2 compile=false,true $A hydra.sweep.dir=$R/torch_tp
  run --multirun strategy=pp strategy.impl=torch world_size=2 strategy.microbatches=p,4p compile=true $A hydra.sweep.dir=$R/torch_pp
  wait_ds_ops
  zero2_knob_runs
  distopt_phase
}
x2c_phase() {  # 2 GPUs, session 12, call 3: why TP=2 / PP=2 m=4p fall short: Megatron (graphs) and torch (compiled), profiled
  S="model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=120 teardown_timeout_s=15 metrics.profile_steps=2"
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=tp world_size=2 strategy.cuda_graph=true $S hydra.sweep.dir=$R/megatron_tp
  CUDA_DEVICE_MAX_CONNECTIONS=1 run --multirun strategy=pp world_size=2 strategy.microbatches=p,4p strategy.cuda_graph=true $S hydra.sweep.dir=$R/megatron_pp
  run --multirun strategy=tp strategy.impl=torch world_size=2 compile=true $S hydra.sweep.dir=$R/torch_tp
  run --multirun strategy=pp strategy.impl=torch world_size=2 strategy.microbatches=p,4p compile=true $S hydra.sweep.dir=$R/torch_pp
  run --multirun strategy=megatron world_size=1 strategy.cuda_graph=true $S hydra.sweep.dir=$R/megatron1
}
x2g_phase() {  # 2 GPUs, prepared in session 12 for the next: FSDP2 settings compared within one call (session 12 saw
  # a 15% spread between calls for one configuration), each setting twice; 24 timed steps (session 12: 14)
  A="model=300m model.global_batch=16 steps=30 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  F="strategy=fsdp world_size=2 compile=true"
  for rep in 1 2; do
    run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single_$rep
    run --multirun strategy=ddp world_size=2 $A hydra.sweep.dir=$R/ddp_$rep  # the "plain DDP" reference
    run --multirun $F strategy.reshard_after_forward=false strategy.blocks_per_unit=4,8,24 $A hydra.sweep.dir=$R/fsdp_keep_$rep
    run --multirun $F strategy.reshard_after_forward=false strategy.blocks_per_unit=4 strategy.prefetch=1,2 $A hydra.sweep.dir=$R/fsdp_keep_prefetch_$rep
    # gradients reduce-scattered in bf16: half the bytes, and no per-gradient cast to fp32 before the collective
    run --multirun $F strategy.reshard_after_forward=false strategy.blocks_per_unit=4,24 strategy.reduce_dtype=param $A hydra.sweep.dir=$R/fsdp_keep_bf16_$rep
    run --multirun $F strategy.reshard_after_forward=true strategy.blocks_per_unit=4,8 $A hydra.sweep.dir=$R/fsdp_reshard_$rep
  done
}
x2h_phase() {  # 2 GPUs, prepared in session 12 for the next (after x2g): the near-target ZeRO-1/2 and Megatron DDP=2
  # runs repeated beside their one-GPU references
  A="model=300m model.global_batch=16 steps=30 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  build_ds_ops
  run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single
  run --multirun strategy=ddp world_size=2 $A hydra.sweep.dir=$R/ddp  # this host's plain-DDP reference
  wait_ds_ops
  run --multirun strategy=zero strategy.autocast=true world_size=1,2 strategy.zero_stage=1,2 compile=true \
    compile_mode=reduce-overhead $A hydra.sweep.dir=$R/zero_ro
  # DeepSpeed 0.19.8's ZeRO-1/2 step computes the global gradient norm even with gradient_clipping=0 and checks
  # it on the host (is_invalid_grad_norm: a device sync per step); zero_optimization.compute_grad_norm=false skips both
  run --multirun strategy=zero strategy.autocast=true world_size=1,2 strategy.zero_stage=1,2 compile=true \
    compile_mode=reduce-overhead +strategy.ds_config.zero_optimization.compute_grad_norm=false $A hydra.sweep.dir=$R/zero_ro_nonorm
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=true strategy.use_distributed_optimizer=false,true \
    $A hydra.sweep.dir=$R/megatron
}
x2i_phase() {  # 2 GPUs, session 13 after x2g / x2h: ZeRO-1/2 with strategy.compute_grad_norm=false (the knob, not the raw
  # ds_config) repeated; FSDP2's best units of x2g (8) on another host; Megatron DDP=2 + distributed optimizer again
  A="model=300m model.global_batch=16 steps=30 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  Z="strategy=zero strategy.autocast=true strategy.zero_stage=1,2 compile=true compile_mode=reduce-overhead strategy.compute_grad_norm=false"
  build_ds_ops
  run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single
  run --multirun strategy=ddp world_size=2 $A hydra.sweep.dir=$R/ddp
  wait_ds_ops
  run --multirun $Z world_size=1,2 $A hydra.sweep.dir=$R/zero_nonorm
  run --multirun $Z world_size=2 $A hydra.sweep.dir=$R/zero_nonorm_again
  run --multirun strategy=fsdp world_size=2 compile=true strategy.reshard_after_forward=false strategy.blocks_per_unit=8,24 \
    $A hydra.sweep.dir=$R/fsdp_keep
  run --multirun strategy=fsdp world_size=2 compile=true strategy.reshard_after_forward=true strategy.blocks_per_unit=8 \
    $A hydra.sweep.dir=$R/fsdp_reshard
  run --multirun strategy=megatron world_size=1,2 strategy.cuda_graph=true strategy.use_distributed_optimizer=true \
    $A hydra.sweep.dir=$R/megatron_distopt
}
x2j_phase() {  # 2 GPUs, session 13 after x2i: is FSDP2's gap its fixed per-step host cost? The same at global batch 32
  # (16 sequences per rank: at batch 16 on one GPU FSDP2 matched compiled single); units of 6 / 12 at batch 16
  A="model=300m steps=30 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  F="strategy=fsdp world_size=2 compile=true strategy.blocks_per_unit=8"
  run --multirun strategy=single compile=false,true model.global_batch=16,32 $A hydra.sweep.dir=$R/single
  run --multirun $F strategy.reshard_after_forward=false,true model.global_batch=32 $A hydra.sweep.dir=$R/fsdp_b32
  run --multirun strategy=ddp world_size=2 model.global_batch=16,32 $A hydra.sweep.dir=$R/ddp
  run --multirun strategy=fsdp world_size=2 compile=true strategy.reshard_after_forward=false strategy.blocks_per_unit=6,12 \
    model.global_batch=16 $A hydra.sweep.dir=$R/fsdp_units
}
x2k_phase() {  # 2 GPUs, session 14 (prepared in 13): FSDP2 at global batch 16 had one rank's GPU busy 41-58% and the other's
  # 76-98% (one host sets the pace?): each rank pinned to its own CPUs (cpu_affinity=split) against the OS's placement
  A="model=300m model.global_batch=16 steps=30 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  run --multirun strategy=single compile=false,true $A hydra.sweep.dir=$R/single
  for rep in 1 2; do
    run --multirun strategy=fsdp world_size=2 compile=true strategy.blocks_per_unit=8 strategy.reshard_after_forward=false,true \
      cpu_affinity=none,split $A hydra.sweep.dir=$R/fsdp_$rep
    run --multirun strategy=ddp world_size=2 cpu_affinity=none,split $A hydra.sweep.dir=$R/ddp_$rep
  done
}
x2l_phase() {  # 2 GPUs, after x2k (pinning did not even out FSDP2's ranks): is each rank's GPU work the same and one
  # rank's NCCL kernels waiting for the other (a phase offset between two host-bound ranks), or is one GPU doing more?
  python -c "import torch, torch._dynamo.config as c; print('torch', torch.__version__, 'skip_fsdp_hooks' in dir(c))" >> $OUT/progress.txt 2>&1
  A="model=300m model.global_batch=16 steps=24 warmup_steps=6 run_timeout_s=150 teardown_timeout_s=15"
  run --multirun strategy=single compile=false $A hydra.sweep.dir=$R/single16
  # compiled single at batch 16, profiled (session 14 also passed model.global_batch=8 here, before $A, whose 16 won:
  # hence the folder's name)
  run --multirun strategy=single compile=true metrics.profile_steps=2 $A hydra.sweep.dir=$R/single8_prof
  for rep in 1 2; do
    run --multirun strategy=fsdp world_size=2 compile=true strategy.blocks_per_unit=8 strategy.reshard_after_forward=false,true \
      metrics.profile_steps=2 $A hydra.sweep.dir=$R/fsdp_prof_$rep
  done
  run --multirun strategy=ddp world_size=2 metrics.profile_steps=2 $A hydra.sweep.dir=$R/ddp_prof
}
build_dc_op() {  # DeepCompile's CUDA op (JIT, into TORCH_EXTENSIONS_DIR), with FusedAdam
  build_ds_ops; wait_ds_ops
  python -c "from deepspeed.ops.op_builder import DeepCompileBuilder as D; D().load(); print('dc built')" > $R/dc_op.txt 2>&1
  tail -1 $R/dc_op.txt | tee -a $OUT/progress.txt
}
dc_phase() {  # 1 GPU: can ZeRO-3's per-module / per-parameter hooks (328 ms host vs 71 ms GPU per step) go?
  A="model=300m model.global_batch=8 steps=24 warmup_steps=8 run_timeout_s=240 metrics.profile_steps=2 strategy.autocast=true"
  build_dc_op
  run --multirun strategy=zero strategy.zero_stage=3 compile=true strategy.deepcompile=true $A hydra.sweep.dir=$R/z3_dc
  run --multirun strategy=zero strategy.zero_stage=3 strategy.leaf_blocks=true,false $A hydra.sweep.dir=$R/z3_leaf
  run --multirun strategy=zero strategy.zero_stage=3 compile=true strategy.deepcompile=true strategy.leaf_blocks=true $A hydra.sweep.dir=$R/z3_dc_leaf
}
dc2_phase() {  # 1 GPU, after dc (300m ZeRO-3 DeepCompile: no first step in 240 s): DeepCompile on 10m, ZeRO-1 on 300m;
  # ZeRO-3 leaf blocks in DeepSpeed's bf16; single eager / compiled (dc's single runs were given strategy.autocast)
  A="model.global_batch=8 steps=24 warmup_steps=8 metrics.profile_steps=2"
  build_dc_op
  run --multirun strategy=single model=300m compile=false,true $A hydra.sweep.dir=$R/single
  run --multirun strategy=zero strategy.zero_stage=3 model=300m strategy.leaf_blocks=true strategy.autocast=false $A hydra.sweep.dir=$R/z3_leaf_bf16
  run --multirun strategy=zero strategy.zero_stage=3 model=10m strategy.autocast=true compile=true strategy.deepcompile=true run_timeout_s=150 $A hydra.sweep.dir=$R/z3_dc_10m
  run --multirun strategy=zero strategy.zero_stage=3 model=10m strategy.autocast=true $A hydra.sweep.dir=$R/z3_10m
  run --multirun strategy=zero strategy.zero_stage=1 model=300m strategy.autocast=true compile=true strategy.deepcompile=true run_timeout_s=200 $A hydra.sweep.dir=$R/z1_dc
}
dc3_phase() {  # 1 GPU, after dc2: ZeRO-3 leaf blocks at batch 16; 300m ZeRO-3 DeepCompile given 420 s for its first steps
  A="steps=24 warmup_steps=8 metrics.profile_steps=2 model=300m strategy=zero strategy.zero_stage=3 strategy.autocast=true"
  build_dc_op
  run --multirun strategy.leaf_blocks=true model.global_batch=16 $A hydra.sweep.dir=$R/z3_leaf_16
  run --multirun compile=true strategy.deepcompile=true model.global_batch=8 run_timeout_s=420 $A hydra.sweep.dir=$R/z3_dc_300m
}
dcz2_phase() {  # 1 GPU, the device time left after dc3: DeepCompile ZeRO-2 (ZeRO-1's was slower than eager)
  build_dc_op
  run --multirun strategy=zero strategy.zero_stage=2 strategy.autocast=true model=300m model.global_batch=8 steps=24 warmup_steps=8 \
    compile=true strategy.deepcompile=true run_timeout_s=200 hydra.sweep.dir=$R/z2_dc
}
dc12_phase() {  # 1 GPU: DeepCompile for ZeRO-1/2; ZeRO-3 DeepCompile in DeepSpeed's bf16 and at batch 16
  A="model=300m steps=24 warmup_steps=8 run_timeout_s=240 metrics.profile_steps=2 compile=true strategy.deepcompile=true"
  build_dc_op
  run --multirun strategy=zero strategy.zero_stage=1,2 strategy.autocast=true model.global_batch=8 $A hydra.sweep.dir=$R/z12_dc
  run --multirun strategy=zero strategy.zero_stage=3 strategy.autocast=false model.global_batch=8 $A hydra.sweep.dir=$R/z3_dc_bf16
  run --multirun strategy=zero strategy.zero_stage=3 strategy.autocast=true model.global_batch=16 $A hydra.sweep.dir=$R/z3_dc_16
}
export -f zero2_runs zero2_knob_runs x2l_phase x2k_phase x2j_phase x2i_phase x2h_phase x2g_phase x2c_phase x2a_phase x2b_phase fsdp1c_phase fsdp2_phase fsdp1b_phase fsdp1_phase dcz2_phase zero2dc_phase build_dc_op dc_phase dc2_phase dc3_phase dc12_phase zero3c_phase zero1b_phase zero1_phase exit_phase distopt_phase autocast_phase zero2_phase autocast1_phase cmode_phase verify_phase megatron_phase zero_phase resume_phase ddp_phase; export R OUT RESULTS
timeout ${3:-520} bash -c "${PHASE}_phase"
finish
tar czf $OUT/sweeps.tgz -C $R $(cd $R && find . -name status.json -o -name metrics.json -o -name summary.json -o -name '.hydra' -type d -o -name 'rank*.log') 2>/dev/null
