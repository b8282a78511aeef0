# Shared glue of the GPU scripts (source after setting OUT, R and RESULTS; no GPU needed here).
#   run ARGS...      python -m bench ARGS (log in $R), print its wall time, refresh $OUT/table.txt and
#                    $OUT/$RESULTS.json so results survive a call that is cut off
#   build_ds_ops     build DeepSpeed's FusedAdam and CPUAdam in the background (sets BUILD)
#   wait_ds_ops      wait for that build
#   finish           final table, and the tails of failed runs' logs in $OUT/errors.txt
run() {
  local t0=$SECONDS
  python -m bench "$@" > "$R/log_$RANDOM.txt" 2>&1
  echo "[$((SECONDS - t0)) s] $*" | tee -a "$OUT/progress.txt"
  python benchmarks/collect.py "$R" --out "$OUT/$RESULTS.json" > "$OUT/table.txt" 2>&1
}
build_ds_ops() {
  ( python -c "from deepspeed.ops.op_builder import FusedAdamBuilder as F; F().load(); print('FusedAdam built')" &
    python -c "from deepspeed.ops.op_builder import CPUAdamBuilder as C; C().load(); print('CPUAdam built')" &
    wait ) > "$R/ops.txt" 2>&1 &
  BUILD=$!
}
wait_ds_ops() { while kill -0 "$BUILD" 2>/dev/null; do sleep 1; done; tail -1 "$R/ops.txt"; }
finish() {
  python benchmarks/collect.py "$R" --out "$OUT/$RESULTS.json" | tee "$OUT/table.txt"
  grep -l "Traceback" "$R"/log_*.txt 2>/dev/null | head -3 | xargs -r tail -n 25 > "$OUT/errors.txt"
}
export -f run build_ds_ops wait_ds_ops finish
