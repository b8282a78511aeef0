"""NVML sampling of GPU utilization, memory and energy (nvidia-ml-py).

A background thread samples at a fixed interval, so nothing is read inside the timed step.
Everything degrades to None where NVML or a counter is unavailable (CPU runs, MIG, ...).  The sampler also
brackets the window with the host's CPU use (bench/metrics/host.py), on CPU runs too."""
from __future__ import annotations

import threading
from typing import Optional

from bench.metrics.host import HostCpu


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def device_handle(torch_device_index: int):
    """NVML handle of the torch device (by UUID, so CUDA_VISIBLE_DEVICES remapping is respected)."""
    nv = _nvml()
    if nv is None:
        return None, None
    import torch

    try:
        uuid = str(torch.cuda.get_device_properties(torch_device_index).uuid)
        return nv, nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        try:
            return nv, nv.nvmlDeviceGetHandleByIndex(torch_device_index)
        except Exception:
            return None, None


class NvmlSampler:
    def __init__(self, torch_device_index: Optional[int], interval_ms: int):
        self.nv, self.h = device_handle(torch_device_index) if torch_device_index is not None else (None, None)
        self.interval = interval_ms / 1000.0
        self.util: list[float] = []
        self.mem_used: list[float] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.energy_j: Optional[float] = None
        self._energy0: Optional[int] = None
        self.host = HostCpu()

    def _energy_mj(self) -> Optional[int]:
        try:
            return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.util.append(float(self.nv.nvmlDeviceGetUtilizationRates(self.h).gpu))
                self.mem_used.append(self.nv.nvmlDeviceGetMemoryInfo(self.h).used / 2**20)
            except Exception:
                pass
            self._stop.wait(self.interval)

    def start(self) -> None:
        self.host.start()
        if self.h is None:
            return
        self._energy0 = self._energy_mj()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.host.stop()
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        e1 = self._energy_mj()
        if self._energy0 is not None and e1 is not None:
            self.energy_j = (e1 - self._energy0) / 1000.0

    def summary(self) -> dict:
        avg = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        return {
            "gpu_util_mean_pct": avg(self.util),
            "gpu_util_samples": len(self.util),
            "nvml_mem_used_peak_mb": max(self.mem_used) if self.mem_used else None,
            "nvml_mem_used_mean_mb": avg(self.mem_used),
            "energy_j": self.energy_j,
            **self.host.summary(),  # host_cpus, host_busy_cpus, process_cpus
        }
