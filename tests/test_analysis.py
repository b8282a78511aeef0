"""multirun_analysis on a REAL CPU multirun (one sweep per module, reused by every test).

The numbers in summary.csv are checked against values recomputed here, independently,
from the run folders' metrics.json; broken copies of the sweep check that debris (corrupt,
missing, in-progress, old-schema runs, no baseline) is reported and never fatal.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

try:
    from tests.conftest import CPU_FAST, REPO, record_fault, run_bench
except ImportError:  # tests/ without __init__.py
    from conftest import CPU_FAST, REPO, record_fault, run_bench

pytestmark = pytest.mark.slow
SINGLE_WS2_REASON = "strategy=single runs on exactly 1 device"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("analysis") / "sweep"
    p = run_bench("strategy=single,ddp", "world_size=1,2", *CPU_FAST, run_dir=d, multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def analyse(*args, cwd=REPO) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def analysed(sweep):
    p = analyse(sweep)
    return p, sweep / "analysis"


def job(sweep: Path, strategy: str, ws: int) -> Path:
    """The run folder of one job of the sweep (from its own overrides, not from the analysis)."""
    for d in sorted(sweep.iterdir()):
        o = d / ".hydra" / "overrides.yaml"
        if o.is_file() and f"strategy={strategy}" in o.read_text() and f"world_size={ws}\n" in o.read_text():
            return d
    raise AssertionError(f"no job {strategy} ws={ws} in {sweep}")


def expected(run_dir: Path) -> dict:
    """tokens, time, throughput and peak memory recomputed from the ranks' own records."""
    m = json.loads((run_dir / "metrics.json").read_text())
    ranks = m["ranks"]
    tokens = sum(r["tokens_per_step"] for r in ranks) * m["throughput"]["applied_timed_steps"]
    time_s = max(r["window_s"] for r in ranks)
    mem = [r["max_allocated_mb"] if r["max_allocated_mb"] is not None else r["host_peak_rss_mb"] for r in ranks]
    return {"tokens": tokens, "time_s": time_s, "tokens_per_s": tokens / time_s, "mem_peak_mb": max(mem),
            "mem_mean_mb": sum(mem) / len(mem), "mem_total_mb": sum(mem), "ws": m["config"]["world_size"]}


def row(df: pd.DataFrame, strategy: str, ws: int) -> pd.Series:
    r = df[(df["strategy"] == strategy) & (df["world_size"] == ws)]
    assert len(r) == 1, df[["strategy", "world_size"]]
    return r.iloc[0]


# ------------------------------------------------------------------------------ the real sweep
def test_outputs_and_terminal_table(analysed):
    p, out = analysed
    for f in ("runs.csv", "runs.parquet", "summary.csv", "failed_runs.csv", "report.md",
              "throughput.png", "scaling_efficiency.png", "memory.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    for f in ("throughput.png", "scaling_efficiency.png", "memory.png"):
        assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "tokens/s" in p.stdout and "eff %" in p.stdout and "invalid" in p.stdout
    assert "plot variants: skipped" in p.stdout and "plot mfu: skipped" in p.stdout  # CPU: no peak, no ZeRO


def test_runs_table(analysed, sweep):
    _, out = analysed
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and len(pd.read_parquet(out / "runs.parquet")) == 4
    for c in ("model", "strategy", "impl", "world_size", "precision", "compile", "global_batch", "seq_len",
              "bucket_cap_mb", "status", "error_type", "error_message", "run_dir", "throughput.tokens_per_s",
              "flops.mfu", "memory.host_peak_rss_mb"):
        assert c in runs.columns, c
    assert sorted(runs["status"]) == ["completed", "completed", "completed", "invalid"]
    assert set(runs["run_dir"]) == {str(d.resolve()) for d in sweep.iterdir() if d.name.isdigit()}


def test_summary_numbers_match_metrics(analysed, sweep):
    _, out = analysed
    s = pd.read_csv(out / "summary.csv")
    assert len(s) == 3  # single/1, ddp/1, ddp/2; the invalid single/2 is not an experiment
    base = expected(job(sweep, "single", 1))
    for strategy, ws in (("single", 1), ("ddp", 1), ("ddp", 2)):
        e, r = expected(job(sweep, strategy, ws)), row(s, strategy, ws)
        assert r["n_runs"] == 1 and r["tokens"] == e["tokens"] == 4 * 8 * 128 - 8 * 128
        assert r["time_s"] == pytest.approx(e["time_s"], rel=1e-12)
        assert r["tokens_per_s"] == pytest.approx(e["tokens_per_s"], rel=1e-12)
        assert r["tokens_per_s_min"] == r["tokens_per_s_max"] == pytest.approx(r["tokens_per_s"])
        for k in ("mem_peak_mb", "mem_mean_mb", "mem_total_mb"):
            assert r[k] == pytest.approx(e[k], rel=1e-12), k
        sf = e["tokens_per_s"] / base["tokens_per_s"]
        assert r["scaling_factor"] == pytest.approx(sf, rel=1e-9)
        assert r["scaling_efficiency_pct"] == pytest.approx(100 * sf / ws, rel=1e-9)
        tpt, tpt_base = e["time_s"] / e["tokens"], base["time_s"] / base["tokens"]
        assert r["overhead_pct"] == pytest.approx(100 * (tpt * ws / tpt_base - 1), rel=1e-9, abs=1e-9)
        assert r["memory_ratio"] == pytest.approx(e["mem_peak_mb"] / base["mem_peak_mb"], rel=1e-9)
    assert row(s, "single", 1)["scaling_efficiency_pct"] == pytest.approx(100.0)


def test_fixed_overhead_per_run(analysed, sweep):
    """The start-up / teardown cost of each run, from its job record and rank 0's phases."""
    _, out = analysed
    o = pd.read_csv(out / "fixed_overhead.csv")
    s = pd.read_csv(out / "summary.csv")
    for strategy, ws in (("single", 1), ("ddp", 1), ("ddp", 2)):
        m = json.loads((job(sweep, strategy, ws) / "metrics.json").read_text())
        j, r0 = m["job"], m["ranks"][0]
        assert j["overhead_s"] == pytest.approx(j["startup_s"] + j["teardown_s"])
        for table in (row(o, strategy, ws), row(s, strategy, ws)):
            assert table["fixed_overhead_s"] == pytest.approx(j["overhead_s"], rel=1e-9)
            assert table["startup_s"] == pytest.approx(j["startup_s"], rel=1e-9)
            assert table["outside_steps_s"] == pytest.approx(j["outside_steps_s"], rel=1e-9)
            assert j["outside_steps_s"] >= j["overhead_s"]
            assert table["setup_s"] == pytest.approx(r0["setup_s"], rel=1e-9)
        parts = row(o, strategy, ws)["setup_phases"]
        for name in ("bench model", "wrap", "optimizer", "device_and_process_group"):
            assert name in parts, parts
    md = (out / "report.md").read_text()
    assert "## Fixed overhead per run" in md and "fixed_overhead_s  = job.overhead_s" in md


def test_failed_runs_has_the_invalid_job(analysed):
    _, out = analysed
    f = pd.read_csv(out / "failed_runs.csv")
    r = row(f, "single", 2)
    assert r["status"] == "invalid" and r["error_type"] == "ConfigError"
    assert SINGLE_WS2_REASON in r["reason"]


def test_report(analysed):
    _, out = analysed
    md = (out / "report.md").read_text()
    for s in ("## Answer", "2 CPU ranks, 1024 tokens per step**: use **ddp**", "tokens/s", "## Failed and incomplete runs", SINGLE_WS2_REASON,
              "![throughput](throughput.png)", "variants: skipped", "## Environment", "torch 2",
              "scaling_efficiency_pct = 100 * scaling_factor / N"):
        assert s in md, s


def test_python_api(sweep, analysed):
    from matplotlib.figure import Figure

    import multirun_analysis as ma
    runs = ma.load_runs(sweep)
    assert len(runs) == 4  # the analysis/ folder written by the CLI is not a run
    s = ma.summarize(runs)
    csv = pd.read_csv(analysed[1] / "summary.csv")
    for strategy, ws in (("single", 1), ("ddp", 2)):
        assert row(s, strategy, ws)["tokens_per_s"] == pytest.approx(row(csv, strategy, ws)["tokens_per_s"])
    for plot in (ma.plot_throughput, ma.plot_scaling_efficiency, ma.plot_memory):
        assert isinstance(plot(s), Figure)
    for plot in (ma.plot_variants, ma.plot_pp_microbatches, ma.plot_mfu):
        with pytest.raises(ma.NoDataError):
            plot(s)
    vs = ma.compare_to_baseline(s, baseline={"strategy": "ddp", "world_size": 1})
    assert row(vs, "ddp", 1)["scaling_factor"] == pytest.approx(1.0)
    none = ma.compare_to_baseline(s, baseline={"strategy": "zero", "world_size": 1})
    assert none["scaling_factor"].isna().all() and none["baseline_note"].notna().all()
    assert list(ma.failed_runs(runs)["status"]) == ["invalid"]


# ------------------------------------------------------------------------------ broken sweeps
def _truncate(d: Path):
    p = job(d, "ddp", 2) / "metrics.json"
    p.write_text(p.read_text()[: len(p.read_text()) // 2])
    return job(d, "ddp", 2), "incomplete", "metrics.json unreadable"


def _garbage(d: Path):
    (job(d, "ddp", 2) / "metrics.json").write_bytes(bytes(range(256)) * 4)  # not even UTF-8
    return job(d, "ddp", 2), "incomplete", "metrics.json unreadable"


def _not_an_object(d: Path):
    (job(d, "ddp", 2) / "metrics.json").write_text("[1, 2, 3]")  # valid JSON, not a metrics object
    return job(d, "ddp", 2), "incomplete", "metrics.json is not a JSON object"


def _delete(d: Path):
    (job(d, "ddp", 1) / "metrics.json").unlink()
    return job(d, "ddp", 1), "incomplete", "no metrics.json; status.json says 'completed'"


def _running(d: Path):
    (d / "7").mkdir()
    (d / "7" / "status.json").write_text(json.dumps({"status": "running", "time": 0}))
    return d / "7", "incomplete", "status.json says 'running'"


def _pending(d: Path):  # never started (the sweep was cut off): only the sweep's status.json
    (d / "9").mkdir()
    (d / "9" / "status.json").write_text(json.dumps({
        "status": "pending", "model": "tiny", "strategy": "zero", "world_size": 2, "precision": "fp32",
        "steps": 6, "overrides": ["strategy=zero", "world_size=2"], "time": 0}))
    return d / "9", "incomplete", "status.json says 'pending'"


def _killed(d: Path):
    shutil.copytree(job(d, "ddp", 2) / ".hydra", d / "8" / ".hydra")
    return d / "8", "incomplete", "no metrics.json and no status.json"


def _old_schema(d: Path):
    p = job(d, "ddp", 2) / "metrics.json"
    m = json.loads(p.read_text())
    m["schema_version"] = 0
    p.write_text(json.dumps(m))
    return job(d, "ddp", 2), None, "schema_version 0"


def _hung_exit(d: Path):
    p = job(d, "ddp", 2) / "metrics.json"
    m = json.loads(p.read_text())
    m["exit_warning"] = "the processes did not exit within run_timeout_s=100 after the run completed"
    p.write_text(json.dumps(m))
    return job(d, "ddp", 2), None, "did not exit within run_timeout_s=100"


def _no_baseline(d: Path):
    shutil.rmtree(job(d, "single", 1))
    return None, None, "no completed strategy=single world_size=1 run"


BROKEN = [_truncate, _garbage, _not_an_object, _delete, _running, _pending, _killed, _old_schema, _hung_exit, _no_baseline]

# The CLI's main() once per (argv) of a JSON list, in one interpreter (one start-up and one import of pandas and
# matplotlib for all of them instead of one each): [{rc, stdout, stderr}], each call's own output and exit status
# (what `python -m multirun_analysis ARGV` prints and returns; sys.exit(main()) is all its __main__ adds).
_ANALYSE_EACH = r"""
import contextlib, io, json, sys, traceback, warnings
from multirun_analysis.__main__ import main
res = []
for argv in json.loads(sys.argv[1]):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e), warnings.catch_warnings():
        try:
            rc = main(argv)
        except SystemExit as x:
            rc = x.code if isinstance(x.code, int) else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
    res.append({"rc": rc, "stdout": o.getvalue(), "stderr": e.getvalue()})
with open(sys.argv[2], "w") as f:
    json.dump(res, f)
"""


def analyse_each(results: Path, *argvs) -> list[subprocess.CompletedProcess]:
    """analyse(*argv) for every argv, the analyses one after another in one process (see _ANALYSE_EACH);
    their outputs go through the file ``results``."""
    argvs = [[str(a) for a in argv] for argv in argvs]
    p = subprocess.run([sys.executable, "-c", _ANALYSE_EACH, json.dumps(argvs), str(results)], cwd=REPO,
                       capture_output=True, text=True, timeout=120 * len(argvs))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = [subprocess.CompletedProcess([sys.executable, "-m", "multirun_analysis", *argv], r["rc"], r["stdout"],
                                       r["stderr"]) for argv, r in zip(argvs, json.loads(results.read_text()))]
    assert len(out) == len(argvs), (len(out), len(argvs))
    return out


def test_broken_sweep_is_reported_not_fatal(sweep, tmp_path):
    """Each corruption of BROKEN on its own copy of the sweep, the copies analysed by one process
    (analyse_each): each checked in turn, a failure names its corruption."""
    cases = {}
    for corrupt in BROKEN:
        d = tmp_path / corrupt.__name__.strip("_") / "sweep"
        shutil.copytree(sweep, d, ignore=shutil.ignore_patterns("analysis"))
        cases[corrupt] = (d, *corrupt(d))
    ps = analyse_each(tmp_path / "analyses.json", *[(d, "--out", d.parent / "out") for d, *_ in cases.values()])
    for (corrupt, (d, run_dir, status, text)), p in zip(cases.items(), ps):
        _check_broken(corrupt, p, d.parent / "out", run_dir, status, text)


def _check_broken(corrupt, p: subprocess.CompletedProcess, out: Path, run_dir: Path | None, status: str | None,
                  text: str) -> None:
    name = corrupt.__name__.strip("_")
    assert p.returncode == 0, (name, p.stdout[-2000:] + p.stderr[-3000:])
    assert text in p.stdout and text in (out / "report.md").read_text(), (name, text, p.stdout[-3000:])
    s, f = pd.read_csv(out / "summary.csv"), pd.read_csv(out / "failed_runs.csv")
    assert row(f, "single", 2)["status"] == "invalid", name  # the rest of the sweep is still analysed
    if status is not None:  # the broken run is a failed/incomplete row with its reason
        r = f[f["run_dir"] == str(run_dir.resolve())]
        assert len(r) == 1 and r.iloc[0]["status"] == status and text in r.iloc[0]["reason"], (name, r)
        assert len(s) == (3 if corrupt in (_running, _pending, _killed) else 2), (name, s)
        if corrupt is _pending:  # what it would have run, from the sweep's status.json
            assert (r.iloc[0]["model"], r.iloc[0]["strategy"], r.iloc[0]["world_size"]) == ("tiny", "zero", 2)
            assert r.iloc[0]["overrides"] == "strategy=zero world_size=2"
    elif corrupt in (_old_schema, _hung_exit):  # loaded what is there: still in the summary
        assert len(s) == 3 and row(s, "ddp", 2)["tokens_per_s"] > 0, (name, s)
    else:  # no baseline: comparison columns empty, not an exception
        assert len(s) == 2 and s["scaling_efficiency_pct"].isna().all() and s["memory_ratio"].isna().all(), (name, s)
        assert s["tokens_per_s"].notna().all(), (name, s)
    if corrupt in (_truncate, _garbage, _not_an_object, _delete):  # the fault table (tests/test_faults.py)
        what = {_truncate: "truncated", _garbage: "garbage (binary)", _not_an_object: "valid JSON, not an object",
                _delete: "missing"}[corrupt]
        # nothing lost: every other run of the sweep is still analysed, the broken one is a row with its reason
        record_fault(f"metrics.json {what}, fed to the analysis", f"{status} (row with its reason)", 0, 0, text)


def test_no_runs_found_exits_1(tmp_path):
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "no run folders" in p.stderr


# ------------------------------------------------------------------------------ the notebook
def test_example_notebook_executes(sweep, monkeypatch, tmp_path):
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    monkeypatch.setenv("BENCH_MULTIRUN_DIR", str(sweep))  # the kernel inherits this environment
    nb = nbformat.read(REPO / "multirun_analysis" / "example.ipynb", as_version=4)
    # The kernel is this interpreter (the venv's), whatever kernelspecs the machine has installed:
    # a private kernelspec in a private kernel dir, nothing installed (jupyter_client 8 ignores kernel_cmd).
    spec = tmp_path / "kernels" / "bench-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bench test kernel", "language": "python"}))
    km = KernelManager(kernel_name="bench-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))
    assert km.kernel_spec.argv[0] == sys.executable
    NotebookClient(nb, km=km, timeout=120, resources={"metadata": {"path": str(REPO)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3  # throughput, efficiency, memory
    text = "".join(o.get("text", "") for o in outputs)
    assert f"analysing {sweep.resolve()}" in text and "plot_variants: skipped" in text


def test_pipeline_microbatch_settings_p_and_4p_are_plotted_by_their_counts(tmp_path):
    """strategy.microbatches holds settings ("p", "4p"); the plot uses the resolved count
    (a real GPU sweep of +experiment=paper_megatron crashed the report on "p" once)."""
    import multirun_analysis as ma
    from matplotlib.figure import Figure

    d = tmp_path / "pp"
    p = run_bench("strategy=pp", "strategy.impl=torch", "world_size=2", "strategy.microbatches=p,4p",
                  *CPU_FAST, run_dir=d, multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    analyse(d)  # the CLI, plots included
    s = ma.summarize(ma.load_runs(d))
    assert sorted(s["microbatches"]) == ["4p", "p"]
    assert dict(zip(s["microbatches"], s["n_microbatches"])) == {"p": 2, "4p": 8}
    fig = ma.plot_pp_microbatches(s)
    assert isinstance(fig, Figure)
    _legend_outside_the_axes(fig)


def test_runs_differing_only_in_their_deadlines_or_bench_version_are_repeats(tmp_path):
    """run_timeout_s / teardown_timeout_s say when to give up on a run, not what it measures: runs
    that differ only there are repeats of one experiment (not split into two `single` rows by
    teardown_timeout_s=15 / 30).  So are runs recorded before a knob was
    added (bench.sweep.ADDED_AT_DEFAULT): here two runs lose `cpu_affinity` from their records, as
    runs from before it existed have no such key."""
    import yaml

    import multirun_analysis as ma

    d = tmp_path / "deadlines"
    p = run_bench("strategy=single", "teardown_timeout_s=15,20", "run_timeout_s=200,250", *CPU_FAST,
                  run_dir=d, multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    for job in ("0", "1"):
        mpath, hpath = d / job / "metrics.json", d / job / ".hydra" / "config.yaml"
        m = json.loads(mpath.read_text())
        del m["config"]["cpu_affinity"]
        mpath.write_text(json.dumps(m))
        h = yaml.safe_load(hpath.read_text())
        del h["cpu_affinity"]
        hpath.write_text(yaml.safe_dump(h))
    runs = ma.load_runs(d)
    assert len(runs) == 4 and set(runs["status"]) == {"completed"}
    assert list(runs["cpu_affinity"]) == ["none"] * 4
    assert "autocast" not in runs.columns  # a ZeRO knob: not given to single's runs
    s = ma.summarize(runs)
    assert len(s) == 1 and s.iloc[0]["n_runs"] == 4


# ------------------------------------------------------------------------------ units, legends, styles
def _legend_outside_the_axes(fig) -> None:
    """Every legend of the figure lies inside the figure (nothing clipped) and overlaps no axes (no data hidden)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    for leg in legends:
        box = leg.get_window_extent(r)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(r)), (box, ax.get_title())


def test_memory_is_in_gib_throughout_and_legends_sit_outside(analysed, sweep):
    import multirun_analysis as ma

    _, out = analysed
    s = pd.read_csv(out / "summary.csv")
    md = (out / "report.md").read_text()
    assert "MiB" not in md and "| peak GiB |" in md
    for strategy, ws in (("single", 1), ("ddp", 2)):
        gib = expected(job(sweep, strategy, ws))["mem_peak_mb"] / 1024
        assert f" {gib:,.2f} |" in md  # the summary table's cell
    fig = ma.plot_memory(ma.summarize(ma.load_runs(sweep)))
    assert all("[GiB]" in ax.get_ylabel() for ax in fig.axes)
    plotted = sorted(y for c in fig.axes[0].containers for y in c.lines[0].get_ydata())  # errorbar: (data, caps, bars)
    assert plotted == pytest.approx(sorted(s["mem_peak_mb"] / 1024))
    _legend_outside_the_axes(fig)


def test_thirteen_series_are_told_apart_where_colours_repeat():
    from multirun_analysis.plots import styles

    st = styles([f"series {i:02d}" for i in range(13)])
    looks = {(v["color"], v["marker"], v["linestyle"]) for v in st.values()}
    assert len({v["color"] for v in st.values()}) == 10 and len(looks) == 13  # colours repeat, looks do not


def test_a_status_record_in_metrics_json_is_printed_as_a_line(sweep, tmp_path):
    import multirun_analysis as ma

    d = tmp_path / "r"
    shutil.copytree(job(sweep, "ddp", 2), d)
    m = json.loads((d / "metrics.json").read_text())
    m["status"] = {"status": "pending", "model": "tiny", "strategy": "zero", "world_size": 2,
                   "overrides": ["strategy=zero", "world_size=2"]}
    (d / "metrics.json").write_text(json.dumps(m))
    row, _ = ma.read_run(d)
    assert "status is a record, not a word: pending: model=tiny, strategy=zero, world_size=2, " \
           "overrides=strategy=zero world_size=2" in row["problems"]
    assert "{" not in row["problems"] and row["status"] == "pending"
