"""``python -m bench.probe [--out FILE] [--world-size N] [--quick] [--device auto|cpu|cuda]`` (bench/probe)."""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path
from typing import Optional

DEFAULT_DIR = Path("outputs") / "probe" / "hardware"


def _args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.probe", description="Measure this machine (matmul peak per "
                                "precision, memory bandwidth, collective bus bandwidth, host cost per op) and "
                                "write a hardware profile that hardware=<its file name> accepts (docs/probe.md).")
    p.add_argument("--out", help="the profile's path; its file name is the profile's name.  Put it in a folder named "
                   "hardware/ and pass that folder's parent as python -m bench --config-dir (default: "
                   f"{DEFAULT_DIR}/probe_<host>.yaml)")
    p.add_argument("--world-size", type=int, help="local ranks to start (default: the visible GPUs, 2 on CPU); "
                   "under torchrun or srun the launcher's ranks are used")
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller messages (CI, a first look)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--regime", help="a link regime: NCCL's environment of bench/machine/link_regime.py (default, p2p_off, "
                   "sockets, few_channels) set in every rank; the profile records it and the transport NCCL used "
                   "(default: $BENCH_LINK_REGIME, else default)")
    return p.parse_args(argv)


def _fail(key: str, value, valid: str) -> int:
    print(f"invalid probe option: {key}={value!r}: {valid}", file=sys.stderr)
    return 2


def main(argv: Optional[list[str]] = None) -> int:
    a = _args(argv)
    from bench.machine.hardware import preset_nodes

    from bench.machine.link_regime import REGIME_VAR, REGIMES

    regime = a.regime or os.environ.get(REGIME_VAR) or "default"
    if regime not in REGIMES:
        return _fail("--regime", regime, f"valid: {', '.join(REGIMES)}")
    tail = "" if regime == "default" else f"_{regime}"
    out = Path(a.out) if a.out else DEFAULT_DIR / f"probe_{re.sub(r'[^A-Za-z0-9_]', '_', socket.gethostname())}{tail}.yaml"
    if out.suffix != ".yaml" or out.stem in preset_nodes():
        return _fail("--out", str(out), f"must be a .yaml file not named after a preset ({', '.join(preset_nodes())})"
                     ": its file name is what hardware= selects")
    import torch  # after the checks: a bad option is refused without torch's seconds of import

    from bench.probe.ranks import launched_world, run_rank

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = a.device if a.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        return _fail("--device", "cuda", "no CUDA device is visible; use --device cpu or auto")
    world = launched_world()
    opts = {"out": str(out), "name": out.stem, "quick": a.quick, "device": device, "regime": regime,
            "nccl_dir": _nccl_dir(world is not None)}
    if world is not None:  # a launcher started every rank: this process is one of them
        if a.world_size not in (None, world):
            return _fail("--world-size", a.world_size, f"the launcher started {world} ranks; leave it out")
        run_rank(int(os.environ.get("LOCAL_RANK", 0)), {**opts, "world_size": world, "launcher": _launcher()})
        return 0
    world = a.world_size if a.world_size is not None else (gpus if device == "cuda" else 2)
    if world < 1 or (device == "cuda" and world > gpus):
        return _fail("--world-size", world, f"must be 1..{gpus} (the visible GPUs)" if device == "cuda" else
                     "must be a positive number of ranks")
    return _start(world, {**opts, "world_size": world})


def _nccl_dir(launched: bool) -> str:
    """Where the ranks write NCCL's log (bench/machine/link_regime.py): one folder for the ranks of a node."""
    import tempfile

    if not launched:
        return tempfile.mkdtemp(prefix="bench_probe_nccl_")
    job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or os.environ.get("MASTER_PORT", "")
    d = Path(tempfile.gettempdir()) / f"bench_probe_nccl_{re.sub(r'[^A-Za-z0-9_]', '_', job)}"
    d.mkdir(exist_ok=True)
    return str(d)


def _launcher() -> str:
    return "srun (SLURM)" if "SLURM_PROCID" in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ else "torchrun"


def _start(world: int, opts: dict) -> int:
    """Start ``world`` local ranks on a free port: spawned on GPUs (a fresh interpreter each: CUDA cannot be
    forked), forked on CPU (seconds sooner: the ranks inherit the imported torch)."""
    import torch.multiprocessing as mp

    from bench.probe.ranks import run_rank

    with socket.socket() as s:  # a free port for the rendezvous (the ranks bind it moments later)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world == 1:
        run_rank(0, opts)
        return 0
    try:
        mp.start_processes(run_rank, args=(opts,), nprocs=world,
                           start_method="spawn" if opts["device"] == "cuda" else "fork")
    except mp.ProcessRaisedException as e:  # the rank's traceback: the first failure, not the peers' echoes
        print(f"probe: a rank failed:\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
