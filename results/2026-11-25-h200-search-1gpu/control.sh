# Same-day control: the hand-found bests of results/ re-run exactly as recorded, beside the search's winners.
set -u
W=/tmp/ctl; mkdir -p $W
run() { name=$1; shift; t0=$(date +%s); python -m bench "$@" hydra.run.dir=$W/$name > $W/$name.log 2>&1; echo "$name rc=$? $(( $(date +%s) - t0 )) s" | tee -a $OUT/control.log; }
G1="strategy=single compile_mode=reduce-overhead model=gpt2 precision=fp16 compile=True steps=20 warmup_steps=6 run_timeout_s=300"
G2="model=gpt2 precision=fp16 world_size=1 strategy=single tuning=best steps=22 warmup_steps=4"
Z0="strategy=zero strategy.autocast=True compile_mode=reduce-overhead model=gpt2 precision=fp16 compile=True steps=20 warmup_steps=6 run_timeout_s=300"
F="strategy=fsdp strategy.reshard_after_forward=False strategy.blocks_per_unit=4 model=300m model.global_batch=16 steps=20 warmup_steps=6 run_timeout_s=150 compile=True"
Z3="strategy.leaf_blocks=True model.global_batch=16 steps=24 warmup_steps=8 metrics.profile_steps=2 model=300m strategy=zero strategy.zero_stage=3 strategy.autocast=True"
run g1a $G1; run g2a $G2; run g1b $G1; run g2b $G2
run z0a $Z0; run z0b $Z0
run fa $F; run fb $F
run z3a $Z3; run z3b $Z3
python benchmarks/collect.py $W > $OUT/table.txt 2>&1
python -m benchmarks.gpu $OUT tune --work $W --deadline-s 1 > /dev/null 2>&1
tail -3 $W/*.log | grep -iE "error|tokens/s" | head -20
