"""The GPU-time estimate a sweep prints before it runs: from earlier completed runs' status.json."""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Optional, Sequence

from bench.jsonio import read_json_dict


def history_records(dirs: Sequence[Path]) -> list[dict]:
    recs, seen = [], set()
    for root in dirs:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [x for x in dirnames if not x.startswith(".")]
            depth = len(Path(dirpath).relative_to(root).parts)
            if depth >= 4:
                dirnames[:] = []
            if "status.json" in filenames:
                p = Path(dirpath).resolve()
                if p in seen:
                    continue
                seen.add(p)
                st = read_json_dict(p / "status.json")
                if st and st.get("status") == "completed" and st.get("wall_s"):
                    recs.append(st)
    return recs


class CostModel:
    """wall(run) ~ fixed overhead + steps x time per step, medians over completed runs with the
    same model / strategy / world size (and precision, when there are such runs)."""

    def __init__(self, records: list[dict]):
        self.by: dict[tuple, list[dict]] = {}
        for r in records:
            for k in (self._k(r, True), self._k(r, False)):
                self.by.setdefault(k, []).append(r)

    @staticmethod
    def _k(r: dict, precise: bool) -> tuple:
        base = (r.get("model"), r.get("strategy"), r.get("world_size"))
        return base + ((r.get("precision"),) if precise else ())

    def estimate(self, ident: dict) -> Optional[float]:
        rs = self.by.get(self._k(ident, True)) or self.by.get(self._k(ident, False))
        if not rs:
            return None
        over = statistics.median(r.get("overhead_s") or 0.0 for r in rs)
        per_step = statistics.median(max(0.0, r["wall_s"] - (r.get("overhead_s") or 0.0)) / max(1, r.get("steps") or 1)
                                     for r in rs)
        return over + per_step * (ident.get("steps") or 1)


def fmt_s(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else (f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s")
