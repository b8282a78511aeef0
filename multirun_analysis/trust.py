"""What not to trust: a completed run whose number may be noise is flagged, in the tables (``not_to_trust``),
in the answer and in the report's Problems, never dropped.  A run is flagged for

* **few steps**: fewer than MIN_TIMED_STEPS timed steps.  Too few to show their spread: one slow step among
  three (a host hiccup, a late allocation) moves the run's throughput by a third of its own excess.
* **spread**: the standard error of the mean step time (sample standard deviation / sqrt(n) / mean) is above
  MAX_SEM_PCT.  Two strategies that far apart cannot be told apart by such a run.  Among the GPU runs
  recorded in results/, few are above it, most of them host-bound 1-GPU search runs.
* **host busy**: during the timed window, processes other than the run's ranks kept at least OTHERS_MIN_CPUS
  CPUs of a node busy while fewer than IDLE_MIN_CPUS were left idle (they competed with the run for CPUs), or
  kept at least half of the node's CPUs busy.  Each rank records its own CPU use and its host's over the
  window (bench/metrics/host.py); runs recorded before bench did so have no such record, and the report says
  that their host load is unknown rather than flagging them.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

MIN_TIMED_STEPS = 8
MAX_SEM_PCT = 5.0
OTHERS_MIN_CPUS = 0.5
IDLE_MIN_CPUS = 0.5
FLAGS = ("few steps", "spread", "host busy")  # the short names, in this order, in the tables
THRESHOLDS = (f"fewer than {MIN_TIMED_STEPS} timed steps (few steps); a mean step time uncertain by more than "
              f"±{MAX_SEM_PCT:g}% (standard error; spread); other processes competing with the run for the host's "
              f"CPUs during its timed window (host busy: they kept >= {OTHERS_MIN_CPUS:g} CPU busy with < "
              f"{IDLE_MIN_CPUS:g} idle, or half the host's CPUs)")


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else math.nan


def _step_times(m: dict) -> list[float]:
    st = m.get("step_time_s") if isinstance(m.get("step_time_s"), dict) else {}
    xs = st.get("all") if isinstance(st.get("all"), list) else []
    return [float(x) for x in xs if not math.isnan(_num(x))]


def sem_pct(times: list[float]) -> float:
    """The standard error of the mean step time, in % of the mean (NaN with fewer than 2 steps)."""
    if len(times) < 2 or statistics.fmean(times) <= 0:
        return math.nan
    return 100 * statistics.stdev(times) / math.sqrt(len(times)) / statistics.fmean(times)


def host_load(m: dict) -> Optional[dict]:
    """The busiest node's CPUs during the timed window: other processes' busy CPUs, idle CPUs, the run's own and
    the node's count; None where the ranks did not record their host's CPU use."""
    nodes: dict[str, list[dict]] = {}
    for r in m.get("ranks") or []:
        if isinstance(r, dict):
            node = (r.get("placement") or {}).get("node") if isinstance(r.get("placement"), dict) else None
            nodes.setdefault(str(node), []).append(r)
    worst = None
    for ranks in nodes.values():
        busy = [_num(r.get("host_busy_cpus")) for r in ranks]
        own = [_num(r.get("process_cpus")) for r in ranks]
        cpus = [_num(r.get("host_cpus")) for r in ranks]
        if any(math.isnan(x) for x in busy + own + cpus):
            return None  # a rank without the record: the node's load is unknown
        host = {"cpus": max(cpus), "own": sum(own), "busy": statistics.fmean(busy)}
        host["others"] = max(0.0, host["busy"] - host["own"])
        host["idle"] = max(0.0, host["cpus"] - host["busy"])
        if worst is None or host["others"] > worst["others"]:
            worst = host
    return worst


def run_flags(m: dict, completed: bool) -> tuple[dict, list[str]]:
    """A run's trust columns (``trust.*``, ``not_to_trust``: the short flags, comma-joined, or None) and one
    problem line per flag (no "; " inside: load.py joins a run's problems with it)."""
    times = _step_times(m)
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    n = len(times) or _num(run.get("timed_steps"))
    sem = sem_pct(times)
    load = host_load(m)
    cols = {"trust.timed_steps": n, "trust.step_time_sem_pct": sem,
            "trust.other_busy_cpus": load["others"] if load else math.nan,
            "trust.idle_cpus": load["idle"] if load else math.nan, "trust.host_load_recorded": load is not None,
            "not_to_trust": None}
    if not completed:
        return cols, []
    flags, lines = [], []
    if not math.isnan(n) and n < MIN_TIMED_STEPS:
        flags.append("few steps")
        lines.append(f"not to trust: {n:g} timed steps (fewer than {MIN_TIMED_STEPS}: their spread is unknown)")
    if sem > MAX_SEM_PCT:
        flags.append("spread")
        lines.append(f"not to trust: step times spread, the mean step time is uncertain by ±{sem:.1f}% (standard "
                     f"error over {len(times)} steps, more than ±{MAX_SEM_PCT:g}%)")
    if load and load["others"] >= OTHERS_MIN_CPUS and (load["idle"] < IDLE_MIN_CPUS or load["others"] >= load["cpus"] / 2):
        flags.append("host busy")
        lines.append(f"not to trust: host busy, other processes kept {load['others']:.1f} of its {load['cpus']:g} CPUs "
                     f"busy during the timed window ({load['idle']:.1f} idle, the run's ranks used {load['own']:.1f})")
    cols["not_to_trust"] = ", ".join(flags) or None
    return cols, lines


def of_runs(flags) -> Optional[str]:
    """An experiment's flags from its usable runs' ``not_to_trust`` cells: each flag, with 'k of n runs' where
    not every repeat has it; None when none has."""
    cells = [c if isinstance(c, str) else "" for c in flags]
    out = []
    for f in FLAGS:
        k = sum(f in c.split(", ") for c in cells)
        if k:
            out.append(f if k == len(cells) else f"{f} ({k} of {len(cells)} runs)")
    return ", ".join(out) or None


def unrecorded_host_load(runs) -> Optional[str]:
    """One line for the report where completed runs carry no record of their host's CPU use."""
    if "trust.host_load_recorded" not in runs.columns or not len(runs):
        return None
    done = runs[runs["status"] == "completed"]
    k = int((~done["trust.host_load_recorded"].fillna(False).astype(bool)).sum())
    if not k:
        return None
    return (f"host load not recorded for {k} of {len(done)} completed run(s) (recorded before bench measured its "
            "host's CPU use): whether another process competed with them is unknown")
