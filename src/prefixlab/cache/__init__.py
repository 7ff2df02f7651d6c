"""Cache structures: block (vLLM-style) and radix (SGLang-style)."""

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Hit, MatchResult, Miss, Removed, Stored
from prefixlab.cache.radix import RadixCache, RadixHandle

__all__ = [
    "BlockCache",
    "Hit",
    "MatchResult",
    "Miss",
    "RadixCache",
    "RadixHandle",
    "Removed",
    "Stored",
]
