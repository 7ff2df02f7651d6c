"""Importing this module registers every built-in policy."""

from prefixlab.policies import (  # noqa: F401
    arc,
    fifo,
    hashtable,
    hybrid,
    lecar,
    lfu,
    lpc,
    lru,
    mru,
    opt,
    opt_online,
    s3fifo,
    sglang_lru,
    sieve,
    unicache,
    vllm,
    workload_aware,
)
