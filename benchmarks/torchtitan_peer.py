"""torchtitan as a same-machine peer: its Llama-3 8B recipe on the GPUs bench just ran on, its numbers as it logs them.

    python benchmarks/torchtitan_peer.py OUT_DIR [--gpus 4] [--layers 32] [--batch 4] [--seq 2048] [--steps 10]
        [--warmup 3] [--ac full|selective|none] [--no-compile] [--float8 rowwise] [--reshard default|always|never]

Issue 52 asks for bench's Llama-3 8B against torchtitan in the same call.  This runs torchtitan 0.3.0 (PyPI, pinned:
PEER) with ``torchrun`` on OUT_DIR's synthetic assets and writes ``OUT_DIR/peer.json``: the settings, what had to
change for the torch at hand (``bridges``), and per step torchtitan's own log line (loss, tokens/s per GPU, TFLOP/s,
MFU, reserved GiB); the summary is the median over the steps after ``--warmup``.

What is torchtitan's and what is not:
- its trainer, model (``model_registry("8B")``, the first ``--layers`` blocks), FSDP2, compile, activation checkpointing
  and float8 converter, as its ``llama3_8b`` config sets them;
- data: a tokenizer and a dataset written here (it needs both on disk; the machines have no internet): a word-level
  vocabulary of 32,000 words and documents of uniformly drawn words, each longer than ``--seq`` so that its
  block-causal attention (the only kind 0.3.0 offers a language model) masks as a plain causal one;
- its ``tps`` is per GPU, rank 0's tokens over the wall time since the last log (data loading and optimizer included);
  its FLOPs per token count attention as dense (s x s): compare tokens/s, not its MFU with bench's.

Changes for an older torch (0.3.0 was built against torch 2.14; the GPU image has 2.11), each applied only where the
torch at hand lacks what torchtitan calls (``bridges``): ``torch.distributed.fsdp.DataParallelMeshDims`` (named in
type hints of models not run here) a placeholder; ``torch.distributed.set_timeout`` the older
``distributed_c10d._set_pg_timeout``; ``create_block_mask``'s ``separate_full_blocks=True`` dropped (older torch
behaves so).  Settings (``peer``): ``parallelism.spmd_backend=partial_dtensor``; a plain ``CrossEntropyLoss`` in place
of its chunked-loss wrapper (on torch 2.11 the wrapper frees the ``[norm, lm_head]`` FSDP group before the decoder's
backward); CUDA graphs off (2.11 fails the graph's input check at step 2); profiling, checkpoints, validation and
TensorBoard off.  ``bridges`` in peer.json lists the changes a call applied.

Wheels: torchtitan and its pure-Python dependencies the GPU image lacks, in ``.whl/peer/`` (benchmarks/README.md): the
call installs them into ``--site`` (default /tmp/peer_site), apart from bench's, and puts it first on the ranks' path.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

from bench.metrics.provenance import package_version

PEER = "torchtitan==0.3.0"
VOCAB_WORDS = 32_000
ARGS_ENV = "BENCH_PEER_ARGS"
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([\d.]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)\s+"
                       r"tflops:\s*([\d,.]+)\s+mfu:\s*([\d.]+)%")


# ----------------------------------------------------------------------------- on each rank, before torchtitan
def bridges() -> list[str]:
    """Give an older torch what torchtitan 0.3.0 calls (module docstring); returns what was applied."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp
    import torch.nn.attention.flex_attention as flex

    applied = []
    if not hasattr(fsdp, "DataParallelMeshDims"):
        @dataclasses.dataclass
        class DataParallelMeshDims:  # noqa: D401 - a name for type hints only
            """Placeholder: torchtitan names it in type hints of models not run here."""

        fsdp.DataParallelMeshDims = DataParallelMeshDims
        applied.append("torch.distributed.fsdp.DataParallelMeshDims: a placeholder")
    if not hasattr(dist, "set_timeout"):
        from torch.distributed.distributed_c10d import _set_pg_timeout

        dist.set_timeout = lambda timeout, group=None: _set_pg_timeout(timeout, group)
        applied.append("torch.distributed.set_timeout: distributed_c10d._set_pg_timeout")
    if "separate_full_blocks" not in inspect.signature(flex.create_block_mask).parameters:
        original = flex.create_block_mask

        @functools.wraps(original)
        def create_block_mask(*args, separate_full_blocks=True, **kwargs):
            return original(*args, **kwargs)

        flex.create_block_mask = create_block_mask
        applied.append("create_block_mask(separate_full_blocks=True): dropped")
    return applied


def peer():
    """torchtitan's ``llama3_8b`` config with this call's settings (``--module benchmarks.torchtitan_peer --config
    peer``; the settings come from the JSON named by BENCH_PEER_ARGS)."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.components.validate import Validator
    from torchtitan.config import CompileConfig
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.models.llama3 import config_registry, model_registry
    from torchtitan.tools.profiler import Profiler

    a = json.loads(Path(os.environ[ARGS_ENV]).read_text())
    converters = ([Float8LinearConverter.Config(recipe_name=a["float8"], filter_fqns=["lm_head"],
                                                model_compile_enabled=a["compile"])] if a["float8"] else None)
    spec = model_registry("8B", converters=converters)
    spec.model.layers = spec.model.layers[:a["layers"]]
    cfg = config_registry.llama3_8b()
    cfg.model_spec = spec
    cfg.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))
    cfg.hf_assets_path = str(Path(a["assets"]) / "tokenizer")
    cfg.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(Path(a["assets"]) / "data"))
    cfg.dump_folder = str(Path(a["out"]) / "torchtitan")
    t = cfg.training
    t.local_batch_size, t.seq_len, t.steps, t.disable_cuda_graphs = a["batch"], a["seq"], a["steps"], True
    cfg.metrics = MetricsProcessor.Config(log_freq=1, enable_tensorboard=False, disable_color_printing=True)
    cfg.profiler = Profiler.Config(enable_profiling=False)
    cfg.checkpoint = CheckpointManager.Config(enable=False)
    cfg.validator = Validator.Config(enable=False)
    cfg.activation_checkpoint = {"full": FullAC.Config(), "selective": SelectiveAC.Config(), "none": None}[a["ac"]]
    cfg.compile = CompileConfig(enable=a["compile"], components=["model", "loss"])
    cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.parallelism.fsdp_reshard_after_forward = a["reshard"]
    return cfg


def rank_main() -> None:
    """A rank: bridges first, then torchtitan's own entry point on this module's config."""
    applied = bridges()
    if int(os.environ.get("RANK", "0")) == 0:
        print("bench-peer bridges: " + json.dumps(applied), flush=True)
    from torchtitan.train import main

    sys.argv = [sys.argv[0], "--module", "benchmarks.torchtitan_peer", "--config", "peer"]
    main()


# ----------------------------------------------------------------------------- the call
def write_assets(root: Path, seq: int, tokens_needed: int, seed: int = 0) -> None:
    """A word-level tokenizer (w0 .. w31999 and Llama-3's two document markers) and documents of uniform words, each
    longer than a sequence, enough of them for every rank's steps."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok_dir, data_dir = root / "tokenizer", root / "data"
    tok_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    vocab = {w: i for i, w in enumerate([f"w{i}" for i in range(VOCAB_WORDS)] + specials)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": specials[0], "eos_token": specials[1], "add_bos_token": True, "add_eos_token": True}))
    rng, words, docs = random.Random(seed), 4 * seq, -(-tokens_needed // (4 * seq)) + 1
    with open(data_dir / "train.jsonl", "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": " ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(words))}) + "\n")


def summary(steps: list[dict], warmup: int) -> dict:
    timed = [s for s in steps if s["step"] > warmup]
    if not timed:
        return {}
    med = lambda k: statistics.median(s[k] for s in timed)  # noqa: E731
    return {"timed_steps": len(timed), "tokens_per_s_per_gpu": med("tps"), "tflops_per_gpu": med("tflops"),
            "mfu_percent_torchtitan": med("mfu"), "max_reserved_gib": max(s["reserved_gib"] for s in timed),
            "loss_last": steps[-1]["loss"]}


def parse_steps(log: str) -> list[dict]:
    out = []
    for m in STEP_LINE.finditer(log):
        out.append({"step": int(m.group(1)), "loss": float(m.group(2)), "reserved_gib": float(m.group(3)),
                    "tps": float(m.group(4).replace(",", "")), "tflops": float(m.group(5).replace(",", "")),
                    "mfu": float(m.group(6))})
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", type=int, default=4, help="sequences per GPU a step")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the summary")
    p.add_argument("--ac", choices=("full", "selective", "none"), default="full")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--float8", choices=("rowwise", "rowwise_with_gw_hp"), default=None)
    p.add_argument("--reshard", choices=("default", "always", "never"), default="default")
    p.add_argument("--timeout-s", type=int, default=540)
    p.add_argument("--wheels", type=Path, default=Path(".whl/peer"), help="torchtitan's wheels (installed if there)")
    p.add_argument("--site", type=Path, default=Path("/tmp/peer_site"))
    a = p.parse_args(argv)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(a).items() if k not in ("out", "timeout_s", "wheels", "site")}
    path = install(a.wheels, a.site)
    write_assets(out / "assets", a.seq, a.gpus * a.batch * a.seq * (a.steps + 2))
    args_file = out / "peer_args.json"
    args_file.write_text(json.dumps({**settings, "out": str(out), "assets": str(out / "assets")}))
    cmd = ["torchrun", "--standalone", f"--nproc_per_node={a.gpus}", "-m", "benchmarks.torchtitan_peer", "--rank"]
    env = {**os.environ, ARGS_ENV: str(args_file), "PYTHONPATH": os.pathsep.join(
        [*path, os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout_s)
        log, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        log, rc = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after {a.timeout_s} s)", 124
    (out / "peer.log").write_text(log)
    applied = re.search(r"bench-peer bridges: (\[.*\])", log)
    steps = parse_steps(log)
    record = {"peer": PEER, "settings": settings, "command": " ".join(["python", "benchmarks/torchtitan_peer.py",
                                                                      *argv]),
              "returncode": rc, "bridges": json.loads(applied.group(1)) if applied else None,
              "steps": steps, "summary": summary(steps, a.warmup)}
    import torch

    record["versions"] = {"torch": torch.__version__, "torchtitan": package_version("torchtitan"),
                          "torchao": package_version("torchao")}
    (out / "peer.json").write_text(json.dumps(record, indent=1))
    s = record["summary"]
    print(f"torchtitan {settings}: rc {rc}, " + (f"{s['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU over "
                                                  f"{s['timed_steps']} steps, {s['max_reserved_gib']:.1f} GiB reserved"
                                                  if s else "no timed step logged (peer.log)"))
    return 0 if rc == 0 and s else 1


def install(wheels: Path, site: Path) -> list[str]:
    """torchtitan's wheels into ``site`` (when ``wheels`` has any); the path entries the ranks need first."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        return []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--upgrade", "--target", str(site), *map(str, found)], check=True)
    sys.path.insert(0, str(site))
    return [str(site)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_main()
    else:
        sys.exit(main(sys.argv[1:]))
