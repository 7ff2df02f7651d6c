"""Replay through the hybrid (KV + SSM state) cache: the contract of Marconi's simulator.

For each request in arrival order: match its input (the reusable prefix ends at the deepest
fully matched node holding a checkpoint) -> count the hit -> evict until the new KV and
checkpoints of input + output fit in the one byte budget -> insert them. Token hit ratio is
over all requests, cold misses included. FLOPs saved are per layer type, from the model.

``marconi`` without a fixed alpha is tuned here: alpha = 0 until the first eviction; after
a bootstrap window of ``bootstrap_multiplier`` x the requests seen by then, the requests so
far are replayed once per alpha of the grid (in parallel with ``tune_jobs`` > 1, or as Ray
tasks when Ray is running) and the best alpha by the objective is kept (ties: the smallest).
With ``retune_every = N`` it is tuned again every N requests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from prefixlab.cache.hybrid import HybridCache
from prefixlab.errors import ConfigError
from prefixlab.model.spec import ModelSpec, get_model
from prefixlab.policies.base import EvictionPolicy, make_policy
from prefixlab.policies.hybrid import HybridPolicy, Marconi
from prefixlab.workload.trace import Trace

I64 = npt.NDArray[np.int64]


@dataclass(slots=True, frozen=True)
class HybridConfig:
    """One byte budget for KV and states, and the model that sizes them."""

    capacity_bytes: int
    #: a preset name or a ModelSpec
    model: str | ModelSpec = "marconi-hybrid-7b"

    def spec(self) -> ModelSpec:
        return get_model(self.model)

    def validate(self) -> None:
        c = self.capacity_bytes
        if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
            raise ConfigError(f"capacity_bytes must be a positive integer, got {c!r}")
        self.spec()


@dataclass(slots=True)
class HybridResult:
    policy: str
    capacity_bytes: int
    model: str
    metrics: dict[str, Any]
    elapsed_s: float
    hit_tokens: I64 = field(repr=False)
    input_tokens: I64 = field(repr=False)
    #: (request index after which it took effect, alpha) for tuned Marconi
    alpha_history: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy,
            "structure": "hybrid",
            "capacity_bytes": self.capacity_bytes,
            "model": self.model,
        }
        out.update(self.metrics)
        out["elapsed_s"] = self.elapsed_s
        out["requests_per_s"] = (
            self.metrics["num_requests"] / self.elapsed_s if self.elapsed_s > 0 else 0.0
        )
        if self.alpha_history:
            out["alpha_history"] = [[r, a] for r, a in self.alpha_history]
        return out


def _policy(policy: EvictionPolicy | str) -> HybridPolicy:
    pol = make_policy(policy, "hybrid") if isinstance(policy, str) else policy
    if not isinstance(pol, HybridPolicy):
        raise ConfigError(
            f"policy '{pol.spec()}' does not apply to the hybrid structure; "
            "use vanilla, vllm+, sglang+ or marconi"
        )
    return pol


def replay_hybrid(
    trace: Trace,
    policy: EvictionPolicy | str,
    config: HybridConfig,
    check_every: int = 0,
    on_step: Callable[[int], None] | None = None,
) -> HybridResult:
    """Replay ``trace`` (token form) through a hybrid cache under one policy."""
    config.validate()
    pol = _policy(policy)
    spec = config.spec()
    if trace.input_tokens is None:
        raise ConfigError(
            "the hybrid structure needs token ids: a token-form trace (marconi, native with "
            "input_tokens, a text format, or a generator), not block hashes"
        )
    values, offsets = trace.sequence_tokens()
    inputs = trace.input_length
    n = len(trace)
    cache = HybridCache(config.capacity_bytes, spec, pol)
    hits = np.zeros(n, dtype=np.int64)
    history: list[tuple[int, float]] = []
    tune_at = -1  # request count at which to tune; -1: wait for the first eviction
    peak = 0
    start = time.perf_counter()
    offs = offsets.tolist()
    inp = inputs.tolist()
    for r in range(n):
        cache.now = float(r)
        seq = values[offs[r] : offs[r + 1]]
        m = cache.lookup(seq[: inp[r]])
        hits[r] = min(m.reusable, inp[r])
        cache.admit(seq, inp[r], m)
        peak = max(peak, cache.used)
        if check_every and r % check_every == 0:
            cache.check()
        if on_step is not None:
            on_step(r)
        if isinstance(pol, Marconi) and pol.tunes:
            seen = r + 1
            if tune_at < 0 and cache.num_evicted_nodes > 0:
                tune_at = seen + math.ceil(pol.bootstrap_multiplier * seen)
            if seen == tune_at:
                pol.current_alpha = tune_alpha(trace.take(np.arange(seen)), pol, config)
                history.append((r, pol.current_alpha))
                tune_at = seen + pol.retune_every if pol.retune_every else n + 1
    elapsed = time.perf_counter() - start
    if check_every:
        cache.check()
    metrics = hybrid_metrics(spec, inputs, hits)
    metrics.update(
        capacity_bytes=config.capacity_bytes,
        bytes_used=cache.used,
        peak_bytes=peak,
        bytes_written=cache.bytes_written,
        bytes_evicted=cache.bytes_evicted,
        num_nodes=cache.num_nodes,
        num_checkpoints=cache.num_checkpoints,
        num_checkpoints_written=cache.num_checkpoints_written,
        num_evicted_nodes=cache.num_evicted_nodes,
        num_merges=cache.num_merges,
        num_rejected=cache.num_rejected,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        state_bytes_per_checkpoint=cache.state,
    )
    if isinstance(pol, Marconi):
        metrics["alpha"] = pol.current_alpha
    return HybridResult(pol.spec(), config.capacity_bytes, spec.name, metrics, elapsed,
                        hits, inputs, history)  # fmt: skip


def hybrid_metrics(spec: ModelSpec, inputs: I64, hits: I64) -> dict[str, Any]:
    """Hit ratios and prefill FLOPs saved, in total and per layer type."""
    n_in = int(inputs.sum())
    n_hit = int(hits.sum())
    nreq = int(inputs.shape[0])
    out: dict[str, Any] = {
        "num_requests": nreq,
        "num_input_tokens": n_in,
        "num_hit_tokens": n_hit,
        "token_hit_ratio": n_hit / n_in if n_in else 0.0,
        "request_hit_ratio": float(np.count_nonzero(hits)) / nreq if nreq else 0.0,
    }
    out.update(spec.flops_saved(inputs, hits))
    return out


def _objective(result: HybridResult, objective: str) -> float:
    return float(result.metrics["token_hit_ratio" if objective == "hit_ratio" else "flops_saved"])


def _tune_one(trace: Trace, alpha: float, chunk_tokens: int, config: HybridConfig,
              objective: str) -> float:  # fmt: skip
    res = replay_hybrid(trace, Marconi(alpha=alpha, chunk_tokens=chunk_tokens), config)
    return _objective(res, objective)


def tune_alpha(trace: Trace, pol: Marconi, config: HybridConfig) -> float:
    """Replay ``trace`` once per alpha of the grid; the best by the objective, ties to the
    smallest alpha. Parallel on a process pool (``tune_jobs``), or on Ray when running."""
    grid = pol.alpha_grid()
    scores = _map_grid(trace, grid, pol, config)
    best, best_score = grid[0], scores[0]
    for a, s in zip(grid[1:], scores[1:], strict=True):
        if s > best_score:
            best, best_score = a, s
    return best


def _map_grid(trace: Trace, grid: Sequence[float], pol: Marconi,
              config: HybridConfig) -> list[float]:  # fmt: skip
    args = [(trace, a, pol.chunk_tokens, config, pol.objective) for a in grid]
    try:
        import ray

        if ray.is_initialized():
            remote = ray.remote(num_cpus=1)(_tune_one)
            ref = ray.put(trace)
            return list(ray.get([remote.remote(ref, *a[1:]) for a in args]))
    except ImportError:
        pass
    if pol.tune_jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=pol.tune_jobs, mp_context=ctx) as ex:
            return list(ex.map(_tune_one, *zip(*args, strict=True)))
    return [_tune_one(*a) for a in args]
