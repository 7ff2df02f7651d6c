"""Drive Marconi's published simulator (github.com/ruipeterpan/marconi) request by request.

The simulator is CC BY-NC 4.0: it is never copied here. Point ``PREFIXLAB_MARCONI_SIM`` at a
checkout of it (``docs/marconi.md`` says how), patched with :mod:`patch_marconi_sim`. This
module imports its ``radix_cache_hybrid`` / ``radix_cache_vllm`` from there and replays a
trace the way its own ``policy_exploration.run_trace_with_config`` does: requests in order,
``match_prefix(input)``, then ``insert(input + output)``.

Policies map onto it as in its experiment script: ``vllm+`` is ``radix_cache_vllm`` with
32-token blocks, ``sglang+`` is the hybrid tree with eviction version 1, ``marconi`` with a
fixed alpha is version 3, tuned ``marconi`` is version 2 (alpha 0, then tuned once).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

ENV = "PREFIXLAB_MARCONI_SIM"
#: the model of every experiment in its scripts (NVIDIA's Attention-Mamba2 hybrid 7B)
MODEL = {"num_ssm_layers": 24, "num_attn_layers": 4, "num_mlp_layers": 28, "d": 4096, "n": 128}


def checkout() -> Path | None:
    """The simulator's checkout named by ``PREFIXLAB_MARCONI_SIM``, if it looks like one."""
    path = os.environ.get(ENV)
    if not path:
        return None
    p = Path(path)
    return p if (p / "radix_cache_hybrid.py").is_file() else None


def _modules(path: Path) -> tuple[object, object]:
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))  # vLLM+ recurses per block
    import radix_cache_hybrid
    import radix_cache_vllm

    return radix_cache_hybrid, radix_cache_vllm


def replay(
    path: Path,
    requests: Sequence[tuple[list[int], list[int]]],
    policy: str,
    capacity_bytes: int,
    alpha: float | None = None,
    bootstrap_multiplier: int = 5,
) -> tuple[list[int], list[float]]:
    """Hit tokens per request, and the alphas the tree used (tuned: 0, then the tuned one)."""
    hybrid, vllm = _modules(path)
    if policy == "vllm+":
        tree = vllm.RadixCache(
            capacity_bytes=float(capacity_bytes),
            use_logical_ts=True,  # type: ignore[attr-defined]
            block_size=32,
            **MODEL,
        )
    else:
        version = 1 if policy == "sglang+" else (2 if alpha is None else 3)
        tree = hybrid.RadixCache(  # type: ignore[attr-defined]
            capacity_bytes=float(capacity_bytes),
            evict_policy_version=version,
            eff_weight=0.0 if alpha is None else alpha,
            use_logical_ts=True,
            bootstrap_multiplier=bootstrap_multiplier,
            **MODEL,
        )
    hits: list[int] = []
    alphas: list[float] = []
    devnull = open(os.devnull, "w")  # noqa: SIM115  (its tuner prints)
    stdout, sys.stdout = sys.stdout, devnull
    try:
        for i, (inp, out) in enumerate(requests):
            prefix = tree.match_prefix(list(inp))[0]
            hits.append(len(prefix))
            tree.insert(list(inp) + list(out), i, i)
            alpha_now = getattr(tree, "eff_weight", None)
            if alpha_now is not None and (not alphas or alphas[-1] != alpha_now):
                alphas.append(float(alpha_now))
    finally:
        sys.stdout = stdout
        devnull.close()
    return hits, alphas
