"""Repeat a pytest selection N times, each in a fresh pytest process, and count every test's outcomes.

    python tests/stress.py 20 --out results/<date>-cpu-stress -- tests/test_model_parallel.py -k spawn

prints one line per iteration and, at the end, a table: per test, how many of the N runs passed,
failed, errored, were skipped; the exit code is 1 if any run of any test did not pass.  With
``--out`` it writes there ``stress.md`` (command, machine, table), ``stress.json`` (every outcome),
``failures/`` (the output of each iteration that had a failure), ``faults.jsonl`` (the rows the
fault tests record: tests.conftest.record_fault) and ``faults.md`` (those rows as one table per fault).  Run it niced on a shared machine:
``nice -n 19 python tests/stress.py ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
OUTCOMES = ("passed", "failed", "error", "skipped")


def outcomes(junit: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped, from a pytest junit XML file."""
    out = {}
    if not junit.is_file():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        test = f"{cls.replace('.', '/')}.py::{name}" if cls else name
        kinds = {child.tag for child in case}
        out[test] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                     else "skipped" if "skipped" in kinds else "passed")
    return out


def write_fault_table(out: Path, cmd: str) -> None:
    """faults.md from the rows the fault tests recorded in faults.jsonl: per fault, the statuses recorded,
    and over every repetition the results lost and the processes left behind (both must be 0)."""
    src = out / "faults.jsonl"
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()] if src.is_file() else []
    if not rows:
        return
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["fault"], []).append(r)
    lines = ["| fault | repetitions | status recorded | results lost (max) | processes left (max) |",
             "|---|---:|---|---:|---:|"]
    for fault, rs in sorted(by.items()):
        statuses = ", ".join(sorted({r["status"] for r in rs}))
        lines.append(f"| {fault} | {len(rs)} | {statuses} | {max(r['lost'] for r in rs)} | {max(r['left'] for r in rs)} |")
    (out / "faults.md").write_text(f"# Faults injected on CPU (gloo)\n\nFrom `{cmd}` (tests/test_faults.py, "
                                   "tests/test_runs.py, tests/test_analysis.py record one row each time they run).\n\n"
                                   + "\n".join(lines) + "\n")


def report(out: Optional[Path], n: int, args: list[str], runs: list[dict], counts: dict, t_start: float) -> bool:
    """Print and (``out``) write the outcome so far: per test counts, per iteration, the fault table.
    Written after every iteration, so a stress run stopped early still says what it did.  True when
    any run of any test did not pass."""
    failed_any = any(c["failed"] or c["error"] for c in counts.values()) or any(r["failed"] for r in runs)
    last_bad = max((r["iteration"] for r in runs if r["failed"]), default=0)
    lines = ["| test | runs | passed | failed | error | skipped |", "|---|---:|---:|---:|---:|---:|"]
    for test in sorted(counts):
        c = counts[test]
        lines.append(f"| {test} | {sum(c.values())} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    tot = {o: sum(c[o] for c in counts.values()) for o in OUTCOMES}
    lines.append(f"| **all {len(counts)} tests** | {sum(tot.values())} | {tot['passed']} | {tot['failed']} | "
                 f"{tot['error']} | {tot['skipped']} |")
    summary = (f"{len(runs)} of {n} iterations done in {(time.time() - t_start) / 60:.1f} min; iterations with a "
               f"failure: {sum(bool(r['failed']) for r in runs)}; last consecutive iterations without one: "
               f"{len(runs) - last_bad}")
    if out is None:
        return failed_any
    cmd = "nice -n 19 python tests/stress.py " + shlex.join([str(n), "--out", str(out), "--", *args])
    machine = f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"
    (out / "stress.md").write_text(
        f"# Stress check\n\n`{cmd}`\n\n{machine}; started {time.strftime('%Y-%m-%d %H:%M', time.localtime(t_start))}"
        f"\n\n{summary}\n\n" + "\n".join(lines) + "\n\nPer iteration (seconds, failures):\n\n"
        + "\n".join(f"- {r['iteration']}{' (started ' + r['at'] + ')' if 'at' in r else ''}: {r['seconds']} s, {r['tests']} tests, failed: "
                    f"{', '.join(r['failed']) or 'none'}" for r in runs) + "\n")
    (out / "stress.json").write_text(json.dumps({"command": cmd, "machine": machine, "runs": runs, "counts": counts,
                                                 "seconds": time.time() - t_start}, indent=1))
    write_fault_table(out, cmd)
    return failed_any


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="how many times to run the selection")
    ap.add_argument("--out", type=Path, help="folder for stress.md, stress.json, failures/, faults.jsonl")
    ap.add_argument("--resume", action="store_true",
                    help="continue the stress run recorded in --out/stress.json (same selection) up to n iterations")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    args = argv[cut + 1:] or ["tests"]  # after --: the pytest selection and options
    counts: dict[str, dict[str, int]] = {}
    runs: list[dict] = []
    t_start = time.time()
    if a.resume:
        if not (a.out and (a.out / "stress.json").is_file()):
            ap.error("--resume needs --out with the stress.json of an earlier run")
        done = json.loads((a.out / "stress.json").read_text())
        if not done["command"].endswith(shlex.join(["--", *args])):
            ap.error(f"--resume: the earlier run's selection differs: {done['command']}")
        runs, counts, t_start = done["runs"], done["counts"], time.time() - done["seconds"]
    elif a.out:
        (a.out / "faults.jsonl").unlink(missing_ok=True)
    if a.out:
        (a.out / "failures").mkdir(parents=True, exist_ok=True)
    failed_any = False
    with tempfile.TemporaryDirectory(prefix="bench_stress_") as tmp:
        for i in range(len(runs) + 1, a.n + 1):
            junit = Path(tmp) / f"iter{i}.xml"
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if a.out:
                env["BENCH_FAULT_TABLE"] = str((a.out / "faults.jsonl").resolve())
            t0 = time.time()
            p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                                *args], cwd=REPO, env=env, capture_output=True, text=True)
            got = outcomes(junit)
            for test, o in got.items():
                counts.setdefault(test, dict.fromkeys(OUTCOMES, 0))[o] += 1
            bad = sorted(t for t, o in got.items() if o in ("failed", "error"))
            if not got or p.returncode not in (0, 5) and not bad:  # pytest itself failed (collection, crash)
                bad = bad or [f"pytest exit code {p.returncode}"]
            runs.append({"iteration": i, "at": time.strftime("%Y-%m-%d %H:%M", time.localtime(t0)),
                         "seconds": round(time.time() - t0, 1), "returncode": p.returncode,
                         "tests": len(got), "failed": bad})
            if bad and a.out:
                (a.out / "failures" / f"iter{i}.log").write_text(p.stdout[-200_000:] + p.stderr[-50_000:])
            print(f"iteration {i}/{a.n}: {len(got) - len(bad)} passed or skipped, {len(bad)} failed "
                  f"({time.time() - t0:.0f} s){': ' + ', '.join(bad) if bad else ''}", flush=True)
            failed_any = report(a.out, a.n, args, runs, counts, t_start)
    print((a.out / "stress.md").read_text() if a.out else "")
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
