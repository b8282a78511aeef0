# The fork server's preload of deepspeed on a GPU host: (1) importing deepspeed in a process with torch's NVML-based
# CUDA check leaves CUDA unstarted there, and a process forked from it starts CUDA and runs a kernel; (2) a ZeRO sweep's
# per-run start-up with deepspeed preloaded (this tree) and without it (a copy of this tree whose ZeRO spec preloads
# only TorchInductor, as before), alternating, each sweep the same three runs on one GPU.
#   . benchmarks/gpu_env.sh && bash benchmarks/preload_gpu.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
PYTORCH_NVML_BASED_CUDA_CHECK=1 python - > "$OUT/fork_check.txt" 2>&1 <<'EOF'
import os, torch
calls = []
for n in ("_lazy_init", "init", "current_device", "get_device_properties"):
    f = getattr(torch.cuda, n)
    setattr(torch.cuda, n, (lambda f, n: lambda *a, **k: (calls.append(n), f(*a, **k))[1])(f, n))
import deepspeed  # noqa: F401
print("after import deepspeed: torch.cuda.is_initialized()", torch.cuda.is_initialized(), "calls", calls,
      "accelerator", deepspeed.get_accelerator().device_name())
pid = os.fork()
if pid == 0:
    x = torch.ones(1 << 20, device="cuda")
    print("forked child: CUDA kernel ran, sum", float(x.sum()), "device", torch.cuda.get_device_name(0), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("forked child exit status", status)
EOF
# a fork server imports its preloads before a rank rewrites TORCH_CUDA_ARCH_LIST (bench/strategies/deepspeed_env.py)
TORCH_CUDA_ARCH_LIST=9.0a python -c "import deepspeed; print('import deepspeed under TORCH_CUDA_ARCH_LIST=9.0a: ok')" \
  >> "$OUT/fork_check.txt" 2>&1
grep -v "^\[W" "$OUT/fork_check.txt"
BASE=/tmp/preload_base
rm -rf $BASE && mkdir -p $BASE && cp -r bench conf hydra_plugins multirun_analysis pyproject.toml $BASE/
sed -i 's/preload=lambda strategy: ("torch._inductor.compile_fx", "deepspeed"),/preload=lambda strategy: ("torch._inductor.compile_fx",),/' \
  $BASE/bench/strategies/zero.py
grep -q 'preload=lambda strategy: ("torch._inductor.compile_fx",),' $BASE/bench/strategies/zero.py ||
  { echo "the baseline tree still preloads deepspeed: bench/strategies/zero.py changed"; exit 1; }
grep -n "preload=lambda" $BASE/bench/strategies/zero.py bench/strategies/zero.py
COMMON="strategy=zero zero_stage=1,2,3 world_size=1 model=100m precision=bf16 steps=6 warmup_steps=2 metrics.measure_matmul_peak=false"
for i in 1 2; do
  (cd $BASE && PYTHONPATH=$BASE:/tmp/site python -m bench --multirun $COMMON hydra.sweep.dir=$OUT/runs/without_$i) \
    > "$OUT/without_$i.log" 2>&1
  python -m bench --multirun $COMMON hydra.sweep.dir=$OUT/runs/with_$i > "$OUT/with_$i.log" 2>&1
done
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
rows = []
for m in sorted(Path(sys.argv[1], "runs").glob("*/*/metrics.json")):
    d = json.loads(m.read_text())
    r0 = d["ranks"][0]
    rows.append({"sweep": m.parent.parent.name, "run": m.parent.name, "status": d["status"],
                 "zero_stage": d["config"]["strategy"]["zero_stage"], "startup_s": d["job"]["startup_s"],
                 "wall_s": d["job"]["wall_s"], "setup_s": r0["setup_s"], "setup_phases_s": r0["setup_phases_s"],
                 "preloaded_modules": r0["preloaded_modules"], "tokens_per_s": d["throughput"]["tokens_per_s"],
                 "loss": d["loss"]["per_step"]})
Path(sys.argv[1], "summary.json").write_text(json.dumps(rows, indent=1))
for r in rows:
    print(r["sweep"], r["run"], r["status"], "stage", r["zero_stage"], "startup %.2f s" % r["startup_s"],
          "setup %.2f s" % r["setup_s"], "import deepspeed %.2f s" % r["setup_phases_s"].get("import deepspeed", 0),
          "deepspeed preloaded", "deepspeed" in r["preloaded_modules"], "%.0f tokens/s" % r["tokens_per_s"])
EOF
