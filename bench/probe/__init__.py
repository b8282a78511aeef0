"""``python -m bench.probe``: measure this machine and write a hardware profile that ``hardware=`` accepts.

The presets of bench/machine/hardware.py are datasheet numbers; a profile holds what this machine does: the matmul
peak per precision, the device memory bandwidth, the collectives' bus bandwidth against message size inside
a node (and across nodes under SLURM or torchrun), and the host cost of a small op and of a module hook.
``measure`` is what one device measures alone, ``comm`` what the ranks measure together, ``ranks`` starts
and places them, ``profile`` turns the numbers into the YAML.  docs/probe.md says how to use it.
"""
