"""megatron-core implementation of the tp x pp x dp family (registered in model_parallel.py).

Importing megatron.core takes ~5 s: this package's __init__ imports nothing; strategy.py and
model.py import megatron.core, and are imported only when a run uses impl=megatron.
"""
