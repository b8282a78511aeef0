"""megatron-core implementation of the tp x pp x dp family (its spec: bench/strategies/model_parallel.py).

Importing megatron.core takes ~5 s: this package's __init__ imports nothing; strategy.py and
model.py import megatron.core, and are imported only when a run uses impl=megatron.
"""

# strategy.cuda_graph: steps 0 .. CUDA_GRAPH_CAPTURE_STEP - 1 run eagerly (NCCL communicators, the
# allocator and cuBLAS set themselves up); that step is captured and every later one replays it
CUDA_GRAPH_CAPTURE_STEP = 2
