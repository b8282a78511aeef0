"""bench's Hydra plugins. Hydra instantiates sweepers and launchers only from the
``hydra_plugins`` namespace package, so the classes named in conf/hydra/ are declared in
this package's modules; the code is in bench/sweep/ and bench/launch/slurm/. The sweeper and
the launchers live in separate modules so that a machine without submitit still sweeps; callbacks.py
holds the exit of a one-run submission (bench/__main__.py).
"""
