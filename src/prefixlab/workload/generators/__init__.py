"""Seeded workload generators, registered by name (``gen:NAME:k=v,...`` trace sources).

``sessions`` (UniCache multi-turn), ``lpc`` (text conversations with learnable continuation),
``templated`` (UniCache Table 3 single-turn tasks), ``mix`` (UniCache traces #1-#3) and
``random-pool`` (the hash-table report's pooled and random prompts).
"""

from __future__ import annotations

from prefixlab.workload.generators import lpc, mix, random_pool, templated  # noqa: F401
from prefixlab.workload.generators.base import GENERATORS, GeneratorInfo, register_generator
from prefixlab.workload.generators.lpc import LPCParams, generate_lpc
from prefixlab.workload.generators.mix import MixParams, generate_mix
from prefixlab.workload.generators.random_pool import RandomPoolParams, generate_random_pool
from prefixlab.workload.generators.sessions import SessionParams, generate_sessions
from prefixlab.workload.generators.templated import TemplatedParams, generate_templated

__all__ = [
    "GENERATORS",
    "GeneratorInfo",
    "LPCParams",
    "MixParams",
    "RandomPoolParams",
    "SessionParams",
    "TemplatedParams",
    "generate_lpc",
    "generate_mix",
    "generate_random_pool",
    "generate_sessions",
    "generate_templated",
    "register_generator",
]
