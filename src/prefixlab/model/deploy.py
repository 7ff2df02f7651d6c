"""A model deployed on GPUs: tensor parallelism and the KV budget it leaves.

vLLM sizes its KV pool on each GPU as ``gpu_memory_utilization x memory - weights -
activations``; under tensor parallelism of degree ``tp`` each GPU holds ``1/tp`` of the
weights and, of each token's KV, its share of the KV heads (at least one head: vLLM
replicates KV heads when tp exceeds their number; an MLA latent is replicated whole).
So the group holds ``free per GPU / KV bytes per token per GPU`` tokens, which this module
reports as the model's KV bytes (tokens x ``kv_bytes_per_token``), the unit every cache
capacity in prefixlab is given in.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixlab.errors import ConfigError
from prefixlab.model.architecture import check_tp
from prefixlab.model.spec import ModelSpec, get_model
from prefixlab.model.timing import GPU, get_gpu

GIB = 2**30


@dataclass(frozen=True, slots=True)
class KVBudget:
    """What ``tp`` GPUs hold for KV after the weights (bytes are per GPU unless named)."""

    model: str
    gpu: str
    tp: int
    memory_utilization: float
    reserve_gib: float
    weights_per_gpu: int
    free_per_gpu: int
    tokens: int
    kv_bytes: int  # the model's KV bytes of ``tokens`` (what capacities are given in)

    def describe(self) -> str:
        group = f"{self.tp} x {self.gpu}" if self.tp > 1 else self.gpu
        return (
            f"KV budget of {self.model} on {group} at {self.memory_utilization:g} of memory: "
            f"{self.weights_per_gpu / GIB:.1f} GiB of weights and "
            f"{self.free_per_gpu / GIB:.1f} GiB of KV per GPU = {self.tokens:,} tokens "
            f"({self.kv_bytes / GIB:.1f} GiB of the model's KV)"
        )


def free_kv_bytes_per_gpu(
    model: ModelSpec,
    gpu: GPU,
    tp: int = 1,
    memory_utilization: float = 0.9,
    reserve_gib: float = 0.0,
) -> float:
    """``memory_utilization x memory - weights / tp - reserve`` (negative when the
    weights do not fit)."""
    free = memory_utilization * gpu.mem_bytes - model.weight_bytes / tp
    return free - reserve_gib * GIB


def kv_budget(
    model: str | ModelSpec,
    gpu: str | GPU,
    tp: int = 1,
    memory_utilization: float = 0.9,
    reserve_gib: float = 0.0,
) -> KVBudget:
    """The KV budget of ``model`` on ``tp`` GPUs (vLLM's default utilization, 0.9)."""
    spec = get_model(model)
    g = get_gpu(gpu) if isinstance(gpu, str) else gpu
    check_tp(spec, tp)
    if not 0 < memory_utilization <= 1:
        raise ConfigError(f"gpu memory utilization must be in (0, 1], got {memory_utilization}")
    per_token = spec.kv_bytes_per_token_per_rank(tp)
    if per_token <= 0:
        raise ConfigError(f"model {spec.name} has no attention KV: there is no KV budget")
    free = int(free_kv_bytes_per_gpu(spec, g, tp, memory_utilization, reserve_gib))
    if free < per_token:
        raise ConfigError(
            f"{spec.name} on {tp} x {g.name}: {spec.weight_bytes / tp / GIB:.1f} GiB of weights "
            f"per GPU (and {reserve_gib:g} GiB reserved) leave no KV room in "
            f"{memory_utilization:g} x {g.mem_bytes / GIB:.0f} GiB; raise tp or the utilization"
        )
    tokens = free // per_token
    return KVBudget(
        spec.name,
        g.name,
        tp,
        memory_utilization,
        reserve_gib,
        spec.weight_bytes // tp,
        free,
        tokens,
        tokens * spec.kv_bytes_per_token,
    )


def layer_summary(m: ModelSpec) -> str:
    """The layers in words: ``61 attention (MLA), 3 MLP, 58 MoE (256 experts, top 8)``."""
    parts = []
    if m.num_attention_layers:
        kind = " (MLA)" if m.kv_lora_rank else ""
        if m.num_sliding_layers:
            kind = f" ({m.num_sliding_layers} sliding, window {m.sliding_window:,})"
        parts.append(f"{m.num_attention_layers} attention{kind}")
    if m.num_ssm_layers:
        parts.append(f"{m.num_ssm_layers} recurrent (d_state {m.ssm_d_state})")
    if m.num_mlp_layers:
        parts.append(f"{m.num_mlp_layers} MLP")
    if m.num_moe_layers:
        shared = " + shared" if m.shared_expert_intermediate_size else ""
        top = f"top {m.experts_per_token}{shared}"
        parts.append(f"{m.num_moe_layers} MoE ({m.num_experts} experts, {top})")
    return ", ".join(parts)


def cache_rule(m: ModelSpec) -> str:
    """How prefixlab caches the model's prefixes (docs/models.md, 'Prefix caching')."""
    if m.num_ssm_layers:
        return "hybrid (KV + states)"
    if m.num_sliding_layers:
        return "blocks, pages freed past the window"
    return "blocks"


def model_summary(m: ModelSpec) -> dict[str, object]:
    """What ``prefixlab models`` shows of a model."""
    return {
        "name": m.name,
        "layers": layer_summary(m),
        "parameters": m.num_parameters,
        "active_parameters": m.active_parameters,
        "weight_bytes": m.weight_bytes,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "state_bytes": m.state_bytes_per_checkpoint,
        "prefix_caching": cache_rule(m),
    }
