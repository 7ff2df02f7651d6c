"""Model specifications and presets (attention KV bytes; FLOPs and SSM states come later).

KV bytes per token = 2 (K and V) x attention layers x KV heads x head dim x dtype bytes::

    Llama-3.1-8B: 2 x 32 x 8 x 128 x 2 B = 131,072 B = 128 KiB per token
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixlab.errors import ConfigError


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """Layer counts and dimensions of a model (GQA attention)."""

    name: str
    num_attention_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_block(self, block_tokens: int) -> int:
        return self.kv_bytes_per_token * block_tokens


MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-3.2-1b", 16, 8, 64, 2048),
        ModelSpec("llama-3.2-3b", 28, 8, 128, 3072),
        ModelSpec("llama-3.1-8b", 32, 8, 128, 4096),
        ModelSpec("qwen3-32b", 64, 8, 128, 5120),
        ModelSpec("mixtral-8x7b", 32, 8, 128, 4096),
    )
}


def get_model(name: str) -> ModelSpec:
    key = name.lower()
    if key not in MODEL_PRESETS:
        raise ConfigError(f"unknown model '{name}'; known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[key]


def capacity_blocks_for_bytes(
    capacity_bytes: int, model: str | ModelSpec, block_tokens: int
) -> int:
    """How many whole KV blocks of ``block_tokens`` tokens fit in ``capacity_bytes``."""
    spec = get_model(model) if isinstance(model, str) else model
    per_block = spec.kv_bytes_per_block(block_tokens)
    blocks = capacity_bytes // per_block
    if blocks <= 0:
        raise ConfigError(
            f"capacity of {capacity_bytes} bytes holds no block: one {block_tokens}-token block "
            f"of {spec.name} takes {per_block} bytes"
        )
    return blocks
