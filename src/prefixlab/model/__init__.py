"""Model specifications: layer counts, dimensions and what they imply in bytes."""

from prefixlab.model.presets import MODEL_PRESETS
from prefixlab.model.spec import ModelSpec, capacity_blocks_for_bytes, get_model

__all__ = ["MODEL_PRESETS", "ModelSpec", "capacity_blocks_for_bytes", "get_model"]
