# Source on the GPU host: install the carried wheels (.whl) and set the environment bench needs there.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HYDRA_FULL_ERROR=1
# DeepSpeed 0.19.8's op builder cannot parse '9.0a'
[ "${TORCH_CUDA_ARCH_LIST:-}" = "9.0a" ] && export TORCH_CUDA_ARCH_LIST=9.0
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
# a JIT build (DeepSpeed's fused Adam) stopped by an earlier call's limit leaves its lock, on which the next build of
# the op would wait for ever; no build of this repo's calls runs while this file is sourced
rm -f "$TORCH_EXTENSIONS_DIR"/*/lock 2>/dev/null
