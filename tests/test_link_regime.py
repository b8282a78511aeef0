"""Link regimes (bench/machine/link_regime.py): a regime is NCCL's environment, named; a bad name is refused in one line
naming key, value and the valid names (run and probe); what NCCL logged is parsed into the transports and the link
it used; a real run records its regime and NCCL variables in metrics.json (on CPU: gloo, so no transport)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from bench.machine import link_regime as lr
from bench.run.config import register_configs, validate
from bench.spec.schema import LINK_REGIMES, ConfigError
from tests.conftest import CPU_FAST, REPO, run_bench

register_configs()

# lines as NCCL 2.2x writes them with NCCL_DEBUG=INFO (one of each transport; the rest of a log is other INFO lines)
P2P = ["h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
       "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
       "h:1:2 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1"]
SHM = ["h:1:2 [1] NCCL INFO Channel 00 : 1[1] -> 2[2] via SHM/direct/direct",
       "h:1:2 [1] NCCL INFO NCCL_P2P_DISABLE set by environment to 1"]
NET = ["h:1:2 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] [send] via NET/Socket/0",
       "h:1:2 [2] NCCL INFO Channel 00/0 : 1[1] -> 2[2] [receive] via NET/Socket/0",
       "h:1:2 [2] NCCL INFO Using network Socket"]


def test_each_regime_is_its_nccl_environment_and_the_schema_names_the_same_regimes():
    assert tuple(lr.REGIMES) == LINK_REGIMES
    assert lr.regime_env("default") == {lr.REGIME_VAR: "default"}
    assert lr.regime_env("p2p_off")["NCCL_P2P_DISABLE"] == "1"
    assert {k: v for k, v in lr.regime_env("sockets").items() if k.startswith("NCCL_")} == {
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    assert lr.regime_env("few_channels")["NCCL_MAX_NCHANNELS"] == "2"
    with pytest.raises(ConfigError) as e:
        lr.regime_env("pcie")
    assert str(e.value) == "invalid config: link_regime='pcie': valid: default, p2p_off, sockets, few_channels"


def test_a_bad_regime_name_is_refused_by_validation_and_by_the_probe_in_one_line():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["link_regime=nvlinks", "device=cpu"])
    with pytest.raises(ConfigError) as e:
        validate(cfg, gpus=0)
    assert (e.value.key, e.value.value) == ("link_regime", "nvlinks") and "p2p_off" in e.value.valid
    p = subprocess.run([sys.executable, "-m", "bench.probe", "--regime", "nvlinks"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "invalid probe option: --regime='nvlinks': valid: default, p2p_off, sockets, few_channels"]


def test_the_transports_nccl_logged_name_the_link_it_used():
    assert lr.parse_transports(P2P) == {"p2p/CUMEM": 2}
    assert lr.parse_transports(SHM) == {"shm": 1}
    assert lr.parse_transports(NET) == {"net/Socket": 2}
    assert lr.link_of({"p2p/CUMEM": 2}, nvlink_active=True) == "nvlink"
    assert lr.link_of({"p2p/CUMEM": 2}, nvlink_active=False) == "pcie"
    assert lr.link_of({"p2p/CUMEM": 2, "shm": 1}, True) == "shm"  # the slowest connection bounds a ring
    assert lr.link_of({"net/Socket": 2}, None) == "socket" and lr.link_of({"net/IB": 1}, None) == "ib"
    assert lr.link_of({}, True) is None


def test_the_record_reads_every_ranks_log_and_the_nccl_variables(tmp_path, monkeypatch):
    for rank, lines in enumerate((SHM, SHM[:1], ["h:1:2 [3] NCCL INFO Bootstrap : Using eth0"])):
        (tmp_path / f"nccl_rank{rank}.log").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "nccl_rank0.log"))
    monkeypatch.setenv(lr.REGIME_VAR, "p2p_off")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    rec = lr.record(lr.log_files(), "nccl", nvlink_active=True)
    assert rec["regime"] == "p2p_off" and rec["settings"]["NCCL_P2P_DISABLE"] == "1"
    assert rec["transports"] == {"shm": 2} and rec["link"] == "shm" and rec["nccl_logs"] == 3
    assert lr.record([], "gloo")["transports_note"] == "backend gloo: no NCCL"
    assert "no NCCL log read" in lr.record([tmp_path / "missing.log"], "nccl")["transports_note"]


def test_the_debug_log_is_left_to_a_user_who_set_nccl_debug(tmp_path, monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    assert lr.debug_env(str(tmp_path), 3)["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl_rank3.log")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    assert lr.debug_env(str(tmp_path), 3) == {}


@pytest.mark.slow
def test_a_run_records_its_regime_and_nccl_settings(tmp_path):
    p = run_bench("link_regime=p2p_off", *CPU_FAST[:-2], "steps=2",
                  "warmup_steps=1", run_dir=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    nccl = m["provenance"]["nccl"]
    assert m["config"]["link_regime"] == "p2p_off" and nccl["regime"] == "p2p_off"
    assert nccl["settings"]["NCCL_P2P_DISABLE"] == "1"
    assert nccl["transports"] is None and nccl["transports_note"] == "backend gloo: no NCCL"


def test_a_regime_is_refused_for_a_slurm_job_whose_ranks_would_not_get_it():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["link_regime=sockets", "submit=slurm", "hardware=h100_sxm_80gb",
                                           "strategy=ddp", "world_size=2"])
    with pytest.raises(ConfigError) as e:
        validate(cfg, gpus=0)
    assert (e.value.key, e.value.value) == ("link_regime", "sockets") and "SLURM" in e.value.valid
