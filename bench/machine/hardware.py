"""The hardware a run is planned for: ``hardware=auto`` (the device that is there) or a named preset.

A preset is what the memory plan, the fit verdict, the throughput prediction and MFU need to know
about a GPU and its node, so that ``dry_run=true hardware=h100_sxm_80gb`` plans a machine the user
does not have, from any machine, CPU included.  Numbers are vendor datasheet figures (dense, no
sparsity); ``memory_gib`` is what ``torch.cuda.get_device_properties().total_memory`` reports (the
usable memory, a little under the marketed size).  Link and host figures describe the usual server
of that GPU (an 8-GPU HGX board for the SXM parts, a PCIe server or workstation for the others):
set ``hardware.<key>=...`` for yours.  Presets are registered in Hydra's ConfigStore (group
``hardware``) by bench/run/config.py; ``match`` finds the preset of a device by its name (MFU's peak).

A profile measured on the user's machine (``python -m bench.probe``, docs/probe.md) is a YAML in a
``hardware/`` folder of a ``--config-dir``: Hydra composes it like a preset.  ``check`` is the one rule
every named hardware (preset, profile, overrides) passes before a plan is made.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, Optional

from bench.spec.schema import ConfigError, Section, knob


@dataclass
class HardwareConfig(Section):
    """One GPU and its node (module docstring).  ``auto``: every field from the visible device."""

    name: str = knob("auto", "auto (the visible device) | a preset: h100_sxm_80gb, h200_141gb, a100_80gb, "
                     "a100_40gb, l40s, rtx_a6000 | a profile: a YAML in a hardware/ folder of --config-dir "
                     "(python -m bench.probe writes one; docs/probe.md)")
    source: Optional[str] = knob(None, "where the numbers come from: datasheet (the presets) | probe (measured by "
                                 "python -m bench.probe) | user")
    gpu: Optional[str] = knob(None, "the device name as nvidia-smi prints it (a run on another GPU is refused)")
    memory_gib: Optional[float] = knob(None, "usable device memory per GPU (GiB)")
    compute_capability: Optional[float] = knob(None, "CUDA compute capability (float8 tensor cores: >= 8.9)")
    peak_tflops: Dict[str, Any] = knob(None, "dense peak TFLOP/s per precision: fp32, tf32, bf16, fp16, fp8", factory=dict)
    hbm_gbps: Optional[float] = knob(None, "device memory bandwidth (GB/s)")
    intra_node_gbps: Optional[float] = knob(None, "GPU-to-GPU bandwidth inside a node, one direction (GB/s)")
    intra_node_link: Optional[str] = knob(None, "nvlink | pcie | host (CPU ranks: gloo through host memory) | shm / "
                                          "socket / ib (NCCL kept off peer-to-peer: bench/machine/link_regime.py)")
    inter_node_gbps: Optional[float] = knob(None, "network bandwidth per GPU between nodes, one direction (GB/s)")
    gpus_per_node: Optional[int] = knob(None, "GPUs in one node")
    nics_per_node: Optional[int] = knob(None, "network adapters of one node; with nic_gbps it replaces "
                                        "inter_node_gbps by nics_per_node x nic_gbps / gpus_per_node (bench/plan/topology.py)")
    nic_gbps: Optional[float] = knob(None, "bandwidth of one network adapter, one direction (GB/s; 400 Gb/s = 50)")
    host_memory_gib: Optional[float] = knob(None, "host memory of one node (GiB): offloaded states are checked "
                                            "against it")
    host_link_gbps: Optional[float] = knob(None, "the GPU's link to host memory, one direction, on the wire (GB/s; "
                                           "PCIe 5.0 x16: 63, 4.0 x16: 31.5): offload_activations' copies; null: "
                                           "PCIe 4.0's")
    attention: Dict[str, Any] = knob(None, "causal attention's kernels (a probe measures them): forward_share, "
                                     "backward_share (their rates on the FLOPs they run, over the matmul peak of the "
                                     "precision they ran in: bf16 on a GPU, fp32 on a CPU; at long sequences) and "
                                     "forward_seq_half, backward_seq_half (the sequence length at which each runs at "
                                     "half of that); the prediction applies them to the run's precision's peak "
                                     "(bf16's under fp8); empty: one H200's (DEFAULT_ATTENTION)", factory=dict)
    probe: Dict[str, Any] = knob(None, "a probe's record: date, device, what was measured and how, the raw curves "
                                 "(collective bus bandwidth per message size), host cost per kernel launch / hook",
                                 factory=dict)


def _gpu(name: str, gpu: str, memory_gib: float, cc: float, peaks: tuple, hbm: float, link: str, intra: float,
         inter: float, per_node: int, host: float, host_link: float) -> HardwareConfig:
    fp32, tf32, bf16, fp8 = peaks
    return HardwareConfig(name=name, gpu=gpu, memory_gib=memory_gib, compute_capability=cc,
                          peak_tflops={"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16, "fp8": fp8},
                          hbm_gbps=hbm, intra_node_gbps=intra, intra_node_link=link, inter_node_gbps=inter,
                          gpus_per_node=per_node, host_memory_gib=host, host_link_gbps=host_link, source="datasheet")


# GPU to GPU over PCIe 4.0 x16 without NVLink: 31.5 GB/s a direction on the wire (16 GT/s x 16 lanes x 128/130); NCCL
# all-reduce bus bandwidth reached up to 21 GB/s among 8 PCIe 4.0 A100s with P2P on (github.com/NVIDIA/nccl/issues/841)
PCIE_P2P_GBPS = 20.0
# the GPU's own link to the host, one direction on the wire: PCIe 5.0 x16 (32 GT/s x 16 lanes x 128/130) and 4.0 x16
PCIE5_GBPS, PCIE4_GBPS = 63.0, 31.5
# (fp32, tf32, bf16 = fp16, fp8) dense TFLOP/s; fp8 None: no float8 tensor cores
PRESETS: dict[str, HardwareConfig] = {p.name: p for p in (
    _gpu("h100_sxm_80gb", "NVIDIA H100 80GB HBM3", 79.2, 9.0, (66.9, 494.7, 989.4, 1978.9), 3350, "nvlink", 450,
         50, 8, 2048, PCIE5_GBPS),
    _gpu("h200_141gb", "NVIDIA H200", 139.8, 9.0, (66.9, 494.7, 989.4, 1978.9), 4800, "nvlink", 450, 50, 8, 2048,
         PCIE5_GBPS),
    _gpu("a100_80gb", "NVIDIA A100-SXM4-80GB", 79.2, 8.0, (19.5, 156.0, 312.0, None), 2039, "nvlink", 300, 25, 8,
         2048, PCIE4_GBPS),
    _gpu("a100_40gb", "NVIDIA A100-SXM4-40GB", 39.4, 8.0, (19.5, 156.0, 312.0, None), 1555, "nvlink", 300, 25, 8,
         1024, PCIE4_GBPS),
    _gpu("l40s", "NVIDIA L40S", 44.4, 8.9, (91.6, 183.0, 362.1, 733.0), 864, "pcie", PCIE_P2P_GBPS, 12.5, 8, 1024,
         PCIE4_GBPS),
    _gpu("rtx_a6000", "NVIDIA RTX A6000", 47.4, 8.6, (38.7, 77.4, 154.8, None), 768, "pcie", PCIE_P2P_GBPS, 12.5, 4,
         256, PCIE4_GBPS),
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


def resolve(cfg: Any) -> Optional[HardwareConfig]:
    """The named preset of a config with the user's overrides applied (``hardware.memory_gib=70``), or None
    for ``hardware=auto``.  ``cfg``: the run description (BenchConfig: its typed ``hardware``), or a config's
    plain containers (before validation; a recorded run's)."""
    h = (cfg.get("hardware") or {}) if isinstance(cfg, dict) else cfg.hardware
    # the fields as they are, not asdict's deep copy: a probe profile's raw curves made that most of a planner
    # question's time (the memory plan and the prediction resolve it a few times per candidate layout); what this
    # returns shares the config's dicts, and nothing writes to them
    values = h if isinstance(h, dict) else {f.name: getattr(h, f.name) for f in fields(h)}
    name = values.get("name", "auto")
    if name == "auto":
        return None
    base = PRESETS.get(name, HardwareConfig(name=name))
    given = {f.name: values[f.name] for f in fields(HardwareConfig) if values.get(f.name) not in (None, {})}
    return replace(base, **given)


def recorded(hardware: Any, device_name: Optional[str]) -> Optional[HardwareConfig]:
    """The hardware a recorded run was planned for: the preset or probe profile its ``config.hardware`` names (every
    field as it was then: a profile's measured link and peaks), else (``hardware=auto``, or a record of fields this
    code no longer has) the preset of the GPU it ran on, ``device_name``; None for neither."""
    if isinstance(hardware, dict) and hardware.get("name") not in (None, "auto"):
        try:
            return resolve({"hardware": hardware})
        except (TypeError, ValueError):
            pass
    return match(device_name)


def preset_nodes() -> dict[str, HardwareConfig]:
    """What bench/run/config.py registers in Hydra's ConfigStore group ``hardware``."""
    return {"auto": HardwareConfig(), **PRESETS}



# --------------------------------------------------------------------------- validation
# what the memory plan and the prediction read: a named hardware must give each (inter_node_gbps may be null:
# not measured, one node; the intra-node link only where a node has more than one GPU)
REQUIRED = ("memory_gib", "peak_tflops", "hbm_gbps", "intra_node_gbps", "intra_node_link", "gpus_per_node",
            "host_memory_gib")
PEER_FIELDS = ("intra_node_gbps", "intra_node_link")
POSITIVE = ("memory_gib", "hbm_gbps", "intra_node_gbps", "inter_node_gbps", "gpus_per_node", "host_memory_gib",
            "compute_capability", "nics_per_node", "nic_gbps", "host_link_gbps")  # null allowed where not REQUIRED
WHOLE = ("gpus_per_node", "nics_per_node")
# the causal attention kernels' rates (on the FLOPs they run) as shares of a large matmul's at the same clocks, the
# forward's and the backward's, each at half its share at its seq_half tokens a sequence (short rows: fewer tiles to
# fill the GPU).  Measured, not fitted: benchmarks/attention_rate.py on an H200 (cuDNN's kernels, torch's choice there),
# 2k-32k tokens, where an 8192^3 matmul ran 784 TFLOP/s: forward 560-647 TFLOP/s, backward 299-415
# (results/2026-12-04-h200x1-long-sequence).  In a step both run below those short bursts (the traces' matmuls at 0.88
# of them, attention at 0.88-0.91): the prediction's e_max carries that.  A probe's profile gives its GPU's own
# (hardware.attention); a preset without them, these
DEFAULT_ATTENTION = {"forward_share": 0.79, "forward_seq_half": 190, "backward_share": 0.54, "backward_seq_half": 920}
ATTENTION_KEYS = tuple(DEFAULT_ATTENTION)
# shm / socket / ib: what NCCL used when it was kept off peer-to-peer (bench/machine/link_regime.py): host shared memory, the
# network stack, InfiniBand
LINKS = ("nvlink", "pcie", "host", "shm", "socket", "ib")
SOURCES = ("datasheet", "probe", "user")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
NEEDED_PEAKS = ("fp32", "bf16")  # the precisions a plan falls back to (predict: fp8 -> bf16, others -> fp32)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(h: dict) -> None:
    """Refuse a hardware section the plan cannot trust, naming the first bad field: with ``auto`` any field
    set (it would be ignored); otherwise a missing, zero, negative or mistyped field.  A wrong number here
    would not fail later: it would plan and predict with it."""
    name = h.get("name", "auto")
    if name == "auto":
        for k, v in h.items():
            if k != "name" and v not in (None, {}):
                raise ConfigError(f"hardware.{k}", v, "hardware=auto reads every field from the visible device, so "
                                  "this changes nothing; name a preset or profile (hardware=h100_sxm_80gb "
                                  f"hardware.{k}=...), or set memory_gib= (top level) for the memory plan")
        return
    for k in REQUIRED:
        if h.get(k) in (None, {}) and not (k in PEER_FIELDS and h.get("gpus_per_node") == 1):
            raise ConfigError(f"hardware.{k}", h.get(k), f"hardware={name} does not give it, and the memory plan "
                              f"and the prediction read it: a profile needs {', '.join(REQUIRED)} (python -m "
                              f"bench.probe measures them all; presets: {', '.join(PRESETS)})")
    for k in POSITIVE:
        v = h.get(k)
        if v is not None and (not _number(v) or v <= 0):
            raise ConfigError(f"hardware.{k}", v, "must be a positive number" + (
                "" if k != "inter_node_gbps" else ", or null where it was not measured (one node)"))
    for k, v in (h.get("attention") or {}).items():
        if k not in ATTENTION_KEYS or not _number(v) or v < 0 or (k.endswith("share") and v == 0):
            raise ConfigError(f"hardware.attention.{k}", v, f"valid keys: {', '.join(ATTENTION_KEYS)}: shares "
                              "> 0, seq_half tokens >= 0")
    for k in WHOLE:
        if h.get(k) is not None and not isinstance(h[k], int):
            raise ConfigError(f"hardware.{k}", h[k], "must be a positive integer")
    _check_peaks(h["peak_tflops"])
    for k, valid in (("intra_node_link", LINKS), ("source", SOURCES)):
        if h.get(k) is not None and h[k] not in valid:
            raise ConfigError(f"hardware.{k}", h[k], f"valid: {', '.join(valid)}")


def _check_peaks(peaks: Any) -> None:
    if not isinstance(peaks, dict):
        raise ConfigError("hardware.peak_tflops", peaks, f"must map precisions ({', '.join(PRECISIONS)}) to TFLOP/s")
    for k in NEEDED_PEAKS:
        if peaks.get(k) is None:
            raise ConfigError(f"hardware.peak_tflops.{k}", peaks.get(k), f"needed: the prediction falls back to "
                              f"{' / '.join(NEEDED_PEAKS)} for precisions without a peak of their own")
    for k, v in peaks.items():
        if k not in PRECISIONS:
            raise ConfigError(f"hardware.peak_tflops.{k}", v, f"not a precision; valid: {', '.join(PRECISIONS)}")
        if v is not None and (not _number(v) or v <= 0):
            raise ConfigError(f"hardware.peak_tflops.{k}", v, "must be a positive number of TFLOP/s, or null (no "
                              "such tensor cores)")


def cpu_name() -> str:
    """This machine's CPU as a profile names it (``gpu`` of a CPU profile written by bench.probe), and as a run on
    this machine is checked against it (bench/machine/hardware_rules.py)."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        name = ""
    return f"CPU: {name or platform.processor() or platform.machine()} ({os.cpu_count()} logical CPUs)"
