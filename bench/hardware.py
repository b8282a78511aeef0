"""The hardware a run is planned for: ``hardware=auto`` (the device that is there) or a named preset.

A preset is what the memory plan, the fit verdict, the throughput prediction and MFU need to know
about a GPU and its node, so that ``dry_run=true hardware=h100_sxm_80gb`` plans a machine the user
does not have, from any machine, CPU included.  Numbers are vendor datasheet figures (dense, no
sparsity); ``memory_gib`` is what ``torch.cuda.get_device_properties().total_memory`` reports (the
usable memory, a little under the marketed size).  Link and host figures describe the usual server
of that GPU (an 8-GPU HGX board for the SXM parts, a PCIe server or workstation for the others):
set ``hardware.<key>=...`` for yours.  Presets are registered in Hydra's ConfigStore (group
``hardware``) by bench/config.py; ``match`` finds the preset of a device by its name (MFU's peak).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Dict, Optional

from bench.schema import knob


@dataclass
class HardwareConfig:
    """One GPU and its node (module docstring).  ``auto``: every field from the visible device."""

    name: str = knob("auto", "auto (the visible device) | a preset: "
                     "h100_sxm_80gb, h200_141gb, a100_80gb, a100_40gb, l40s, rtx_a6000")
    gpu: Optional[str] = knob(None, "the device name as nvidia-smi prints it (a run on another GPU is refused)")
    memory_gib: Optional[float] = knob(None, "usable device memory per GPU (GiB)")
    compute_capability: Optional[float] = knob(None, "CUDA compute capability (float8 tensor cores: >= 8.9)")
    peak_tflops: Dict[str, Any] = knob(None, "dense peak TFLOP/s per precision: fp32, tf32, bf16, fp16, fp8", factory=dict)
    hbm_gbps: Optional[float] = knob(None, "device memory bandwidth (GB/s)")
    intra_node_gbps: Optional[float] = knob(None, "GPU-to-GPU bandwidth inside a node, one direction (GB/s)")
    intra_node_link: Optional[str] = knob(None, "nvlink | pcie")
    inter_node_gbps: Optional[float] = knob(None, "network bandwidth per GPU between nodes, one direction (GB/s)")
    gpus_per_node: Optional[int] = knob(None, "GPUs in one node")
    host_memory_gib: Optional[float] = knob(None, "host memory of one node (GiB): offloaded states are checked "
                                            "against it")


def _gpu(name: str, gpu: str, memory_gib: float, cc: float, peaks: tuple, hbm: float, link: str, intra: float,
         inter: float, per_node: int, host: float) -> HardwareConfig:
    fp32, tf32, bf16, fp8 = peaks
    return HardwareConfig(name=name, gpu=gpu, memory_gib=memory_gib, compute_capability=cc,
                          peak_tflops={"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8},
                          hbm_gbps=hbm, intra_node_gbps=intra, intra_node_link=link, inter_node_gbps=inter,
                          gpus_per_node=per_node, host_memory_gib=host)


# (fp32, tf32, bf16 = fp16, fp8) dense TFLOP/s; fp8 None: no float8 tensor cores
PRESETS: dict[str, HardwareConfig] = {p.name: p for p in (
    _gpu("h100_sxm_80gb", "NVIDIA H100 80GB HBM3", 79.2, 9.0, (66.9, 494.7, 989.4, 1978.9), 3350, "nvlink", 450,
         50, 8, 2048),
    _gpu("h200_141gb", "NVIDIA H200", 139.8, 9.0, (66.9, 494.7, 989.4, 1978.9), 4800, "nvlink", 450, 50, 8, 2048),
    _gpu("a100_80gb", "NVIDIA A100-SXM4-80GB", 79.2, 8.0, (19.5, 156.0, 312.0, None), 2039, "nvlink", 300, 25, 8,
         2048),
    _gpu("a100_40gb", "NVIDIA A100-SXM4-40GB", 39.4, 8.0, (19.5, 156.0, 312.0, None), 1555, "nvlink", 300, 25, 8,
         1024),
    _gpu("l40s", "NVIDIA L40S", 44.4, 8.9, (91.6, 183.0, 362.1, 733.0), 864, "pcie", 25, 12.5, 8, 1024),
    _gpu("rtx_a6000", "NVIDIA RTX A6000", 47.4, 8.6, (38.7, 77.4, 154.8, None), 768, "pcie", 25, 12.5, 4, 256),
)}

# further device names MFU knows (no preset: plan with memory_gib=); first match wins, specific names first
_EXTRA_PEAKS: list[tuple[str, dict]] = [
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"bf16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("GH200", PRESETS["h200_141gb"].peak_tflops),
    ("H20", {"bf16": 148.0, "tf32": 74.0, "fp32": 44.0}),
    ("B200", {"bf16": 2250.0, "tf32": 1100.0, "fp32": 80.0}),
    ("A800", PRESETS["a100_80gb"].peak_tflops),
    ("L4", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("RTX 6000 Ada", {"bf16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    ("RTX 4090", {"bf16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    ("RTX 3090", {"bf16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    ("V100", {"bf16": 125.0, "tf32": 15.7, "fp32": 15.7}),
]


def match(device_name: Optional[str]) -> Optional[HardwareConfig]:
    """The preset whose GPU this device is (by nvidia-smi's name), else None."""
    if not device_name:
        return None
    low = device_name.lower()
    for p in PRESETS.values():  # the exact name first ("NVIDIA H100 80GB HBM3")
        if p.gpu.lower() == low:
            return p
    if any(k in low for k in ("gh200", "h100 pcie", "h100 nvl")):  # contain a preset's family, are not it
        return None
    families = (("h100", "h100_sxm_80gb"), ("h200", "h200_141gb"), ("a100", "a100_40gb" if "40gb" in low else
                "a100_80gb"), ("l40s", "l40s"), ("rtx a6000", "rtx_a6000"))
    return next((PRESETS[preset] for key, preset in families if key in low), None)


def peak_table(device_name: Optional[str]) -> tuple[Optional[dict], str]:
    """(peak TFLOP/s per precision, which entry) for a device name: its preset's, else the extra table's."""
    preset = match(device_name)
    if preset is not None:
        return preset.peak_tflops, f"preset {preset.name}"
    for key, peaks in _EXTRA_PEAKS:
        if device_name and key.lower() in device_name.lower():
            return peaks, f"datasheet {key}"
    return None, f"device {device_name!r} not in the peak table (set metrics.peak_tflops)"


def resolve(cfg: dict) -> Optional[HardwareConfig]:
    """The named preset of a config with the user's overrides applied (``hardware.memory_gib=70``), or None
    for ``hardware=auto``."""
    h = cfg.get("hardware") or {}
    if h.get("name", "auto") == "auto":
        return None
    base = PRESETS.get(h["name"], HardwareConfig(name=h["name"]))
    given = {f.name: h[f.name] for f in fields(HardwareConfig) if h.get(f.name) not in (None, {})}
    return replace(base, **given)


def preset_nodes() -> dict[str, HardwareConfig]:
    """What bench/config.py registers in Hydra's ConfigStore group ``hardware``."""
    return {"auto": HardwareConfig(), **PRESETS}

