"""torch-native parallelisms as small steps over one model and one DeviceMesh.

The torch-native strategies (single, ddp, fsdp, and tp / pp with ``strategy.impl=torch``) build
bench's model once and apply, in torchtitan's order, only the steps their layout needs:

    mesh.build_mesh   one DeviceMesh (pp, dp, tp) in Megatron's rank order (bench/spec/layout.py)
    float8.apply_float8  precision=fp8: torchao Float8Linear for the blocks' Linear layers (before TP)
    tp.apply_tp       DTensor Colwise / Rowwise plan on every block
    pp.split_stages   this rank's pipeline stages (chunks of the same model class)
    ac.apply_ac       activation recomputation per block
    compile.apply_compile  torch.compile per block
    dp.apply_fsdp / dp.apply_ddp   the data-parallel reduction: FSDP2, or torch DDP
    pp.build_schedule torch.distributed.pipelining over the wrapped stages

Each step returns what it did, for ``metrics.json``'s layout.  bench/strategies/torch_native.py
composes them and runs the step; it is the only training step of the torch-native strategies.
"""
