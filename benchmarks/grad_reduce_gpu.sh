# grad_reduce on one GPU: each strategy's knob for the run-level choice set, run on CUDA / NCCL, and what its record
# says (layout.grad_reduce, DeepSpeed's communication settings). One rank sums nothing across ranks, but FSDP2,
# ZeRO and Megatron still cast to the dtype set (a reduce-scatter / all-reduce over a group of one, Megatron's main
# grads); DDP refuses it at world_size=1 (nothing wrapped).
#   . benchmarks/gpu_env.sh && bash benchmarks/grad_reduce_gpu.sh OUT
set -u
OUT=$1
COMMON="model=100m steps=8 warmup_steps=3 metrics.measure_matmul_peak=false"
python -m bench --multirun strategy=fsdp,megatron grad_reduce=fp32,16bit $COMMON hydra.sweep.dir=$OUT/runs/a
python -m bench --multirun strategy=zero zero_stage=0 strategy.autocast=true grad_reduce=fp32,16bit $COMMON \
  hydra.sweep.dir=$OUT/runs/b
python -m bench --multirun strategy=zero zero_stage=1,2 strategy.autocast=false,true grad_reduce=fp32 $COMMON \
  hydra.sweep.dir=$OUT/runs/c
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
rows = []
for m in sorted(Path(sys.argv[1], "runs").glob("*/*/metrics.json")):
    d = json.loads(m.read_text())
    c, lay = d["config"], d.get("layout") or {}
    ds = lay.get("ds_config") or {}
    rows.append({"run": str(m.parent.relative_to(sys.argv[1])), "status": d["status"], "strategy": c["strategy"]["name"],
                 "knobs": {k: c["strategy"].get(k) for k in ("zero_stage", "autocast", "reduce_dtype",
                                                              "grad_reduce_in_fp32") if k in c["strategy"]},
                 "grad_reduce": lay.get("grad_reduce"), "communication_data_type": ds.get("communication_data_type"),
                 "torch_autocast": ds.get("torch_autocast"), "tokens_per_s": (d.get("throughput") or {}).get("tokens_per_s"),
                 "loss": (d.get("loss") or {}).get("per_step")})
Path(sys.argv[1], "summary.json").write_text(json.dumps(rows, indent=1))
for r in rows:
    print(r["run"], r["status"], r["strategy"], r["knobs"], r["grad_reduce"], r["communication_data_type"],
          r["torch_autocast"], r["tokens_per_s"])
EOF
