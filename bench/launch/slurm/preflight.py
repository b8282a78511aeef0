"""Why a sweep cannot be submitted to SLURM, in one line naming what is missing.

Before any run of a ``hydra/launcher=slurm`` sweep is recorded (bench/sweep/sweeper.py calls the launcher's
``preflight``): the SLURM client (sbatch to submit, srun in the batch script - submitit refuses to build one
without it -, squeue to follow the jobs, scancel to cancel them) must be on PATH and reach a cluster (``sinfo``
answers), and the partition must be one the cluster has, or the cluster must have a default one.  Such a sweep exits 2 with that line and
leaves no run record.

After that, what only sbatch can tell (an account the cluster requires, a QOS it does not know) comes from
its refusal: :func:`refusal` turns sbatch's error into one line naming the key, and says whether it applies
to every job of the sweep (then the rest are recorded with it, not submitted again: bench/launch/slurm/submit.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Optional

CLIENT = ("sbatch", "srun", "squeue", "scancel")
PREFIX = "cannot submit to SLURM: "  # nothing was submitted (check)
REFUSED = "could not be submitted to SLURM: "  # sbatch refused a job (refusal)


def missing_client() -> list[str]:
    """The SLURM client commands bench needs that are not on PATH."""
    return [b for b in CLIENT if shutil.which(b) is None]


def partitions(timeout_s: float = 15.0) -> tuple[Optional[list[str]], Optional[str], Optional[str]]:
    """(the cluster's partitions, its default one, None) as ``sinfo`` lists them; (None, None, sinfo's error) where
    it fails (no cluster configured, the controller unreachable: sbatch would fail too); (None, None, None) where
    sinfo is missing or does not answer in time (then sbatch's own refusal names the problem)."""
    if shutil.which("sinfo") is None:
        return None, None, None
    try:
        p = subprocess.run(["sinfo", "--all", "--noheader", "--format=%P"], capture_output=True, text=True,
                           timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None, None, None
    if p.returncode:
        return None, None, sbatch_error(p.stderr or p.stdout)
    names: list[str] = []
    default = None
    for word in p.stdout.split():
        name = word.rstrip("*")
        if word.endswith("*"):
            default = name
        if name and name not in names:
            names.append(name)
    return (names or None), default, None


def check(params: dict) -> Optional[str]:
    """One line saying why nothing can be submitted with the launcher parameters ``params`` (None: go on)."""
    missing = missing_client()
    if missing:
        return (f"{PREFIX}{', '.join(missing)} not on PATH (this machine has no SLURM client): submit from the "
                "cluster's login node, or run here without submit=slurm / hydra/launcher=slurm")
    names, default, error = partitions()
    if error:
        return (f"{PREFIX}SLURM's client here reaches no cluster (sinfo: {error}): submit from the cluster's login "
                "node (SLURM_CONF names a cluster's slurm.conf)")
    if not names:
        return None
    part = params.get("partition")
    if part in (None, ""):
        if default is None:
            return (f"{PREFIX}no partition: hydra.launcher.partition=null and the cluster has no default one; "
                    f"valid: {', '.join(names)} (sinfo)")
        return None
    unknown = [p for p in str(part).split(",") if p not in names]
    if unknown:
        return (f"{PREFIX}hydra.launcher.partition={part}: the cluster has no partition {', '.join(unknown)}; "
                f"valid: {', '.join(names)} (sinfo)")
    return None


def sbatch_error(text: str) -> str:
    """sbatch's own error lines of a refusal (``sbatch: error: ...``), on one line; else its last line."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln.lower()]
    return " ".join(errors or lines[-1:]) or "no message"


# sbatch's refusals that are about the launcher's settings, the same for every job of the sweep:
# (pattern, key, what to say when the key is unset, when it is set)
_SETTINGS = (
    (r"invalid account", "account", "no account: this cluster requires one, hydra.launcher.account=<your project>",
     "hydra.launcher.account={value}: the cluster refused this account (or account/partition pair)"),
    (r"no partition specified", "partition", "no partition: hydra.launcher.partition=<name> (sinfo lists them)",
     "hydra.launcher.partition={value}: refused"),
    (r"invalid partition", "partition", "no partition: hydra.launcher.partition=<name> (sinfo lists them)",
     "hydra.launcher.partition={value}: the cluster has no such partition (sinfo lists them)"),
    (r"invalid qos", "qos", "the cluster refused the default QOS: hydra.launcher.qos=<name>",
     "hydra.launcher.qos={value}: the cluster has no such QOS (or it is not allowed)"),
)


def refusal(error: BaseException, params: dict) -> tuple[str, bool]:
    """(one line: why sbatch refused the job and what to set, whether every job of the sweep gets the same answer)."""
    said = sbatch_error(str(error))
    for pattern, key, unset, wrong in _SETTINGS:
        if re.search(pattern, said, re.IGNORECASE):
            value = params.get(key)
            what = wrong.format(value=value) if value not in (None, "") else unset
            return f"{REFUSED}{what} ({said})", True
    return f"{REFUSED}sbatch refused the job: {said}", False
