"""Model specs from files: a Hugging Face ``config.json``, or a JSON object of
:class:`~prefixlab.model.spec.ModelSpec` fields.

A Hugging Face config names its layers in one of several ways; each is read as the
models that use it publish it::

    layer_types                 ["sliding_attention", "full_attention", "linear_attention", ...]
    sliding_window_pattern      Gemma 3: every k-th layer global, the rest sliding
    full_attention_interval     Qwen3-Next: every k-th layer full attention, the rest linear
    hybrid_override_pattern     Nemotron-H: one character a layer, M Mamba-2, * attention,
                                - MLP, E MoE
    attn_layer_period / offset  Jamba: attention where i % period == offset, Mamba elsewhere;
    expert_layer_period / offset  and MoE where i % period == offset, an MLP elsewhere
    first_k_dense_replace       DeepSeek-V3, Kimi K2: the first k layers dense, then MoE

Attention is MLA when ``kv_lora_rank`` is given; Mamba-1 reads ``mamba_d_state``,
``mamba_expand``, ``mamba_d_conv``; Mamba-2 ``mamba_num_heads``, ``mamba_head_dim``,
``ssm_state_size``, ``n_groups``, ``conv_kernel``; Gated DeltaNet the ``linear_*`` keys.
A recurrent layer's conv state keeps ``kernel - 1`` columns, as vLLM and SGLang allocate
it. ``quantization_config`` sets the stored bits: ``fp8`` 8 bits a weight (embeddings kept
at the model dtype), ``mxfp4`` 4.25 bits an expert weight (4-bit values, one 8-bit scale
per 32). Keys prefixlab does not price (norms, biases, rotary settings) are ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from functools import lru_cache
from pathlib import Path

from prefixlab.errors import ConfigError
from prefixlab.model.architecture import ModelSpec

#: the dtype names of a config and their bytes
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2}
#: activation functions of the MLPs with two matrices (no gate)
_UNGATED = {"relu2", "gelu_new", "gelu", "relu", "gelu_pytorch"}
#: the keys that count experts (Mixtral and gpt-oss, DeepSeek, Qwen)
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
#: bits of a quantized weight per quant_method (scales included)
_QUANT_BITS = {"fp8": 8.0, "mxfp4": 4.25}

#: what transformers assumes for keys a published config leaves out
_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma3_text": {"sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma3": {"sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
}

Layers = list[tuple[str, str]]  # per layer: (mixer: attention|sliding|linear|mamba, ffn)


def load_model_file(path: str) -> ModelSpec:
    """A model file read once per change: a ``config.json`` or prefixlab's own fields."""
    p = Path(path)
    try:
        stamp = p.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"model file {path}: {exc.strerror or exc}") from None
    return _load(os.fspath(p.resolve()), stamp, path)


@lru_cache(maxsize=64)
def _load(resolved: str, stamp: int, name: str) -> ModelSpec:
    try:
        data = json.loads(Path(resolved).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name}: line {exc.lineno}: not valid JSON ({exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model file {name}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: a model file holds one JSON object")
    known = {f.name for f in fields(ModelSpec)}
    if "num_attention_layers" in data or "num_ssm_layers" in data:
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{name}: unknown ModelSpec field(s) {', '.join(unknown)}")
        return ModelSpec(**{"name": name, **data})
    return from_hf_config(data, name)


def from_hf_config(config: Mapping[str, object], name: str) -> ModelSpec:
    """The :class:`ModelSpec` of a Hugging Face config (a multimodal model's
    ``text_config``); ``name`` names it, and the file in errors."""
    cfg = _Config(config, name)
    layers = _layers(cfg)
    dtype = cfg.dtype_bytes()
    spec = {
        "name": name,
        "hidden_size": cfg.integer("hidden_size"),
        "vocab_size": cfg.integer("vocab_size", 32_000),
        "tie_embeddings": cfg.flag("tie_word_embeddings", False),
        "dtype_bytes": dtype,
        "state_dtype_bytes": _ssm_state_bytes(cfg, dtype),
        **_attention(cfg, layers),
        **_ffn(cfg, layers),
        **_recurrent(cfg, layers),
        **_quantization(cfg),
    }
    return ModelSpec(**spec)  # type: ignore[arg-type]


class _Config:
    """Typed reads of a config's keys, naming the file and key in every error."""

    def __init__(self, data: Mapping[str, object], name: str) -> None:
        text = data.get("text_config")
        merged = dict(data)
        if isinstance(text, dict):  # multimodal: the language model's own keys win
            merged.update(text)
        defaults = _DEFAULTS.get(str(merged.get("model_type")), {})
        self.data = {**defaults, **{k: v for k, v in merged.items() if v is not None}}
        self.name = name

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.name}: field '{key}' is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.name}: field '{key}' must be an integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.name}: field '{key}' must be true or false, got {value!r}")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self.name}: field '{key}' must be a string, got {value!r}")
        return value

    def dtype_bytes(self) -> int:
        dtype = self.text("torch_dtype", "") or self.text("dtype", "bfloat16")
        if dtype not in _DTYPE_BYTES:
            raise ConfigError(
                f"{self.name}: field 'torch_dtype': unknown dtype {dtype!r}; "
                f"known: {', '.join(_DTYPE_BYTES)}"
            )
        return _DTYPE_BYTES[dtype]


def _layers(cfg: _Config) -> Layers:
    """(mixer, ffn) of every layer, from whichever layout keys the config has."""
    n = cfg.integer("num_hidden_layers")
    if cfg.has("hybrid_override_pattern"):
        return _nemotron_layers(cfg, n)
    mixers = _mixers(cfg, n)
    ffn = _ffn_kinds(cfg, n)
    return list(zip(mixers, ffn, strict=True))


def _mixers(cfg: _Config, n: int) -> list[str]:
    if cfg.has("layer_types"):
        types = cfg.data["layer_types"]
        names = {
            "full_attention": "attention",
            "sliding_attention": "sliding",
            "linear_attention": "linear",
            "mamba": "mamba",
        }
        if not isinstance(types, list) or len(types) != n or any(t not in names for t in types):
            raise ConfigError(
                f"{cfg.name}: field 'layer_types' must list {n} of {', '.join(names)}"
            )
        return [names[t] for t in types]
    rules: list[tuple[str, Callable[[int, int], str]]] = [
        ("sliding_window_pattern", lambda i, k: "attention" if (i + 1) % k == 0 else "sliding"),
        ("full_attention_interval", lambda i, k: "attention" if (i + 1) % k == 0 else "linear"),
    ]
    for key, rule in rules:
        if cfg.has(key):
            k = _positive(cfg, key)
            return [rule(i, k) for i in range(n)]
    if cfg.has("attn_layer_period"):
        period = _positive(cfg, "attn_layer_period")
        offset = cfg.integer("attn_layer_offset", 0)
        return ["attention" if i % period == offset else "mamba" for i in range(n)]
    # Mistral-style configs window every layer; others (Qwen2) carry sliding_window unused
    windowed = cfg.text("model_type") in {"mistral", "mixtral"} and cfg.has("sliding_window")
    return ["sliding" if windowed else "attention"] * n


def _ffn_kinds(cfg: _Config, n: int) -> list[str]:
    if not _has_experts(cfg):
        return ["mlp"] * n
    if cfg.has("first_k_dense_replace"):
        k = cfg.integer("first_k_dense_replace")
        return ["mlp" if i < k else "moe" for i in range(n)]
    if cfg.has("expert_layer_period"):
        period = _positive(cfg, "expert_layer_period")
        offset = cfg.integer("expert_layer_offset", 0)
        return ["moe" if i % period == offset else "mlp" for i in range(n)]
    step = cfg.integer("decoder_sparse_step", 1)
    dense = cfg.data.get("mlp_only_layers") or []
    if not isinstance(dense, list):
        raise ConfigError(f"{cfg.name}: field 'mlp_only_layers' must be a list of layers")
    return ["moe" if (i + 1) % step == 0 and i not in dense else "mlp" for i in range(n)]


def _nemotron_layers(cfg: _Config, n: int) -> Layers:
    pattern = cfg.text("hybrid_override_pattern")
    kinds = {"M": ("mamba", ""), "*": ("attention", ""), "-": ("", "mlp"), "E": ("", "moe")}
    if len(pattern) != n or any(c not in kinds for c in pattern):
        raise ConfigError(
            f"{cfg.name}: field 'hybrid_override_pattern' must have {n} characters of M * - E"
        )
    return [kinds[c] for c in pattern]


def _positive(cfg: _Config, key: str) -> int:
    value = cfg.integer(key)
    if value <= 0:
        raise ConfigError(f"{cfg.name}: field '{key}' must be positive, got {value}")
    return value


def _has_experts(cfg: _Config) -> bool:
    return any(cfg.integer(k, 0) > 0 for k in _EXPERT_KEYS)


def _count(layers: Layers, mixer: str = "", ffn: str = "") -> int:
    return sum(1 for m, f in layers if (mixer and m == mixer) or (ffn and f == ffn))


def _attention(cfg: _Config, layers: Layers) -> dict[str, int]:
    full, sliding = _count(layers, "attention"), _count(layers, "sliding")
    if not full + sliding:
        return {}
    heads = cfg.integer("num_attention_heads")
    out = {
        "num_attention_layers": full + sliding,
        "num_sliding_layers": sliding,
        "sliding_window": cfg.integer("sliding_window") if sliding else 0,
        "num_heads": heads,
    }
    if cfg.has("kv_lora_rank"):
        keys = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        out.update({k: cfg.integer(k) for k in keys})
        out["q_lora_rank"] = cfg.integer("q_lora_rank", 0)
        return out
    head_dim = cfg.integer("head_dim", 0) or cfg.integer("attention_head_dim", 0)
    out["head_dim"] = head_dim or cfg.integer("hidden_size") // heads
    out["num_kv_heads"] = cfg.integer("num_key_value_heads", heads)
    return out


def _ffn(cfg: _Config, layers: Layers) -> dict[str, int]:
    act = cfg.text("mlp_hidden_act", "") or cfg.text("hidden_act", "silu")
    out = {
        "num_mlp_layers": _count(layers, ffn="mlp"),
        "intermediate_size": cfg.integer("intermediate_size", 0),
        "mlp_matrices": 2 if act in _UNGATED else 3,
    }
    moe = _count(layers, ffn="moe")
    if not moe:
        return out
    experts = next(cfg.integer(k) for k in _EXPERT_KEYS if cfg.has(k))
    top = cfg.integer("num_experts_per_tok", 0) or cfg.integer("experts_per_token")
    size = cfg.integer("moe_intermediate_size", 0) or cfg.integer("intermediate_size")
    shared = cfg.integer("shared_expert_intermediate_size", 0)
    shared = shared or cfg.integer("n_shared_experts", 0) * size
    out.update(
        num_moe_layers=moe,
        num_experts=experts,
        experts_per_token=top,
        moe_intermediate_size=size,
        shared_expert_intermediate_size=shared,
    )
    return out


def _recurrent(cfg: _Config, layers: Layers) -> dict[str, int]:
    """Mamba-1, Mamba-2 and Gated DeltaNet layers as ``ssm`` layers: state channels x
    d_state, conv channels x (kernel - 1), and the FLOPs' widths."""
    linear, mamba = _count(layers, "linear"), _count(layers, "mamba")
    if linear:
        k_heads = cfg.integer("linear_num_key_heads")
        v_heads = cfg.integer("linear_num_value_heads")
        dk, dv = cfg.integer("linear_key_head_dim"), cfg.integer("linear_value_head_dim")
        key_dim, value_dim = k_heads * dk, v_heads * dv
        return {
            "num_ssm_layers": linear,
            "ssm_d_inner": value_dim,
            "ssm_d_state": dk,
            "ssm_state_channels": value_dim,  # a dk x dv state per value head
            "ssm_conv_dim": 2 * key_dim + value_dim,
            "ssm_conv_kernel": cfg.integer("linear_conv_kernel_dim") - 1,
            "ssm_in_proj_dim": 2 * key_dim + 2 * value_dim + 2 * v_heads,
        }
    if not mamba:
        return {}
    if cfg.has("mamba_num_heads") or cfg.has("ssm_state_size"):
        heads, head_dim = cfg.integer("mamba_num_heads"), cfg.integer("mamba_head_dim")
        n, groups = cfg.integer("ssm_state_size"), cfg.integer("n_groups", 1)
        inner = heads * head_dim
        return {
            "num_ssm_layers": mamba,
            "ssm_d_inner": inner,
            "ssm_d_state": n,
            "ssm_conv_dim": inner + 2 * groups * n,
            "ssm_conv_kernel": cfg.integer("conv_kernel", 4) - 1,
            "ssm_in_proj_dim": 2 * inner + 2 * groups * n + heads,
        }
    return {
        "num_ssm_layers": mamba,
        "ssm_d_inner": cfg.integer("mamba_expand", 2) * cfg.integer("hidden_size"),
        "ssm_d_state": cfg.integer("mamba_d_state"),
        "ssm_conv_kernel": cfg.integer("mamba_d_conv", 4) - 1,
    }


def _ssm_state_bytes(cfg: _Config, dtype_bytes: int) -> int:
    """The recurrent state's bytes per value: vLLM keeps Nemotron-H's in float32 unless
    the config's ``mamba_ssm_cache_dtype`` says otherwise (NemotronHForCausalLMConfig);
    other models, at the model dtype."""
    if cfg.text("model_type") != "nemotron_h":
        return dtype_bytes
    dtype = cfg.text("mamba_ssm_cache_dtype", "float32")
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"{cfg.name}: field 'mamba_ssm_cache_dtype': unknown dtype {dtype!r}")
    return _DTYPE_BYTES[dtype]


def _quantization(cfg: _Config) -> dict[str, float]:
    q = cfg.data.get("quantization_config")
    if q is None:
        return {}
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method not in _QUANT_BITS:
        raise ConfigError(
            f"{cfg.name}: field 'quantization_config.quant_method': {method!r} is not "
            f"priced; known: {', '.join(_QUANT_BITS)}"
        )
    if method == "mxfp4":  # the experts only (attention, router, embeddings stay bf16)
        return {"expert_weight_bits": _QUANT_BITS["mxfp4"]}
    return {"weight_bits": _QUANT_BITS[str(method)]}
