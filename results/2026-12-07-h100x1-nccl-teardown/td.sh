# diagnostic: where a rank's teardown time goes (TD lines of the diag tree), 1 GPU
set -u
OUT=$1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch,megatron.core as m;print(torch.__version__, torch.cuda.nccl.version(), m.__version__)"
cd .baseline
for i in 1 2; do
PYTHONPATH=$PWD:/tmp/site python -m bench --multirun strategy=ddp,megatron,fsdp world_size=1 model=100m precision=bf16 \
  steps=8 warmup_steps=2 metrics.measure_matmul_peak=false hydra.sweep.dir=/tmp/td$i > $OUT/td$i.log 2>&1
done
PYTHONPATH=$PWD:/tmp/site python -m bench --multirun strategy=megatron world_size=1 model=100m precision=bf16 \
  strategy.use_distributed_optimizer=true,false steps=8 warmup_steps=2 metrics.measure_matmul_peak=false hydra.sweep.dir=/tmp/td3 > $OUT/td3.log 2>&1
python - <<'PY' | tee $OUT/td_summary.txt
import json, glob, re
for m in sorted(glob.glob('/tmp/td*/*/metrics.json')):
    d = json.load(open(m)); run = m.rsplit('/', 1)[0]
    r0 = json.load(open(run + '/rank0.json')); job = d['job']
    t0 = r0['t_loop_end']; t_end = t0 + job['teardown_s']
    print('==', run, d['status'], d['config']['strategy']['name'], 'teardown', round(job['teardown_s'], 3))
    for line in open(run + '/rank0.log'):
        if ' TD ' in line:
            mt = re.search(r't=([0-9.]+)', line)
            rel = f"+{float(mt.group(1)) - t0:.3f}" if mt else ''
            print('  ', rel, line.split('] ', 1)[-1].strip()[:300])
    print('   end', f"+{t_end - t0:.3f}")
PY
