"""Named link regimes: how NCCL may move data between the GPUs of a node, set by NCCL's environment, and a
record of what NCCL then actually used.

A regime makes a slow link reproducible on a fast host (``link_regime=p2p_off`` in a run, ``python -m bench.probe
--regime p2p_off``): its variables are put into each rank's environment before the process group starts (the
launcher: bench/launch/local.py; the probe: bench/probe/ranks.py).  Every rank also writes NCCL's INFO log to a
file (``NCCL_DEBUG_FILE``, unless the user set NCCL_DEBUG or the file); rank 0 reads the files at the end and
records (``provenance.nccl`` of metrics.json, ``probe.nccl`` of a profile) the NCCL variables the run ran under
and the transports NCCL logged for its connections ("via P2P/...", "via SHM/...", "via NET/Socket/..."), so the
record says which link was used, not which one the regime asked for.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Optional

from bench.spec.schema import LINK_REGIMES, ConfigError

# name -> (NCCL variables, what it stands for); the names are bench/spec/schema.py's link_regime choices
REGIMES: dict[str, tuple[dict[str, str], str]] = {
    "default": ({}, "NCCL's own choice (on an NVLink node: peer-to-peer over NVLink)"),
    "p2p_off": ({"NCCL_P2P_DISABLE": "1"}, "no peer-to-peer: GPU to GPU through host shared memory (SHM), a "
                "stand-in for a PCIe node whose GPUs cannot reach each other directly"),
    "sockets": ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"},
                "no peer-to-peer, no shared memory, no InfiniBand: through the network stack (NET/Socket), a "
                "stand-in for nodes on plain Ethernet"),
    "few_channels": ({"NCCL_MAX_NCHANNELS": "2"}, "NCCL's own link, at most 2 channels (a fraction of its "
                     "bandwidth: fewer SMs and rings move data)"),
}
assert tuple(REGIMES) == LINK_REGIMES, "bench/spec/schema.py LINK_REGIMES and REGIMES must name the same regimes"

REGIME_VAR = "BENCH_LINK_REGIME"  # the regime a process runs under, for its record
# the NCCL log lines that name a connection's transport, e.g. "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
# "Channel 01 : 1[1] -> 0[0] [send] via NET/Socket/0"
_VIA = re.compile(r"\bvia (P2P|SHM|NET|COLLNET)(?:/([A-Za-z0-9_ -]+?))?(?:/|\s|$)")
TRANSPORTS = {"P2P": "p2p", "SHM": "shm", "NET": "net", "COLLNET": "collnet"}


def check(name) -> None:
    if name not in REGIMES:
        raise ConfigError("link_regime", name, f"valid: {', '.join(REGIMES)}")


def regime_env(name: str) -> dict[str, str]:
    """The variables of regime ``name`` (ConfigError naming the valid ones for another name)."""
    check(name)
    return {**REGIMES[name][0], REGIME_VAR: name}


def debug_env(folder: str, rank) -> dict[str, str]:
    """NCCL's INFO log into ``folder``/nccl_rank<rank>.log, unless the user chose NCCL_DEBUG or its file."""
    if os.environ.get("NCCL_DEBUG") or os.environ.get("NCCL_DEBUG_FILE"):
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,ENV"),
            "NCCL_DEBUG_FILE": str(Path(folder) / f"nccl_rank{rank}.log")}


def apply(name: str, folder: str, rank, nccl: bool = True) -> dict[str, str]:
    """Put regime ``name`` and (``nccl``) the INFO log into this process' environment (before its process group
    starts); returns what was set.  A regime's variables win over inherited ones: the config is explicit."""
    env = {**regime_env(name), **(debug_env(folder, rank) if nccl else {})}
    os.environ.update(env)
    return env


def settings(environ: Optional[dict] = None) -> dict[str, str]:
    """The NCCL variables of an environment (this process': what its NCCL read), sorted by name."""
    e = os.environ if environ is None else environ
    return {k: e[k] for k in sorted(e) if k.startswith("NCCL_")}


def parse_transports(lines: Iterable[str]) -> dict[str, int]:
    """Connections per transport in NCCL INFO lines: ``p2p/CUMEM``, ``shm``, ``net/Socket``, ``net/IB`` ..."""
    counts: dict[str, int] = {}
    for line in lines:
        m = _VIA.search(line)
        if m and "Channel" in line:
            kind = TRANSPORTS[m.group(1)]
            sub = (m.group(2) or "").strip()
            key = f"{kind}/{sub}" if kind in ("p2p", "net") and sub else kind
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def link_of(transports: dict[str, int], nvlink_active: Optional[bool]) -> Optional[str]:
    """The hardware profile's ``intra_node_link`` for what NCCL used: the slowest transport it logged (a
    connection through host memory or the network bounds the collective): net -> socket (or ib), shm -> shm,
    p2p -> nvlink where the GPU has an active NVLink, else pcie; None when nothing was logged."""
    kinds = {k.split("/")[0] for k in transports}
    if "net" in kinds or "collnet" in kinds:
        return "socket" if not any(k.startswith("net/IB") for k in transports) else "ib"
    if "shm" in kinds:
        return "shm"
    if "p2p" in kinds:
        return "nvlink" if nvlink_active else "pcie"
    return None


def record(log_files: Iterable[Path], backend: Optional[str], nvlink_active: Optional[bool] = None) -> dict:
    """What a run or a probe records: the regime, the NCCL variables, the transports its ranks' logs name and
    the link they add up to (``link``), or why none (``transports_note``)."""
    rec = {"regime": os.environ.get(REGIME_VAR, "default"), "settings": settings()}
    if backend is not None and backend != "nccl":
        return {**rec, "transports": None, "link": None, "transports_note": f"backend {backend}: no NCCL"}
    files = sorted(set(map(Path, log_files)))
    lines: list[str] = []
    for f in files:
        try:
            lines += f.read_text(errors="replace").splitlines()
        except OSError:
            continue
    transports = parse_transports(lines)
    rec.update(transports=transports or None, link=link_of(transports, nvlink_active),
               nccl_logs=len(files))
    if not transports:
        rec["transports_note"] = ("no NCCL log read (NCCL_DEBUG set by the user without INFO, or no file)" if not lines
                                  else "NCCL logged no connection (no collective between ranks, or one rank)")
    return rec


def nvlink_active() -> Optional[bool]:
    """Whether this process' current GPU has an active NVLink (NVML), None without a GPU or NVML."""
    try:
        import pynvml
        import torch

        if not torch.cuda.is_available():
            return None
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    return True
            except pynvml.NVMLError:
                break
        return False
    except Exception:  # noqa: BLE001  (no NVML: unknown, said as None)
        return None


def of_this_run() -> dict:
    """:func:`record` for this process (rank 0 of a run, at its end): its backend, its run's NCCL logs."""
    try:
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_initialized() else None
    except Exception:  # noqa: BLE001
        backend = None
    return record(log_files(), backend, nvlink_active() if backend == "nccl" else None)


def log_files() -> list[Path]:
    """This run's NCCL log files: those beside the file NCCL_DEBUG_FILE names (one a rank)."""
    f = os.environ.get("NCCL_DEBUG_FILE")
    if not f:
        return []
    p = Path(f)
    return sorted(p.parent.glob("nccl_rank*.log")) if p.name.startswith("nccl_rank") else [p]
