"""Expert-cache policies: one module each, registered by name (``make_policy("llru")``)."""

from prefixlab.experts.policies import (  # noqa: F401  (importing registers the built-ins)
    fifo,
    lfu,
    llru,
    lru,
    lru_dist,
    marking,
    opt,
    opt_dist,
)
from prefixlab.experts.policies.base import (
    ExpertPolicy,
    KernelRun,
    PolicyContext,
    describe,
    layer_shares,
    make_policy,
    parameters,
    parse_spec,
    register,
    registered,
)

__all__ = [
    "ExpertPolicy",
    "KernelRun",
    "PolicyContext",
    "describe",
    "layer_shares",
    "make_policy",
    "parameters",
    "parse_spec",
    "register",
    "registered",
]
