"""``strategy.adam`` for ZeRO: torch's AdamW (auto; fused on CUDA, the torch-native strategies' optimizer, nothing
to JIT-build) but DeepSpeed's FusedAdam inside DeepSpeed's own fp16 at stage 0, or either as named, refused where
DeepSpeed's own fp16 at stage 0 would wrap it in its unfused fp16 optimizer with a strategy.fp16.initial_scale_power
that one ignores.
The rules are checked here; the runs on a GPU (both optimizers keep single's losses; the record names the one
that ran) in the marked test below."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import ConfigError, register_configs, validate
from bench.strategies.zero_rules import adam_of
from tests.conftest import REPO, loss_curve, metrics_of


def plan_of(*overrides: str, gpus: int = 0):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=["strategy=zero", *overrides]), gpus=gpus)


CUDA = ("device=cuda",)


@pytest.mark.parametrize("overrides,says", [
    (("device=cpu", "strategy.adam=deepspeed"), "CUDA op"),
    ((*CUDA, "strategy.zero_stage=1", "strategy.offload_optimizer=cpu", "strategy.adam=deepspeed"), "DeepSpeedCPUAdam"),
    # torch's AdamW named beside offload would not run either: the record would name what did not run
    ((*CUDA, "strategy.zero_stage=1", "strategy.offload_optimizer=cpu", "strategy.adam=torch"), "DeepSpeedCPUAdam"),
    (("device=cpu", "strategy.zero_stage=2", "strategy.offload_optimizer=cpu", "strategy.adam=torch"), "DeepSpeedCPUAdam"),
    ((*CUDA, "precision=fp16", "strategy.adam=torch", "strategy.fp16.initial_scale_power=8"), "initial_scale_power"),
    ((*CUDA, "strategy.adam=lamb"), "deepspeed"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_adam_that_cannot_apply_is_refused_naming_the_key(overrides, says):
    with pytest.raises(ConfigError) as e:
        plan_of(*overrides, gpus=1)
    assert e.value.key == "strategy.adam" and says in str(e.value)


@pytest.mark.parametrize("overrides,adam", [
    ((*CUDA, "precision=bf16"), "torch"),  # auto
    ((*CUDA, "precision=fp16"), "deepspeed"),  # stage 0: DeepSpeed's fused FP16_Optimizer takes FusedAdam only
    ((*CUDA, "precision=fp16", "strategy.zero_stage=1"), "torch"),  # ZeRO's optimizer wraps any
    ((*CUDA, "precision=fp16", "strategy.autocast=true"), "torch"),  # torch_autocast: no fp16 wrapper
    (("device=cpu",), "torch"),
    ((*CUDA, "precision=bf16", "strategy.adam=torch"), "torch"),
    ((*CUDA, "precision=fp16", "strategy.adam=torch"), "torch"),  # at the default initial scale: allowed
    (("device=cpu", "strategy.adam=torch"), "torch"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_auto_is_torch_but_where_fp16_wraps_fusedadam(overrides, adam):
    assert adam_of(plan_of(*overrides, gpus=1)) == adam


@pytest.mark.gpu
def test_zero_with_either_adam_follows_single(bench_run):
    """torch's fused AdamW and DeepSpeed's FusedAdam under ZeRO-1 (autocast: single's recipe) both keep single's
    losses, and the record names the optimizer that ran; DeepSpeed's own fp16 at stage 0 gets FusedAdam inside its
    fused FP16_Optimizer."""
    a = ["device=cuda", "precision=bf16", "model=10m", "steps=8", "warmup_steps=2", "metrics.measure_matmul_peak=false"]
    p, d = bench_run(*a)
    assert p.returncode == 0, p.stderr[-2000:]
    names = {"torch": "torch.optim.AdamW(fused=True)", "deepspeed": "deepspeed.ops.adam.FusedAdam(adam_w_mode=True)"}
    for adam, name in names.items():
        pz, dz = bench_run(*a, "strategy=zero", "strategy.zero_stage=1", "strategy.autocast=true",
                           f"strategy.adam={adam}")
        assert pz.returncode == 0, pz.stderr[-2000:]
        assert metrics_of(dz)["layout"]["optimizer"] == name
        assert max(abs(x - y) for x, y in zip(loss_curve(d), loss_curve(dz))) < 2e-3, adam
    pf, df = bench_run(*[x for x in a if not x.startswith("precision=")], "precision=fp16", "strategy=zero")
    assert pf.returncode == 0, pf.stderr[-2000:]
    lay = metrics_of(df)["layout"]
    assert (lay["optimizer"], lay["optimizer_wrapper"]) == (names["deepspeed"], "FP16_Optimizer")
