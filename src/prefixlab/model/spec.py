"""Models by name: the presets, a model file, and capacities in blocks.

:func:`get_model` resolves what a user writes as a model (``--model``, ``[model] name``):
a preset or alias (:mod:`prefixlab.model.presets`), or a path to a JSON file, a Hugging
Face ``config.json`` or :class:`ModelSpec` fields (:mod:`prefixlab.model.hf`). The spec
itself, its bytes and FLOPs, is :mod:`prefixlab.model.architecture`.
"""

from __future__ import annotations

import os

from prefixlab.errors import ConfigError
from prefixlab.model.architecture import LAYER_TYPES, ModelSpec, check_tp
from prefixlab.model.hf import load_model_file
from prefixlab.model.presets import MODEL_ALIASES, MODEL_PRESETS

__all__ = [
    "LAYER_TYPES",
    "MODEL_PRESETS",
    "ModelSpec",
    "capacity_blocks_for_bytes",
    "check_tp",
    "get_model",
]


def get_model(name: str | ModelSpec) -> ModelSpec:
    """A preset by name (or alias), or a model file: a Hugging Face ``config.json`` or a
    JSON object of :class:`ModelSpec` fields (see :mod:`prefixlab.model.hf`)."""
    if isinstance(name, ModelSpec):
        return name
    key = MODEL_ALIASES.get(name.lower(), name.lower())
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    if name.endswith(".json") or os.sep in name:
        return load_model_file(name)
    raise ConfigError(
        f"unknown model '{name}'; known: {', '.join(MODEL_PRESETS)}, or a path to a config.json"
    )


def capacity_blocks_for_bytes(
    capacity_bytes: int, model: str | ModelSpec, block_tokens: int
) -> int:
    """How many whole KV blocks of ``block_tokens`` tokens fit in ``capacity_bytes``."""
    spec = get_model(model)
    per_block = spec.kv_bytes_per_block(block_tokens)
    if per_block <= 0:
        raise ConfigError(f"model {spec.name} has no attention KV: capacity in blocks is undefined")
    blocks = capacity_bytes // per_block
    if blocks <= 0:
        raise ConfigError(
            f"capacity of {capacity_bytes} bytes holds no block: one {block_tokens}-token block "
            f"of {spec.name} takes {per_block} bytes"
        )
    return blocks
