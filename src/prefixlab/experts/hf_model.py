"""Loading a Hugging Face transformers Mixture-of-Experts model and probing its routers.

transformers 5.x returns ``outputs.router_logits`` (with ``output_router_logits=True``) as a
tuple with one tensor per MoE layer (dense layers, e.g. Qwen2-MoE's ``mlp_only_layers``, are
absent), each of shape ``[batch * seq_len, num_experts]``. Only routers whose experts are the
top-k of ``softmax(router_logits)`` can be recorded from them (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, GraniteMoE, Jamba); routers with group-limited or bias-corrected choice (DeepSeek-V3,
GLM-4-MoE ...) are refused here. torch and transformers are optional and imported lazily,
inside the functions.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from prefixlab.errors import ConfigError

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import DynamicCache, PreTrainedModel

DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True, slots=True)
class RouterInfo:
    """What a model's routers look like: MoE layers, experts per layer, default top-k."""

    num_layers: int
    num_experts: int
    top_k: int


def check_dtype(dtype: str) -> None:
    """Raise ConfigError unless ``dtype`` is a weight dtype :func:`load_model` accepts."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype '{dtype}' is not one of {', '.join(DTYPES)}")


def load_model(
    model_id_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    local_files_only: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a causal LM with ``AutoModelForCausalLM`` and check that it reports routing.

    Args:
        model_id_or_path: a local folder (``save_pretrained`` output) or a Hugging Face hub id.
        dtype: weight dtype name, one of float32, float16, bfloat16, float64.
        device: torch device, e.g. ``cpu`` or ``cuda:0``.
        local_files_only: never contact the hub (also implied by ``HF_HUB_OFFLINE=1``).
        trust_remote_code: allow model code from the hub repository.

    Returns:
        The model, in eval mode, on ``device``.

    Raises:
        ConfigError: missing torch/transformers, a bad dtype, a model that cannot be loaded
            (the reason is quoted), or a model that exposes no softmax top-k router logits.
    """
    check_dtype(dtype)
    torch, transformers = import_backend()
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_id_or_path,
            dtype=getattr(torch, dtype),
            local_files_only=local_files_only,
            trust_remote_code=trust_remote_code,
        )
        model = model.to(device).eval()
    except Exception as exc:  # OSError (offline, missing), ValueError (unknown architecture) ...
        where = "local folder" if Path(model_id_or_path).exists() else "hub id"
        reason = " ".join(str(exc).split())
        raise ConfigError(
            f"could not load model '{model_id_or_path}' ({where}) with "
            f"AutoModelForCausalLM: {type(exc).__name__}: {reason}"
        ) from None
    probe_router(model)
    return cast("PreTrainedModel", model)


def import_backend() -> tuple[ModuleType, ModuleType]:
    try:
        import torch
        import transformers  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ConfigError(
            "recording expert routing needs torch and transformers "
            "(pip install torch==2.13.0 transformers)"
        ) from None
    return torch, transformers


def model_name(m: PreTrainedModel) -> str:
    cfg = getattr(m, "config", None)
    return str(getattr(cfg, "_name_or_path", "") or getattr(cfg, "model_type", "") or "model")


def model_vocab_size(model: object) -> int:
    """Number of token ids the model's input embedding accepts."""
    m: Any = model  # Any: a transformers model, whose embedding module's type is not declared
    return int(m.get_input_embeddings().num_embeddings)


def check_softmax_topk(m: PreTrainedModel) -> None:
    cfg = m.config
    reasons = []
    if getattr(cfg, "scoring_func", "softmax") != "softmax":
        reasons.append(f"scoring_func={cfg.scoring_func}")
    if getattr(cfg, "topk_group", None) is not None:
        reasons.append(f"group-limited top-k (topk_group={cfg.topk_group})")
    if any(key.endswith("e_score_correction_bias") for key in m.state_dict()):
        reasons.append("bias-corrected choice (e_score_correction_bias)")
    if reasons:
        raise ConfigError(
            f"model '{model_name(m)}' does not route by softmax top-k of its router logits "
            f"({'; '.join(reasons)}), so they do not determine its experts and it cannot be "
            "recorded (Mixtral, Qwen-MoE, OLMoE and other softmax top-k routers can)"
        )


def router_logits_of(m: PreTrainedModel, out: object) -> list[Tensor]:
    logits = getattr(out, "router_logits", None)
    layers = [t for t in (logits or ()) if t is not None]
    if not layers:
        raise ConfigError(
            f"model '{model_name(m)}' exposes no router logits (output_router_logits=True "
            "returned none): it is not a Mixture-of-Experts model transformers reports routing for"
        )
    return layers


def new_kv_cache(m: PreTrainedModel) -> DynamicCache:
    """An empty KV cache object for ``m`` (transformers' ``DynamicCache``): the decode loop
    passes it to every forward call, which fills it in place. It is never read back from
    the outputs, whose ``past_key_values`` field is deprecated (renamed ``cache`` in 5.x)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=m.config)
    except TypeError:  # transformers before the config argument
        return DynamicCache()


def run_forward(
    m: PreTrainedModel,
    ids: Tensor,
    *,
    mask: Tensor | None = None,
    past: DynamicCache | None = None,
    cache: bool,
) -> Any:  # Any: the model's output (a ModelOutput, its fields the model class's)
    kwargs: dict[str, object] = {"output_router_logits": True, "use_cache": cache}
    if mask is not None:
        kwargs["attention_mask"] = mask
    params = inspect.signature(m.forward).parameters
    if past is not None:
        # transformers 5.x names the argument ``cache`` (``past_key_values`` is deprecated,
        # to be removed in 5.40); earlier releases only know ``past_key_values``
        kwargs["cache" if "cache" in params else "past_key_values"] = past
    # Only the last position's logits are needed (greedy decode); a full [B, T, vocab]
    # tensor would dwarf the model on long prompts.
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 1
    return m(input_ids=ids, **kwargs)


def probe_router(model: object) -> RouterInfo:
    """Run one token through ``model`` and report its MoE layers and experts.

    Raises:
        ConfigError: the model exposes no router logits, or does not route by softmax top-k.
    """
    torch, _ = import_backend()
    m = cast("PreTrainedModel", model)
    check_softmax_topk(m)
    with torch.inference_mode():
        out = run_forward(m, torch.zeros((1, 1), dtype=torch.long, device=m.device), cache=False)
    layers = router_logits_of(m, out)
    num_experts = int(layers[0].shape[-1])
    top_k = getattr(m.config, "num_experts_per_tok", None)
    return RouterInfo(len(layers), num_experts, int(top_k) if top_k else 0)
