"""The command line's own errors and flags (issue 51, items 3 and 4):

* a config-group typo (``model=lama3_8b``, ``strategy=fdsp``, ``hardware=h100``) is one line - the group, the
  value, the closest valid names, bench's schema options hidden - and exit 2; Hydra's message and traceback
  only with HYDRA_FULL_ERROR=1 (bench/run/cli_errors.py);
* Hydra's flags (``--cfg``, ``--info``, ``--resolve``, ``--help``) work with the overrides bench adds to a
  submission (bench/__main__.py: ``hydra/launcher=slurm`` adds ``submit=slurm``)."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from hydra.errors import MissingConfigException

from tests.conftest import REPO


def _compose_error(*overrides: str) -> MissingConfigException:
    from hydra import compose, initialize_config_dir

    from bench.run.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        with pytest.raises(MissingConfigException) as e:
            compose("config", overrides=list(overrides))
    return e.value


@pytest.mark.parametrize("override,line", [
    ("model=lama3_8b", "invalid config: model=lama3_8b: there is no model option 'lama3_8b'; did you mean llama3_8b"),
    ("strategy=fdsp", "invalid config: strategy=fdsp: there is no strategy option 'fdsp'; did you mean fsdp"),
    ("hardware=h100", "invalid config: hardware=h100: there is no hardware option 'h100'; did you mean "
                      "h100_sxm_80gb? valid: a100_40gb, a100_80gb, auto, h100_sxm_80gb,"),
    ("+experiment=papr_zero", "invalid config: experiment=papr_zero: there is no experiment option 'papr_zero'; "
                              "did you mean paper_zero"),
])
def test_a_group_typo_is_one_line_with_the_closest_names(override, line):
    from bench.run.cli_errors import missing_option

    got = missing_option(_compose_error(override))
    assert got.startswith(line) and "\n" not in got, got
    assert "_schema" not in got and "search path" not in got  # internal options and Hydra's detail hidden
    assert missing_option(ValueError("x")) is None


def test_hydra_full_error_gives_hydra_its_own_message(monkeypatch, capsys):
    """Through Hydra's run_and_report (what @hydra.main runs the command through): one line and exit 2, or, with
    HYDRA_FULL_ERROR=1, Hydra's exception as it was."""
    import hydra._internal.utils as hydra_utils

    from bench.run.cli_errors import install

    e = _compose_error("strategy=fdsp")

    def fail():
        raise e

    monkeypatch.setattr(hydra_utils, "run_and_report", hydra_utils.run_and_report)  # restored after the test
    install()
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as ex:
        hydra_utils.run_and_report(fail)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("invalid config: strategy=fdsp:"), err
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(MissingConfigException, match="Could not find 'strategy/fdsp'"):
        hydra_utils.run_and_report(fail)


def test_python_m_bench_with_a_typo_prints_one_line_and_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench", "model=lama3_8b", f"hydra.run.dir={tmp_path / 'r'}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-3000:]
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("invalid config: model=lama3_8b: there is no model option 'lama3_8b'; did you mean "
                               "llama3_8b"), p.stderr
    assert not (tmp_path / "r").exists()


def test_the_overrides_bench_adds_join_the_command_lines_overrides():
    from bench.__main__ import split_argv, submit_argv

    assert split_argv(["a=1", "--cfg", "hydra", "-p", "hydra.launcher", "b=2", "--info", "defaults", "--resolve",
                       "--config-dir=x", "-cd", "y", "c=3"]) == (
        ["--cfg", "hydra", "-p", "hydra.launcher", "--info", "defaults", "--resolve", "--config-dir=x", "-cd", "y"],
        ["a=1", "b=2", "c=3"])
    assert split_argv(["--info", "a=1"]) == (["--info"], ["a=1"])  # --info takes only one of its topics
    assert submit_argv(["hydra/launcher=slurm", "--cfg", "hydra"]) == [
        "hydra/launcher=slurm", "submit=slurm", "--cfg", "hydra"]
    assert submit_argv(["--config-dir", "c", "submit=slurm", "--help"]) == [
        "submit=slurm", "hydra/launcher=slurm", "--config-dir", "c", "--help"]


FLAGS = {  # flags -> what their output holds
    ("--cfg", "hydra"): "_target_: hydra_plugins.bench_plugins.launchers.BenchSlurmLauncher",
    ("--info", "defaults"): "hydra/launcher/slurm",
    ("--cfg", "job", "--resolve"): "submit: slurm",
    ("--help",): "== Configuration groups ==",
}


@pytest.mark.parametrize("flags", list(FLAGS))
def test_hydras_flags_work_with_a_submission(flags, monkeypatch, capsys):
    """``python -m bench hydra/launcher=slurm <flag>`` for each flag (they printed "unrecognized arguments:
    submit=slurm" before): the command line bench/__main__.py makes, through Hydra's own parser and commands, in
    this process (``python -m bench`` costs seconds of imports per command)."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    from bench.__main__ import submit_argv
    from bench.launch.job import main_task

    # bench/__main__.py's main, with its config folder named absolutely (run from a test, Hydra would look for it
    # as the package bench/conf)
    main = hydra.main(version_base="1.3", config_path=str(REPO / "conf"), config_name="config")(main_task)
    monkeypatch.setattr(sys, "argv", ["bench", *submit_argv(["hydra/launcher=slurm", *flags])])
    monkeypatch.chdir(REPO)
    GlobalHydra.instance().clear()
    # --info adds a handler to the root logger on this test's captured stdout and sets the root to DEBUG, for good:
    # a later test in this process then logged into the closed stream ("--- Logging error ---" on its stderr)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        main()
    except SystemExit as e:  # --help exits 0 once it has printed
        assert e.code in (0, None), capsys.readouterr()
    finally:
        GlobalHydra.instance().clear()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])  # and clears the loggers' cached levels
    out = capsys.readouterr()
    assert FLAGS[flags] in out.out and "unrecognized arguments" not in out.err, (flags, out.out[-2000:], out.err)
