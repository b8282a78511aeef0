"""One line for a config-group option that does not exist (``model=lama3_8b``, ``strategy=fdsp``, ``hardware=h100``).

Hydra answers such a typo with every option of the group, bench's internal schema options among them
(``model_schema``), and its config search path: 16-25 lines.  bench prints one line first - the group, the value,
the closest valid names and the valid ones (schema options hidden) - and exits 2, as for any other invalid
config; ``HYDRA_FULL_ERROR=1`` gives Hydra's own message and traceback.  :func:`install` wraps Hydra's
``run_and_report`` (what ``@hydra.main`` runs the command through) for ``python -m bench``; the sweep's jobs use
:func:`missing_option` for a typo in a swept value (``model=300m,lama3_8b``).
"""
from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Any, Callable, Optional

EXIT_INVALID = 2


def _visible(options: Any) -> list[str]:
    """A group's options as a user names them: schema nodes (``model_schema``) and private names hidden."""
    return sorted(str(o) for o in (options or []) if not str(o).endswith("_schema") and not str(o).startswith("_"))


def closest(value: str, options: list[str], n: int = 3) -> list[str]:
    """The options nearest to ``value``: those that contain it (``h100`` -> ``h100_sxm_80gb``), then difflib's."""
    found = [o for o in options if value and value.lower() in o.lower()]
    found += difflib.get_close_matches(value, options, n=n, cutoff=0.5)
    return list(dict.fromkeys(found))[:n]


def missing_option(e: BaseException) -> Optional[str]:
    """One line for Hydra's MissingConfigException about a group option (None for any other error)."""
    from hydra.errors import MissingConfigException

    if not isinstance(e, MissingConfigException) or not e.missing_cfg_file or "/" not in str(e.missing_cfg_file):
        return None
    group, value = str(e.missing_cfg_file).rsplit("/", 1)
    options = _visible(e.options)
    near = closest(value, options)
    extra = [p for p in re.findall(r"provider=([^,]+), path=(\S+)", str(e))
             if p[0] not in ("hydra", "main", "schema")]
    where = f" (searched also {', '.join(p for _, p in extra)})" if extra else ""
    guess = f"did you mean {' or '.join(near)}? " if near else ""
    valid = f"valid: {', '.join(options)}" if options else f"the group {group} has no options here"
    return f"invalid config: {group}={value}: there is no {group} option {value!r}{where}; {guess}{valid}"


def full_error() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def install() -> None:
    """Make ``@hydra.main`` print :func:`missing_option`'s line and exit 2 on a group typo (unless
    HYDRA_FULL_ERROR=1); every other error is Hydra's as before."""
    import hydra._internal.utils as hydra_utils

    original: Callable[[Any], Any] = hydra_utils.run_and_report
    if getattr(original, "bench_one_line", False):
        return

    def run_and_report(func: Any) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except Exception as e:
                line = None if full_error() else missing_option(e)
                if line is None:
                    raise
                print(line, file=sys.stderr, flush=True)
                raise SystemExit(EXIT_INVALID)

        return original(guarded)

    run_and_report.bench_one_line = True  # type: ignore[attr-defined]
    hydra_utils.run_and_report = run_and_report
