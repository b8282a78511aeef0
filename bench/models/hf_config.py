"""The model section as it will run, settled before validation: a Hugging Face config read in, and the sizes
that follow from a changed width derived.  bench.run.config.validate calls :func:`resolve_model` first, so the memory
plan, the prediction, the run and its record all read the one model dict this returns.

``model=hf model.hf_config=<config.json | a model folder | a Hub name in the local HF cache>``: the dense
decoders bench's model can build (Llama, Mistral, Qwen2, Gemma as arch=llama, GPT-2 as arch=gpt) become bench's
fields; what it cannot build (experts, a window shorter than the sequence, another head size) is refused in one
line naming the config field.  transformers' ``AutoConfig`` fills a config's defaults where it is installed
(``pip install -e .[hf]``); without it the JSON is read with the same defaults for the supported types.
No network: a Hub name is looked up only in ``$HF_HUB_CACHE`` (``$HF_HOME/hub``, ``~/.cache/huggingface/hub``).
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional

from bench.spec.schema import ConfigError

log = logging.getLogger(__name__)

DEFAULT_SEQ_LEN = 4096  # seq_len when not set: min(max_position_embeddings, this)
LLAMA_FFN_MULTIPLE = 256  # Llama's multiple_of: d_ff = 8/3 d rounded up to it
# model_type -> bench arch; the rest of a type's defaults where the JSON omits them (as transformers' classes)
TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "llama", "gpt2": "gpt"}
TIED_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "gemma": True, "gpt2": True}
# a config's activation -> model.mlp_act (gpt2's MLP is tanh-GELU, arch=gpt's own)
ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
EPS_DEFAULT = {"gpt2": 1e-5}  # the llama family: 1e-6
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# bench's field -> the names configs use for it (GPT-2's own names second)
ALIASES = {"d_model": ("hidden_size", "n_embd"), "n_layers": ("num_hidden_layers", "n_layer"),
           "n_heads": ("num_attention_heads", "n_head"), "d_ff": ("intermediate_size", "n_inner"),
           "max_positions": ("max_position_embeddings", "n_positions"),
           "norm_eps": ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps")}
FROM_CONFIG = ("name", "arch", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff", "vocab_size", "seq_len",
               "tie_embeddings", "rope_theta", "norm_eps", "qkv_bias", "mlp_act")
UNSET = "???"  # omegaconf's MISSING, as OmegaConf.to_container writes it
HOWTO = "docs/models.md: keep your own preset with --config-dir"
_logged: set[str] = set()


def _once(msg: str) -> None:
    """Log a note once per process (validate runs per sweep job and per tuning trial)."""
    if msg not in _logged:
        _logged.add(msg)
        log.info("%s", msg)


# --------------------------------------------------------------------------- finding and reading the file
def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def locate(spec: str) -> tuple[Path, str]:
    """(the config.json, how the run records it: the path, or org/name@snapshot for a Hub name)."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p, spec
    if (p / "config.json").is_file():
        return p / "config.json", str(Path(spec) / "config.json")
    if spec.count("/") == 1 and not p.exists():
        snaps = sorted((hub_cache() / f"models--{spec.replace('/', '--')}" / "snapshots").glob("*/config.json"),
                       key=lambda f: f.stat().st_mtime)
        if snaps:
            return snaps[-1], f"{spec}@{snaps[-1].parent.name}"
    raise ConfigError("model.hf_config", spec, f"no config.json there: give a config.json, a model folder holding "
                      f"one, or a Hub name downloaded into {hub_cache()} (bench does not download)")


def read(path: Path) -> dict[str, Any]:
    """The config as a dict, with transformers' defaults for its model_type where transformers is installed."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError("model.hf_config", str(path), f"cannot be read as JSON: {e}") from None
    try:
        from transformers import AutoConfig
    except ImportError:
        return raw
    kind = raw.get("model_type")
    if kind not in TYPES:
        return raw  # refused by convert, naming model_type
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return {**raw, **AutoConfig.for_model(kind, **fields).to_dict()}


# --------------------------------------------------------------------------- the config as bench's fields
def _get(hf: dict, field: str, default: Any = None) -> Any:
    for name in ALIASES.get(field, (field,)):
        if hf.get(name) is not None:
            return hf[name]
    return default


def _refuse(spec: str, field: str, value: Any, why: str) -> ConfigError:
    return ConfigError("model.hf_config", spec, f"{field}={value}: {why}")


def _check_buildable(hf: dict, spec: str, kind: str) -> None:
    """What bench's model would silently build differently: refused, naming the config field."""
    for key in MOE_KEYS:
        if (hf.get(key) or 0) > 1:
            raise _refuse(spec, key, hf[key], "a mixture-of-experts model (router and expert MLPs); bench builds "
                          "dense decoders only")
    if kind not in TYPES:
        raise _refuse(spec, "model_type", kind, f"bench builds the dense decoders {', '.join(TYPES)} "
                      "(docs/models.md)")
    for field in ("d_model", "n_layers", "n_heads", "vocab_size"):
        if not isinstance(_get(hf, field), int):
            raise _refuse(spec, ALIASES.get(field, (field,))[0], _get(hf, field), "missing or not a whole number")
    d, h = _get(hf, "d_model"), _get(hf, "n_heads")
    if hf.get("head_dim") not in (None, d // h):
        raise _refuse(spec, "head_dim", hf["head_dim"], f"bench's attention has hidden_size / num_attention_heads = "
                      f"{d // h} per head")
    act = _activation(hf, kind)
    if ACTS.get(act) is None or (kind == "gpt2" and ACTS[act] != "gelu_tanh"):
        raise _refuse(spec, "hidden_act", act, "bench's llama MLP gates with silu or tanh-GELU (model.mlp_act), its "
                      "gpt MLP is tanh-GELU")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise _refuse(spec, key, True, "biases on o_proj / the MLP: bench's llama has biases on q/k/v at most "
                          "(model.qkv_bias, Qwen2)")
    if (hf.get("partial_rotary_factor") or 1.0) != 1.0:
        raise _refuse(spec, "partial_rotary_factor", hf["partial_rotary_factor"], "bench rotates every head dim")


def _activation(hf: dict, kind: str) -> str:
    """The MLP's activation; Gemma's: hidden_activation, else tanh-GELU whatever hidden_act says (as transformers)."""
    if kind == "gemma":
        return hf.get("hidden_activation") or "gelu_pytorch_tanh"
    return hf.get("hidden_act") or hf.get("activation_function") or "silu"


def _rope_theta(hf: dict) -> float:
    """rope_theta, also where newer transformers keep it (rope_parameters)."""
    params = hf.get("rope_parameters") or {}
    return float(hf.get("rope_theta") or params.get("rope_theta") or 10000.0)


def convert(hf: dict, spec: str) -> dict[str, Any]:
    """bench's model fields from a config dict (seq_len: min(max_position_embeddings, DEFAULT_SEQ_LEN))."""
    kind = hf.get("model_type")
    _check_buildable(hf, spec, kind)
    d, h = _get(hf, "d_model"), _get(hf, "n_heads")
    kv = hf.get("num_key_value_heads") or h
    tied = hf.get("tie_word_embeddings")
    where = Path(spec.split("@")[0])
    return {
        "name": where.parent.name if where.name == "config.json" else where.stem if where.suffix == ".json"
        else where.name,
        "arch": TYPES[kind], "d_model": d, "n_heads": h, "n_layers": _get(hf, "n_layers"),
        "n_kv_heads": kv if TYPES[kind] == "llama" else None,
        "d_ff": _get(hf, "d_ff") or 4 * d, "vocab_size": hf["vocab_size"],
        "seq_len": min(_get(hf, "max_positions", DEFAULT_SEQ_LEN), DEFAULT_SEQ_LEN),
        "tie_embeddings": TIED_DEFAULT[kind] if tied is None else bool(tied),
        "rope_theta": _rope_theta(hf), "norm_eps": float(_get(hf, "norm_eps", EPS_DEFAULT.get(kind, 1e-6))),
        "qkv_bias": kind == "qwen2", "mlp_act": ACTS[_activation(hf, kind)] if TYPES[kind] == "llama" else "silu",
    }


def _window(hf: dict) -> Optional[int]:
    """The sliding attention window the config applies (Qwen2 keeps one that use_sliding_window turns off)."""
    if hf.get("use_sliding_window") is False:
        return None
    return hf.get("sliding_window")


def _schema_defaults() -> dict[str, Any]:
    """ModelConfig's defaults (UNSET where it has none)."""
    import dataclasses

    from bench.spec.schema import ModelConfig, fields_of

    return {k: UNSET if f.default is dataclasses.MISSING or f.default == UNSET else f.default
            for k, f in fields_of(ModelConfig).items()}


def from_hf(m: dict, explicit: Iterable[str] = ()) -> dict:
    """The model section with model.hf_config read in.  A field keeps its value where it was set: on the
    command line (``explicit``), or to other than the schema's default (hf.yaml leaves the sizes unset)."""
    spec = m.get("hf_config")
    default = _schema_defaults()
    required = [k for k in FROM_CONFIG if default[k] == UNSET]
    if m.get("hf_config_file"):  # already read in (a recorded run's config validated again)
        if any(m.get(k) == UNSET for k in required):
            raise ConfigError("model.hf_config_file", m["hf_config_file"], "is set by bench when it reads "
                              "model.hf_config; leave it unset")
        return m
    if spec is None:
        if any(m.get(k) == UNSET for k in required):
            raise ConfigError("model.hf_config", None, "model=hf needs model.hf_config=<config.json | a model folder "
                              "| a Hub name in the local HF cache>")
        return m
    if all(m.get(k) != UNSET for k in required):
        raise ConfigError("model.hf_config", spec, f"takes effect with model=hf; model={m.get('name')} already sets "
                          "every size (use model=hf model.hf_config=...)")
    path, recorded = locate(str(spec))
    hf = read(path)
    given = {k.split(".", 1)[1] for k in explicit if k.startswith("model.")}
    keep = {k for k in FROM_CONFIG if k in given or m.get(k, default[k]) != default[k]}
    out = {**m, **{k: v for k, v in convert(hf, recorded).items() if k not in keep}, "hf_config_file": recorded}
    window = _window(hf)
    if window and window < out["seq_len"]:
        raise _refuse(str(spec), "sliding_window", window, f"attention over the last {window} tokens only, shorter "
                      f"than model.seq_len={out['seq_len']}; bench attends to the whole sequence: use model.seq_len"
                      f"<={window}")
    if hf.get("model_type") == "gemma":
        _once(f"model.hf_config={spec}: Gemma's embedding scale (x sqrt(d_model)) and (1 + w) RMSNorm weights are not "
              "built (elementwise: the same FLOPs, memory and parameters); its GeGLU is (model.mlp_act=gelu_tanh)")
    if hf.get("rope_scaling") or (hf.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        _once(f"model.hf_config={spec}: its rope scaling is not applied (plain RoPE: the same FLOPs and memory)")
    return out


# --------------------------------------------------------------------------- sizes that follow the width
def ffn_size(arch: str, d_model: int) -> int:
    """The MLP width a width implies: 4 d (GPT-2), or Llama's 8/3 d rounded up to a multiple of 256."""
    if arch == "llama":
        return LLAMA_FFN_MULTIPLE * math.ceil(int(8 * d_model / 3) / LLAMA_FFN_MULTIPLE)
    return 4 * d_model


def derive_sizes(m: dict, explicit: Iterable[str]) -> dict:
    """A width set on the command line (model.d_model) without model.d_ff: d_ff follows the width by the arch's
    rule rather than staying the preset's, and the log says so (with the head size that results)."""
    given = {k.split(".", 1)[1] for k in explicit if k.startswith("model.")}
    if "d_model" not in given or "d_ff" in given:
        return m
    d, arch = m["d_model"], m.get("arch", "gpt")
    ff = ffn_size(arch, d)
    if ff == m["d_ff"]:
        return m
    rule = "8/3 x d_model rounded up to a multiple of 256, as Llama" if arch == "llama" else "4 x d_model"
    heads = "" if "n_heads" in given or not m["n_heads"] else (f"; model.n_heads stays {m['n_heads']} (heads of "
                                                              f"{d // m['n_heads']})")
    _once(f"model.d_model={d} without model.d_ff: derived model.d_ff={ff} ({rule}; model={m.get('name')} has "
          f"{m['d_ff']}){heads}; set model.d_ff to choose it, or {HOWTO}")
    return {**m, "d_ff": ff}


def resolve_model(m: dict, explicit: Iterable[str] = ()) -> dict:
    """The model section that will run: model.hf_config read in, then the d_ff a width set alone implies."""
    m = from_hf(m, explicit)
    if m.get("arch", "gpt") != "llama":
        if m.get("qkv_bias"):
            raise ConfigError("model.qkv_bias", True, "applies to model.arch=llama (arch=gpt has biases on every linear)")
        if m.get("mlp_act", "silu") != "silu":
            raise ConfigError("model.mlp_act", m["mlp_act"], "applies to model.arch=llama's gated MLP (arch=gpt's is "
                              "tanh-GELU); leave it silu")
    return derive_sizes(m, explicit)
