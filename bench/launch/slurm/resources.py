"""How big each job is, from its run's own config: nodes, tasks and GPUs follow its world_size, its
time limit covers run_timeout_s.  hydra-submitit-launcher sizes one executor per sweep, from the
launcher config alone, so a sweep over world_size could not get one task per GPU per job."""
from __future__ import annotations

import inspect
import math
from typing import Any, Optional

from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import DictConfig, OmegaConf

from bench.spec.schema import ConfigError

_GENERIC = set(OmegaConf.structured(BaseQueueConf).keys())  # submitit's shared parameter names

# SLURM sends the --signal warning "up to 60 seconds earlier than specified" (sbatch(1), --signal)
SLURM_SIGNAL_EARLY_S = 60


def split_ranks(world_size: int, gpus_per_node: Optional[int]) -> tuple[int, int]:
    """(nodes, tasks_per_node) for world_size ranks on nodes of gpus_per_node GPUs."""
    cap = gpus_per_node or world_size
    tpn = max(1, min(world_size, cap))
    while world_size % tpn:
        tpn -= 1
    return world_size // tpn, tpn


def _submitit_default(name: str, fallback: int) -> int:
    """submitit's own default of one of its SLURM parameters (what sbatch gets where the launcher says null)."""
    try:
        from submitit.slurm.slurm import _make_sbatch_string

        return int(inspect.signature(_make_sbatch_string).parameters[name].default)
    except Exception:
        return fallback


def check_warning_time(timeout_min: Optional[int], signal_delay_s: Optional[int]) -> None:
    """Refuse (ConfigError) a SLURM job whose time-limit warning could come at its start.  submitit asks
    for USR2 signal_delay_s before the limit, SLURM may send it up to a minute earlier, and until
    bench's handler is in place (submitit unpickling, imports) USR2's default action ends the tasks
    ("srun: error: ... User defined signal 2"): a run that never started, with no status of its own."""
    limit = _submitit_default("time", 5) if timeout_min is None else int(timeout_min)
    delay = _submitit_default("signal_delay_s", 90) if signal_delay_s is None else int(signal_delay_s)
    if limit * 60 > delay + SLURM_SIGNAL_EARLY_S:
        return
    fix = f"e.g. hydra.launcher.timeout_min={(delay + SLURM_SIGNAL_EARLY_S) // 60 + 1}"
    if limit * 60 - SLURM_SIGNAL_EARLY_S - 1 >= 0:
        fix += f" or hydra.launcher.signal_delay_s={limit * 60 - SLURM_SIGNAL_EARLY_S - 1}"
    raise ConfigError("hydra.launcher.timeout_min", limit,
                      f"with hydra.launcher.signal_delay_s={delay}, SLURM's time-limit warning (USR2, sent "
                      f"signal_delay_s before the limit and up to {SLURM_SIGNAL_EARLY_S} s earlier) could reach "
                      f"the job at its start and end its tasks before bench can handle it; valid: "
                      f"timeout_min*60 > signal_delay_s + {SLURM_SIGNAL_EARLY_S} ({fix})")


class JobResources:
    """Mixin over hydra-submitit-launcher's launchers: the executor parameters of one job."""

    _EXECUTOR: str  # submitit's cluster name: "slurm" or "local"
    _OWN = {"submitit_folder", "max_num_timeout", "gpus_per_node", "tasks_per_node", "nodes", "wait"}
    params: dict

    def _uses_gpu(self, cfg: DictConfig) -> bool:
        return str(cfg.device) != "cpu"

    def job_resources(self, cfg: DictConfig) -> dict:
        """nodes, tasks_per_node, GPUs (or gres) and timeout_min of the job that runs ``cfg``."""
        ws = int(cfg.world_size)
        nodes, tpn = split_ranks(ws, self._node_gpus())
        res: dict[str, Any] = {"nodes": nodes, "tasks_per_node": tpn}
        gpus = tpn if self._uses_gpu(cfg) else None
        gres = self.params.get("gres")
        if gres and "{gpus}" in str(gres):  # e.g. gres: "gpu:{gpus}" on clusters that want --gres
            res["gres"] = str(gres).format(gpus=gpus or 0)
        elif not gres:
            res["gpus_per_node"] = gpus
        timeout = self.params.get("timeout_min")
        if cfg.get("run_timeout_s"):  # bench's own timeout fires first and records status "timeout"
            need = math.ceil(cfg.run_timeout_s / 60) + 5
            timeout = max(timeout or 0, need)
        if timeout:
            res["timeout_min"] = int(timeout)
        return res

    def _node_gpus(self) -> Optional[int]:
        return self.params.get("gpus_per_node")

    def check_resources(self, res: dict) -> None:
        """Raise ConfigError for a job that cannot run as sized, before it is submitted (local tasks:
        nothing to check)."""

    def precheck_gpus(self, cfg: dict) -> int:
        """GPUs the sweeper's pre-check assumes a job gets (its allocation)."""
        return int(cfg["world_size"]) if cfg.get("device") != "cpu" else 0

    def _base_params(self) -> dict:
        """The launcher config's parameters shared by every job, as submitit's executor names them."""
        out = {}
        for k, v in self.params.items():
            if k in self._OWN or v is None:
                continue
            out[k if k in _GENERIC else f"{self._EXECUTOR}_{k}"] = v
        return out

    def _prefixed(self, res: dict) -> dict:
        return {k if k in _GENERIC else f"{self._EXECUTOR}_{k}": v for k, v in res.items()}
