# A/B of four commands, each side's checkout run with the same .venv (python -m bench finds the checkout's bench/ first):
#   bash ab.sh BASE_CHECKOUT NEW_CHECKOUT PYTHON > ab.txt   (lines: side command wall_s user_s sys_s)
BASE=$1 NEW=$2 P=$3 T=$(mktemp -d)
one() { local r=$1 side=$2 cmd=$3; shift 3; cd "$r"; /usr/bin/time -f "%e %U %S" "$P" "$@" >/dev/null 2>"$T/err"; echo "$side $cmd $(tail -n 1 "$T/err")"; }
for i in 1 2 3 4 5; do
 for side in base main; do
  R=$BASE; [ $side = main ] && R=$NEW
  one "$R" $side dry_run -m bench dry_run=true model=llama3_8b strategy=fsdp world_size=8 hardware=h100_sxm_80gb hydra.run.dir=$T/d
  one "$R" $side refused -m bench strategy=zero zero_stage=5 hydra.run.dir=$T/r
  one "$R" $side planner -m bench.planner model=llama3_1b hardware=h100_sxm_80gb gpus_per_node=4
  one "$R" $side run_1rank -m bench steps=3 warmup_steps=1 hydra.run.dir=$T/run_$side$i
 done
done
