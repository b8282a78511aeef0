"""Which hardware a run is planned for, and whether it is on it: the ``hardware=`` rule of validation.

A plan is made either for the device where the run will be (``hardware=auto``: the visible GPU, else the
CPU; a preset or probe profile: checked against the device the run is on - a run is labelled with its real
hardware), or for hardware that is elsewhere: ``dry_run=true`` (nothing runs) and ``submit=slurm`` on the
machine that submits (a login node: the cluster's GPUs are the job's, not this machine's).  Inside the
submitted job (submitit sets ``SUBMITIT_EXECUTOR`` in every task) the same config is checked again where it
landed, so a job on another GPU than the preset's is recorded ``invalid`` naming both.  The process'
environment decides which side this is because every caller (the sweeper, the run, the planner's
re-validations) passes the config, not who it is.
"""
from __future__ import annotations

import functools
import os
import socket
from typing import Optional

from bench.machine.hardware import HardwareConfig, PRESETS, cpu_name, match, resolve
from bench.spec.schema import BenchConfig, ConfigError


# what an NVIDIA driver puts on a Linux machine (its kernel module's files; WSL's GPU device): where one is there,
# torch says how many CUDA devices this process sees
_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg")


@functools.cache  # a driver neither comes nor goes while a command runs; validation asks once per planned layout
def no_nvidia_driver() -> bool:
    """No NVIDIA driver here (none of its files, and NVML's library absent or its driver not loaded: a laptop, a CPU
    node, CI), so no CUDA device either.  False where it cannot tell (no nvidia-ml-py) or a driver is there."""
    if any(os.path.exists(f) for f in _DRIVER_FILES):
        return False
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded):
        return True
    except pynvml.NVMLError:
        return False
    return False


def cuda_device_count() -> int:
    """CUDA devices this process sees; without an NVIDIA driver none, said without importing torch (most of a
    command's start on a CPU machine: a dry run, a refused override, a submission, the planner)."""
    if no_nvidia_driver():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_gpu_name() -> Optional[str]:
    if not cuda_device_count():
        return None
    import torch

    return torch.cuda.get_device_name(0)


def in_submitted_job() -> bool:
    """This process is a task of a submitit job (SLURM or local tasks), on the node the run is on."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def submitting(submit: Optional[str]) -> bool:
    """``submit=slurm`` on the machine that submits: the run's devices are the job's, elsewhere."""
    return bool(submit) and not in_submitted_job()


def planned_elsewhere(dry_run: Optional[bool], submit: Optional[str]) -> bool:
    """The plan is for hardware this process does not run on: a dry run, or a job being submitted."""
    return bool(dry_run) or submitting(submit)


def is_cpu_profile(preset: HardwareConfig) -> bool:
    """A probe profile of CPU ranks (gloo through host memory: bench.probe on a machine without a GPU)."""
    return preset.intra_node_link == "host"


def planned_gpus(c: dict, gpus: int) -> int:
    """The GPUs the layout may use under ``hardware=`` (module docstring); ConfigError where the plan would be
    for the wrong device: a preset this run is not on, or a submitted GPU job planned for this machine's CPU."""
    _check_link_regime(c)
    preset = resolve(c)  # complete: bench.machine.hardware.check has passed
    if preset is None:
        if submitting(c.get("submit")) and c["device"] != "cpu" and not cuda_device_count():
            raise ConfigError("hardware", "auto", "means this machine's device, and this machine has no GPU: name the "
                              "cluster's GPU, hardware=<preset> or a probe profile (python -m bench.probe, in a "
                              f"--config-dir); valid presets: {', '.join(PRESETS)} (or device=cpu for CPU nodes)")
        return gpus
    cpu = is_cpu_profile(preset)
    if planned_elsewhere(c.get("dry_run"), c.get("submit")):
        if c["device"] == "cpu" and not cpu:
            raise ConfigError("device", "cpu", f"contradicts hardware={preset.name} (a GPU); use device=auto or cuda")
        if submitting(c.get("submit")) and cpu and c["device"] != "cpu":
            raise ConfigError("device", c["device"], f"hardware={preset.name} profiles CPU ranks ({preset.gpu}): "
                              "submit it with device=cpu (the job would ask SLURM for GPUs)")
        return gpus if c["device"] == "cpu" else max(gpus, c["world_size"])
    _check_landed(c, preset, cpu)
    return 0 if cpu else gpus


def _check_link_regime(c: dict) -> None:
    """A link regime is NCCL's environment, put into each rank by the local launcher (bench/machine/link_regime.py); the
    ranks of a SLURM job start on its nodes, where nothing would set it."""
    regime = c.get("link_regime", "default")
    if regime != "default" and (c.get("submit") or in_submitted_job()):
        raise ConfigError("link_regime", regime, "is set by the local launcher only; for a SLURM job, export its NCCL "
                          "variables (bench/machine/link_regime.py REGIMES) in the job's environment and leave link_regime "
                          "at default")


def _check_landed(c: dict, preset: HardwareConfig, cpu: bool) -> None:
    """A run (here, or a submitted job on its node) must be on the preset's device."""
    where = "this job's node" if in_submitted_job() else "this machine"
    if cpu:
        if c["device"] == "cuda":
            raise ConfigError("device", "cuda", f"contradicts hardware={preset.name} (a profile of CPU ranks); "
                              "use device=cpu")
        name = cpu_name()
    else:
        name = visible_gpu_name()
    if name is None:
        raise ConfigError("hardware", preset.name, f"describes {preset.gpu}, and {where} ({socket.gethostname()}) "
                          "has no GPU: add dry_run=true to plan for it here, submit it (hydra/launcher=slurm), or "
                          "use hardware=auto to run on what is here")
    same = name.lower() == (preset.gpu or name).lower() or (not cpu and match(name) is match(preset.gpu)
                                                           and match(name) is not None)
    if not same:
        raise ConfigError("hardware", preset.name, f"is {preset.gpu}, but this run is on {name} ({where}, "
                          f"{socket.gethostname()}): a run is labelled with its real hardware; use hardware=auto "
                          "(or dry_run=true to plan), or ask the cluster for that device (hydra.launcher.partition / "
                          "constraint)")


def planned_device_name(c: dict, gpus: int) -> Optional[str]:
    """The GPU a run is on, as nvidia-smi names it (planned elsewhere, or with none visible: the preset's); None
    on CPU: tuning=best looks up measured bests by it (bench/plan/bests.py)."""
    if c.get("device") == "cpu":
        return None
    preset = resolve(c)
    if preset is not None and preset.gpu and (planned_elsewhere(c.get("dry_run"), c.get("submit")) or not gpus):
        return preset.gpu
    return visible_gpu_name()


def compute_capability(run: BenchConfig) -> tuple[Optional[float], str]:
    """The planned GPU's compute capability: the hardware preset's when planned elsewhere, else the visible GPU's
    (else the preset's); (None, "") where neither is known (planned on a machine without one): not checked then."""
    preset = resolve(run)
    elsewhere = planned_elsewhere(run.dry_run, run.submit)
    if preset is not None and preset.compute_capability and (elsewhere or not cuda_device_count()):
        return float(preset.compute_capability), f"hardware={preset.name}"
    if cuda_device_count():
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        return major + minor / 10, torch.cuda.get_device_name(0)
    return None, ""


# torch's CPU dispatch levels below AVX-512 on x86: no bf16 / fp16 instructions, and none that oneDNN emulates
# them with, so half-precision matmuls fall back to scalar code
_NO_HALF_MATMULS = ("NO AVX", "AVX2", "DEFAULT")


def slow_cpu_precision(device: str, precision: str) -> Optional[str]:
    """A note for a CPU run in bf16 / fp16 on an x86 CPU without half-precision instructions (torch's dispatch
    level below AVX-512): its matmuls run about 100 times slower than fp32's (measured on an AVX2 CPU, torch
    2.13, 2026-12-05, benchmarks/cpu_matmul_dtypes.py: a 256 x 256 x 1024 matmul at 0.74 GFLOP/s in bf16 and 0.78
    in fp16 against 60-66 in fp32, one thread; docs/development.md).  None elsewhere: on other CPUs it is not known to crawl."""
    import platform

    if device != "cpu" or precision not in ("bf16", "fp16") or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    import torch

    level = torch.backends.cpu.get_cpu_capability()
    if level not in _NO_HALF_MATMULS:
        return None
    return (f"precision={precision} on this CPU (torch's dispatch level {level}: no AVX-512, no {precision} "
            f"instructions) runs its matmuls about 100 times slower than fp32 (measured on such a CPU: 0.74 against "
            f"60-66 GFLOP/s); precision=fp32 (the CPU default) measures the strategy, not the emulation")
