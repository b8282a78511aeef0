"""megatron-core implementation of the tp x pp x dp family, and the ``megatron`` strategy.

``strategy=megatron`` is Megatron's data parallelism (DistributedDataParallel with
overlapped bucketed all-reduce, optional distributed optimizer) by default (tp = pp = 1);
with strategy.tp / strategy.pp it is any 3D layout.  ``strategy=tp`` / ``strategy=pp`` with
``impl=megatron`` (their default) run the same code.

Importing megatron.core takes ~5 s and needs nothing from this package at registration:
this module imports no megatron code; strategy.py / model.py do, inside setup().
"""
from bench.strategies.base import register
from bench.strategies.torch_tp import ModelParallel


@register("megatron")
class Megatron(ModelParallel):
    """megatron-core: DDP by default (tp = pp = 1), any tp x pp x dp layout."""
