"""One device, plain PyTorch: the baseline.  Also the base of the data-parallel
strategies that keep torch's own optimizer loop (DDP)."""
from __future__ import annotations

import contextlib

import torch

from bench.data import SyntheticStream
from bench.model import build_model, lm_loss
from bench.strategies.base import Precision, StepResult, Strategy, compile_kwargs, register


@register("single")
class Single(Strategy):
    dp_rank = 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Data-parallel subclasses wrap the model here; compile comes after wrapping."""
        return model

    def no_sync(self, last_micro_batch: bool):
        return contextlib.nullcontext()

    def setup(self) -> None:
        p, dev = self.plan, self.dist.device
        cfg = p.cfg
        self.precision = Precision(cfg["precision"], dev)
        with self.setup_phase("bench model"):
            self.raw_model = build_model(p.model, cfg["seed"], dev)
        with self.setup_phase("wrap"):
            self.model = self.wrap(self.raw_model)
        if cfg["compile"]:
            self.model = torch.compile(self.model, **compile_kwargs(cfg))  # lazy: compiles in the first (warm-up) steps
        o = cfg["optim"]
        self.fused = dev.type == "cuda"
        with self.setup_phase("optimizer"):
            self.optimizer = torch.optim.AdamW(
                self.raw_model.parameters(), lr=o["lr"], betas=(o["beta1"], o["beta2"]),
                weight_decay=o["weight_decay"], fused=self.fused)
        self.stream = SyntheticStream(p.model, seed=cfg["seed"], steps=cfg["steps"],
                                      dp_rank=self.dp_rank, dp_size=p.dp_size, device=dev)

    def step(self, n: int) -> StepResult:
        self.optimizer.zero_grad(set_to_none=True)
        micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
        total = torch.zeros((), device=self.dist.device)
        for i, (x, y) in enumerate(micro):
            with self.no_sync(i == len(micro) - 1):
                with self.precision.autocast():
                    loss = lm_loss(self.model(x), y) / len(micro)
                self.precision.backward(loss)
            total += loss.detach()
        skipped = self.precision.step(self.optimizer, self.raw_model.parameters(),
                                      self.plan.cfg["optim"]["grad_clip"])
        return StepResult(loss=total, skipped=skipped)

    def describe(self) -> dict:
        return {
            "optimizer": f"torch.optim.AdamW(fused={self.fused})",
            "precision": {"fp32": "fp32", "bf16": "autocast bf16 over fp32 weights",
                          "fp16": "autocast fp16 over fp32 weights + GradScaler"}[self.plan.cfg["precision"]],
            "compile": bool(self.plan.cfg["compile"]),
            "micro_batch_size": self.plan.micro_batch_size,
            "grad_accum": self.plan.grad_accum,
        }
