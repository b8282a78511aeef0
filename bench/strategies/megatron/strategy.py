"""megatron-core tp x pp x dp (GPU only): the Megatron-LM training step without Megatron-LM.

setup, in Megatron-LM's order:
  parallel_state.initialize_model_parallel(tp, pp, virtual, order tp-cp-ep-dp-pp)
  -> GPTModel chunks with bench's dims (bench/strategies/megatron/model.py), .cuda()
  -> bench's initial weights copied in (strategy.init=bench; = strategy=single's weights)
  -> Float16Module (bf16/fp16) -> megatron DistributedDataParallel per chunk
  -> get_megatron_optimizer (Adam(W) over fp32 master weights for bf16/fp16)
  -> config hooks: finalize_model_grads, grad_scale_func, no_sync / grad_sync (overlap).
step: zero_grad_buffer + zero_grad -> get_forward_backward_func()(no pipelining | 1F1B |
interleaved 1F1B) over this data-parallel rank's micro-batches -> optimizer.step().
strategy.cuda_graph: that forward-backward call (micro-batches, pipeline sends/receives, gradient
all-reduce) is megatron.core's FullCudaGraphWrapper: captured once in warm-up, then replayed, so
the host launches one graph per step instead of thousands of kernels; the optimizer stays eager.

The data: every rank holds its data-parallel slice of the same global batches as every other
strategy (SyntheticStream with dp_rank from the layout); the first stage reads the tokens,
the last the labels.  Loss: the mean over micro-batches of the per-token loss on the last
stage (a clone: the schedule divides the loss in place); reported, with the tokens, only by
tp_rank 0 of the last stage (bench/spec/layout.py).
"""
from __future__ import annotations

import logging
import math
import os

import torch

from bench.spec.layout import TOKEN_RULE
from bench.models.model import DTYPES, build_model
from bench.spec.layout_rules import microbatches_setting
from bench.spec.schema import CUDA_GRAPH_CAPTURE_STEP, BenchConfig
from bench.strategies.base import StepResult, Strategy
from bench.strategies.model_parallel import ModelParallelConfig

log = logging.getLogger("bench.megatron")

SPEC_TEXT = {
    "sdpa": "Megatron local spec, core attention = torch scaled_dot_product_attention, torch LayerNorm / RMSNorm",
    "local": "Megatron local spec (DotProductAttention, unfused softmax), torch LayerNorm / RMSNorm",
    "te": "Megatron Transformer Engine spec",
}


def _use_fused_torch_adam(optimizer) -> bool:
    """Switch megatron-core's fallback torch Adam(W) (no TE/Apex: foreach mode) to torch's fused
    kernel: the same update in a few launches instead of a chain of foreach ops (on 300m, one H200:
    about 17 ms vs 3 ms per step with megatron-core 0.16.1).  torch reads group["fused"] at every step."""
    fused = False
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(o, "optimizer", None)
        if isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            for g in inner.param_groups:
                g["fused"], g["foreach"] = True, False
            fused = True
    return fused


def cfg_recompute(tcfg) -> str:
    """What Megatron was asked to recompute (its TransformerConfig)."""
    g = tcfg.recompute_granularity
    return "none" if g is None else f"{g}" + (f" ({tcfg.recompute_method}, {tcfg.recompute_num_layers} layer(s) "
                                              "per checkpoint)" if g == "full" else f" ({tcfg.recompute_modules})")


def _max_connections_source(tp: int):
    """Megatron's TP (and SP) communication relies on CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware
    queue: kernels start in issue order).  The driver reads it when the CUDA context is created, so
    it must be in the environment before the first CUDA call of the process.  The worker calls
    torch.cuda.set_device() before building the strategy, so setting it here is best effort; the
    worker should set it (see strategy notes).  Returns where the setting came from (None: tp = 1)."""
    if tp <= 1:
        return None
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        return "environment (set before CUDA init)"
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    log.warning("CUDA_DEVICE_MAX_CONNECTIONS=1 set after CUDA initialisation; export "
                "CUDA_DEVICE_MAX_CONNECTIONS=1 before launching for Megatron TP runs")
    return ("set by the strategy after torch.cuda.set_device: may not "
            "apply to this process's CUDA context; export it before launch")


def _import_megatron_core() -> None:
    """Import what setup uses (timed as its own setup phase; the steps then find it imported)."""
    from megatron.core import parallel_state  # noqa: F401
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: F401
    from megatron.core.distributed import finalize_model_grads  # noqa: F401
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: F401
    from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: F401
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed  # noqa: F401
    from megatron.core.transformer.module import Float16Module  # noqa: F401

    from bench.strategies.megatron import model as mm  # noqa: F401


def _ddp_config(s: ModelParallelConfig):
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=s.grad_reduce_in_fp32, overlap_grad_reduce=s.overlap_grad_reduce,
        use_distributed_optimizer=s.use_distributed_optimizer,
        overlap_param_gather=s.overlap_param_gather, bucket_size=s.bucket_size)


def _wrap_ddp(chunks: list, tcfg, ddp_config, cuda_graph: bool, phase) -> list:
    """megatron DistributedDataParallel per chunk (built inside the setup phase ``phase``)."""
    from megatron.core.distributed import DistributedDataParallel

    # buckets only on the first chunk (Megatron-LM: later chunks' reduction is off the critical path).
    # DDP takes each parameter's gradient accumulator here, and autograd runs it on the stream that
    # was current then: for a captured backward that must not be the legacy default stream (as for
    # torch DDP: "construct DDP in a side-stream context", torch CUDA graphs notes)
    side = torch.cuda.Stream() if cuda_graph else torch.cuda.current_stream()
    side.wait_stream(torch.cuda.current_stream())
    with phase, torch.cuda.stream(side):
        model = [DistributedDataParallel(config=tcfg, ddp_config=ddp_config, module=ch,
                                         disable_bucketing=i > 0) for i, ch in enumerate(chunks)]
    torch.cuda.current_stream().wait_stream(side)
    return model


def _optimizer_config(run: BenchConfig, s: ModelParallelConfig):
    from megatron.core.optimizer import OptimizerConfig

    o = run.optim
    return OptimizerConfig(
        optimizer="adam", lr=o.lr, weight_decay=o.weight_decay, adam_beta1=o.beta1,
        adam_beta2=o.beta2, adam_eps=1e-8, clip_grad=o.grad_clip,
        bf16=run.precision == "bf16", fp16=run.precision == "fp16",
        # torch's GradScaler starts at 2**16; from Megatron's default 2**32 the scale halves on
        # each overflow, so the first ~16 steps can be skipped: a short run's whole timed window
        initial_loss_scale=2.0 ** 16,
        params_dtype=DTYPES[run.precision], use_distributed_optimizer=s.use_distributed_optimizer,
        overlap_param_gather=s.overlap_param_gather,
    )


def _reset_full_cuda_graph() -> None:
    """A graph that holds NCCL work must be reset before its communicators go (pytorch#115388)."""
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

    log.info("teardown: resetting the CUDA graph")
    torch.cuda.synchronize()
    W = FullCudaGraphWrapper
    for stage, graph in W.cuda_graph.items():
        if graph is not None:
            graph.reset()
        W.cuda_graph[stage], W.result[stage], W.curr_iteration[stage] = None, None, 0
    StaticBufferLoader.static_buffers = {"training": [], "validation": []}


def _after_failed_capture(stream, n: int) -> None:
    """An error inside the capture (out of memory: torch then raises AcceleratorError from capture_end,
    before torch.cuda.graph makes the step's stream current again) leaves the capture's stream current:
    restore it, so nothing after the failure runs on that stream, and leave the half-made graph alone
    (never reset or replayed: the rank records the error and ends, bench/launch/worker.py)."""
    if torch.cuda.current_stream() != stream:
        log.error("step %d: the CUDA graph capture failed (strategy.cuda_graph); this rank ends", n)
        torch.cuda.set_stream(stream)


def _optimizer_text(optimizer, fused_adam: bool) -> str:
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return (f"{type(optimizer).__name__}[{', '.join(type(o).__name__ for o in inner)}] "
            f"over {type(getattr(inner[0], 'optimizer', None)).__name__}"
            + (" (torch fused kernel)" if fused_adam else ""))


def _megatron_optimizer(run, s, model):
    """Megatron's optimizer over the model chunks, without gloo groups: they serve only its distributed optimizer's
    checkpoints (the state dict gathered over gloo), and bench saves none (on 1 x H100 their six pt_gloo_runloop
    threads outlived the release of the process groups, and the rank ended with os._exit)."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(_optimizer_config(run, s), model, use_gloo_process_groups=False)


class MegatronModelParallel(Strategy):
    """Not registered itself: strategies megatron / tp / pp with impl=megatron."""

    name = "megatron"

    def __init__(self, plan, dist):
        super().__init__(plan, dist)
        self.max_connections_source = _max_connections_source(plan.tp)

    def setup(self) -> None:
        if self.dist.device.type != "cuda":
            raise RuntimeError("megatron-core needs CUDA; use strategy.impl=torch")
        with self.setup_phase("import megatron.core"):
            _import_megatron_core()
        self._init_parallel_state()
        chunks = self._build_chunks()
        self.ddp_config = _ddp_config(self.plan.strategy)
        self.model = _wrap_ddp(chunks, self.tcfg, self.ddp_config, self.plan.strategy.cuda_graph,
                               self.setup_phase("DistributedDataParallel"))
        self._build_optimizer()
        self._install_train_hooks()
        seq = self.plan.model.seq_len
        self.position_ids = (torch.arange(seq, device=self.dist.device).unsqueeze(0)
                             .expand(self.plan.micro_batch_size, seq))
        self.stream = self.data_stream(self.coord.dp)

    def _init_parallel_state(self) -> None:
        """parallel_state's groups; checks that Megatron's coordinates are bench.spec.layout's."""
        from megatron.core import parallel_state as ps

        p = self.plan
        self.layout = p.layout
        c = self.coord = self.layout.coords(self.dist.rank)
        v = p.layout.virtual_pipeline
        with self.setup_phase("parallel groups"):
            ps.initialize_model_parallel(
                tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
                virtual_pipeline_model_parallel_size=v if v > 1 else None,
                distributed_timeout_minutes=max(1, math.ceil(p.run.dist_timeout_s / 60)),
                create_gloo_process_groups=False)  # see _megatron_optimizer
        got = (ps.get_data_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank())
        if got != (c.dp, c.pp, c.tp):
            raise RuntimeError(f"rank {self.dist.rank}: Megatron's (dp, pp, tp) = {got} != bench.spec.layout's {c}")

    def _seed_and_bench_model(self):
        """bench's model (strategy.init=bench; else None), then Megatron-LM's seeding."""
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        s, run, c = self.plan.strategy, self.plan.run, self.coord
        self.init = s.init
        with self.setup_phase("bench model (initial weights)"):
            bench = build_model(self.plan.model, run.seed, self.dist.device) if self.init == "bench" else None
        # Megatron-LM's seeding: a different default seed per pipeline stage, TP-rank offsets
        # inside the RNG tracker (used by TP-sharded init and dropout).  A CUDA graph registers the
        # tracker's states, which must then be graph-safe generators.
        torch.manual_seed(run.seed + 100 * c.pp)
        model_parallel_cuda_manual_seed(run.seed + 100 * c.pp, use_cudagraphable_rng=s.cuda_graph,
                                        force_reset_rng=True)
        return bench

    def _build_chunks(self) -> list:
        """The GPTModel chunks on this GPU, bench's weights copied in, Float16Module-wrapped (bf16/fp16).
        (bench's model is referenced only here: the ``del`` below frees it before DDP and the optimizer.)"""
        from megatron.core.transformer.module import Float16Module

        from bench.strategies.megatron import model as mm

        bench = self._seed_and_bench_model()
        p, s, run, c = self.plan, self.plan.strategy, self.plan.run, self.coord
        self.spec = mm.resolve_spec(s.spec)
        self.tcfg = tcfg = mm.transformer_config(
            p.model, tp=p.tp, pp=p.pp, virtual_pipeline=p.layout.virtual_pipeline,
            sequence_parallel=s.sequence_parallel,
            precision=run.precision, perform_initialization=bench is None,
            batch_p2p_sync=s.batch_p2p_sync and not s.cuda_graph, recompute=p.layout.recompute)
        with self.setup_phase("GPTModel build"):
            chunks = mm.build_chunks(tcfg, p.model, self.spec)
            for ch in chunks:
                ch.cuda(torch.cuda.current_device())  # torch LayerNorms / position embedding may be built on CPU
        if bench is not None:
            with self.setup_phase("copy bench weights"):
                for ch in chunks:
                    mm.load_bench_weights(ch, bench, p.model.n_heads, c.tp, p.tp)
                del bench
                torch.cuda.empty_cache()
        if run.precision in ("bf16", "fp16"):
            chunks = [Float16Module(tcfg, ch) for ch in chunks]
        return chunks

    def _build_optimizer(self) -> None:
        s = self.plan.strategy
        with self.setup_phase("optimizer"):
            self.optimizer = _megatron_optimizer(self.plan.run, s, self.model)
        self.fused_adam = s.fused_adam and _use_fused_torch_adam(self.optimizer)

    def _install_train_hooks(self) -> None:
        """The hooks Megatron-LM's train() installs, and the forward-backward schedule."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.pipeline_parallel import get_forward_backward_func

        s, tcfg = self.plan.strategy, self.tcfg
        one = (lambda fs: fs[0] if len(fs) == 1 else fs)
        tcfg.grad_scale_func = self.optimizer.scale_loss
        tcfg.finalize_model_grads_func = finalize_model_grads
        if s.overlap_grad_reduce:
            tcfg.no_sync_func = one([m.no_sync for m in self.model])
            tcfg.grad_sync_func = one([m.start_grad_sync for m in self.model])  # align_grad_reduce
        self.forward_backward = get_forward_backward_func()
        self.schedule_name = self.forward_backward.__name__
        if s.cuda_graph:
            from megatron.core.full_cuda_graph import FullCudaGraphWrapper

            self.forward_backward = FullCudaGraphWrapper(self.forward_backward,
                                                         cuda_graph_warmup_steps=CUDA_GRAPH_CAPTURE_STEP)

    # ------------------------------------------------------------------ step
    def _forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        return model(batch["tokens"], self.position_ids, None, labels=batch["labels"]), self._loss_func

    @staticmethod
    def _loss_func(per_token_loss: torch.Tensor):
        loss = per_token_loss.float().mean()
        # the schedule divides the first value in place by the number of micro-batches: log a clone
        return loss, {"lm loss": loss.detach().clone()}

    def step(self, n: int) -> StepResult:
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        # dicts: the CUDA graph wrapper copies each micro-batch's dict into its static input buffers
        micro = [{"tokens": x, "labels": y} for x, y in self.stream.micro_batches(n, self.plan.micro_batch_size)]
        data = [iter(micro) for _ in self.model] if len(self.model) > 1 else iter(micro)
        if self.plan.strategy.cuda_graph:
            # the wrapper copies them into its input buffers on its own stream: after they are made,
            # and after the previous replay has read those buffers (megatron-core 0.16.1 omits this wait)
            self.forward_backward.static_loader.stream.wait_stream(torch.cuda.current_stream())
        stream = torch.cuda.current_stream()
        try:
            out = self.forward_backward(
                forward_step_func=self._forward_step, data_iterator=data, model=self.model,
                num_microbatches=len(micro), seq_length=self.plan.model.seq_len,
                micro_batch_size=self.plan.micro_batch_size, forward_only=False)
        except BaseException:
            if self.plan.strategy.cuda_graph:
                _after_failed_capture(stream, n)
            raise
        ok, _grad_norm, _ = self.optimizer.step()
        loss = None
        if self.layout.counts_tokens(self.coord):  # (a graph's outputs: copied here, before the next replay)
            loss = torch.stack([d["lm loss"] for d in out]).mean()
        return StepResult(loss=loss, skipped=not ok)

    def close(self) -> None:
        if self.plan.strategy.cuda_graph:
            _reset_full_cuda_graph()

    # ------------------------------------------------------------------ accounting
    def tokens_this_rank(self) -> int:
        m = self.plan.model
        return self.layout.tokens_this_rank(self.dist.rank, m.global_batch, m.seq_len)

    def describe(self) -> dict:
        from megatron.core.package_info import __version__

        p, s = self.plan, self.plan.strategy
        v = p.layout.virtual_pipeline
        return {
            "impl": "megatron", "megatron_core": __version__,
            "tp": p.tp, "pp": p.pp, "dp": p.dp_size,
            "rank_order": "rank = tp_rank + tp*dp_rank + tp*dp*pp_rank (initialize_model_parallel order tp-cp-ep-dp-pp)",
            "microbatches": p.grad_accum, "microbatches_setting": microbatches_setting(s),
            "micro_batch_size": p.micro_batch_size,
            "pipeline_schedule": self.schedule_name,
            "cuda_graph": (f"forward-backward captured at step {CUDA_GRAPH_CAPTURE_STEP} and replayed after "
                           "(megatron.core.full_cuda_graph.FullCudaGraphWrapper); optimizer eager"
                           if s.cuda_graph else None),
            "schedule_setting": p.layout.schedule,
            "virtual_pipeline": v, "layers_per_stage": p.model.n_layers // (p.pp * v),
            "sequence_parallel": s.sequence_parallel,
            "recompute": cfg_recompute(self.tcfg),
            "p2p": {"overlap_p2p_comm": self.tcfg.overlap_p2p_comm, "batch_p2p_comm": self.tcfg.batch_p2p_comm,
                    "batch_p2p_sync": self.tcfg.batch_p2p_sync},
            "layer_spec": SPEC_TEXT[self.spec],
            "init": {"bench": "bench's GPT init (same weights as strategy=single)",
                     "megatron": "Megatron's init (seed + 100 * pp_rank)"}[self.init],
            "ddp": {"overlap_grad_reduce": self.ddp_config.overlap_grad_reduce,
                    "use_distributed_optimizer": self.ddp_config.use_distributed_optimizer,
                    "overlap_param_gather": self.ddp_config.overlap_param_gather,
                    "bucket_size": self.ddp_config.bucket_size,  # after Megatron's defaults; null = one bucket
                    "grad_reduce_in_fp32": self.ddp_config.grad_reduce_in_fp32},
            "optimizer": _optimizer_text(self.optimizer, self.fused_adam),
            "precision": {"fp32": "fp32 (FP32Optimizer)",
                          "bf16": "Float16Module bf16 params, fp32 master weights in the optimizer",
                          "fp16": "Float16Module fp16 params, fp32 master weights, dynamic loss scale"}[p.run.precision],
            "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "cuda_device_max_connections_source": self.max_connections_source,
            "token_rule": TOKEN_RULE,
        }
