"""Replay through the hybrid (KV + SSM state) cache: the contract of Marconi's simulator.

For each request in arrival order: match its input (the reusable prefix ends at the deepest
fully matched node holding a checkpoint) -> count the hit -> evict until the new KV and
checkpoints of input + output fit in the one byte budget -> insert them. Token hit ratio is
over all requests, cold misses included. FLOPs saved are per layer type, from the model.

``marconi`` without a fixed alpha is tuned here, at the moments Marconi's simulator tunes:

- alpha = 0 until the first eviction call, made while inserting request ``s`` (1-based,
  counting every request looked up so far); the bootstrap window is then
  ``W = ceil(bootstrap_multiplier x s)`` requests (the paper's Sec. 4.2: "5x the number of
  requests seen before the first eviction");
- as the insertion of request ``W`` starts (its hit already counted, its eviction not yet
  made), requests ``1..W`` with their outputs are replayed from an empty cache once per
  alpha of the grid (in parallel with ``tune_jobs`` > 1, or as Ray tasks when Ray is
  running), each scored by the objective over its last ``score_window`` (500) requests;
- the best alpha (ties: the smallest) takes effect at once, so request ``W``'s own eviction
  already uses it.

With ``retune_every = N`` (an extension; the paper tunes once) it is tuned again every N
requests on every request so far.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixlab._jit import HAVE_NUMBA
from prefixlab.cache.hybrid import HybridCache
from prefixlab.errors import ConfigError
from prefixlab.model.spec import ModelSpec, get_model
from prefixlab.policies.base import Policy, make_policy
from prefixlab.policies.hybrid import HybridPolicy, Marconi
from prefixlab.runner._fast_hybrid import ST_TUNE, HybridKernel, hybrid_code
from prefixlab.types import I64
from prefixlab.workload.trace import Trace


@dataclass(slots=True, frozen=True)
class HybridConfig:
    """One byte budget for KV and states, and the model that sizes them."""

    capacity_bytes: int
    #: a preset name or a ModelSpec
    model: str | ModelSpec = "marconi-hybrid-7b"
    #: what an insertion keeps while it evicts: ``path`` (its matched nodes) or ``none``
    #: (Marconi's simulator; see :class:`HybridCache`)
    locks: str = "path"

    def spec(self) -> ModelSpec:
        return get_model(self.model)

    def validate(self) -> None:
        c = self.capacity_bytes
        if isinstance(c, bool) or not isinstance(c, int) or not 0 < c <= 2**62:
            raise ConfigError(f"capacity_bytes must be an integer from 1 to 2**62, got {c!r}")
        self.spec()


@dataclass(slots=True)
class HybridResult:
    policy: str
    capacity_bytes: int
    model: str
    metrics: dict[str, int | float]
    elapsed_s: float
    hit_tokens: I64 = field(repr=False)
    input_tokens: I64 = field(repr=False)
    #: (request index after which it took effect, alpha) for tuned Marconi
    alpha_history: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:  # Any: numbers, and alpha_history callers index
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


def _policy(policy: Policy | str) -> HybridPolicy:
    pol = make_policy(policy, "hybrid") if isinstance(policy, str) else policy
    if not isinstance(pol, HybridPolicy):
        raise ConfigError(
            f"policy '{pol.spec()}' does not apply to the hybrid structure; "
            "use vanilla, vllm+, sglang+ or marconi"
        )
    return pol


def replay_hybrid(
    trace: Trace,
    policy: Policy | str,
    config: HybridConfig,
    check_every: int = 0,
    on_step: Callable[[int], None] | None = None,
    fast: bool = True,
) -> HybridResult:
    """Replay ``trace`` (token form) through a hybrid cache under one policy.

    A built-in policy runs compiled (:mod:`prefixlab.runner._fast_hybrid`: the same tree in
    arrays, the same results) unless invariant checks are asked for (``check_every``),
    numba is not installed, or ``fast=False``; a third-party or subclassed policy runs on
    the object tree (:class:`HybridCache`), the slow path that calls its hooks."""
    config.validate()
    pol = _policy(policy)
    spec = config.spec()
    if trace.input_tokens is None:
        raise ConfigError(
            "the hybrid structure needs token ids: a token-form trace (marconi, native with "
            "input_tokens, a text format, or a generator), not block hashes"
        )
    values, offsets = trace.sequence_tokens()
    if fast and not check_every and HAVE_NUMBA and hybrid_code(pol) >= 0:
        return _replay_compiled(trace, pol, config, on_step)
    return _replay_objects(trace, pol, config, spec, values, offsets, check_every, on_step, fast)


def _replay_objects(
    trace: Trace,
    pol: HybridPolicy,
    config: HybridConfig,
    spec: ModelSpec,
    values: I64,
    offsets: I64,
    check_every: int,
    on_step: Callable[[int], None] | None,
    fast: bool,
) -> HybridResult:
    """replay_hybrid on the object tree (:class:`HybridCache`), which calls the policy's
    hooks; ``values`` / ``offsets``: the trace's sequences (input + output tokens)."""
    inputs = trace.input_length
    n = len(trace)
    cache = HybridCache(config.capacity_bytes, spec, pol, config.locks)
    hits = np.zeros(n, dtype=np.int64)
    tuner = _Tuner(trace, pol, config, fast) if isinstance(pol, Marconi) and pol.tunes else None
    peak = 0
    start = time.perf_counter()
    offs = offsets.tolist()
    inp = inputs.tolist()
    for r in range(n):
        seq = values[offs[r] : offs[r + 1]]
        m = cache.lookup(seq[: inp[r]])
        hits[r] = min(m.reusable, inp[r])
        if tuner is not None:
            tuner.before_insert(r)
        cache.admit(seq, inp[r], m)
        if tuner is not None:
            tuner.after_insert(r, cache.num_evict_calls)
        peak = max(peak, cache.used)
        if check_every and r % check_every == 0:
            cache.check()
        if on_step is not None:
            on_step(r)
    elapsed = time.perf_counter() - start
    if check_every:
        cache.check()
    history = tuner.history if tuner is not None else []
    return _result(pol, config, spec, hits, inputs, _counters(cache, peak), elapsed, history)


def _counters(cache: HybridCache, peak: int) -> dict[str, int]:
    """The object tree's totals at the end of a replay (``peak``: its most bytes used)."""
    return {
        "bytes_used": cache.used,
        "peak_bytes": peak,
        "bytes_written": cache.bytes_written,
        "bytes_evicted": cache.bytes_evicted,
        "num_nodes": cache.num_nodes,
        "num_checkpoints": cache.num_checkpoints,
        "num_checkpoints_written": cache.num_checkpoints_written,
        "num_evicted_nodes": cache.num_evicted_nodes,
        "num_merges": cache.num_merges,
        "num_rejected": cache.num_rejected,
    }


def _result(
    pol: HybridPolicy,
    config: HybridConfig,
    spec: ModelSpec,
    hits: I64,
    inputs: I64,
    counters: dict[str, int],
    elapsed: float,
    history: list[tuple[int, float]],
) -> HybridResult:
    metrics = hybrid_metrics(spec, inputs, hits)
    metrics["capacity_bytes"] = config.capacity_bytes
    metrics.update(counters)
    metrics.update(
        kv_bytes_per_token=spec.kv_bytes_per_token,
        state_bytes_per_checkpoint=spec.state_bytes_per_checkpoint if spec.num_ssm_layers else 0,
    )
    if isinstance(pol, Marconi):
        metrics["alpha"] = pol.current_alpha
    return HybridResult(
        pol.spec(), config.capacity_bytes, spec.name, metrics, elapsed, hits, inputs, history
    )


def _replay_compiled(
    trace: Trace, pol: HybridPolicy, config: HybridConfig, on_step: Callable[[int], None] | None
) -> HybridResult:
    """replay_hybrid on the compiled tree; Marconi's tuner runs where the kernel stops for
    it (before request W's insertion), as in the object loop."""
    spec = config.spec()
    values, offsets = trace.sequence_tokens()
    inputs = trace.input_length
    n = len(trace)
    k = HybridKernel(values, offsets, inputs, pol, spec, config.capacity_bytes, config.locks)
    history: list[tuple[int, float]] = []
    alpha = 0.0
    if isinstance(pol, Marconi):  # as bind_cache does on the object tree
        alpha = pol.current_alpha = 0.0 if pol.alpha is None else pol.alpha
    step = 256 if on_step is not None else max(n, 1)
    reported = 0
    start = time.perf_counter()
    while k.next_request < n:
        if k.run(min(n, k.next_request + step), alpha) == ST_TUNE:
            assert isinstance(pol, Marconi)
            r = k.next_request
            alpha = _tune_compiled(trace, r + 1, pol, config)
            pol.current_alpha = alpha
            history.append((r, alpha))
            every = pol.retune_every
            k.tune_at = r + 1 + every if every else n + 1
        if on_step is not None:
            for r in range(reported, k.next_request):
                on_step(r)
            reported = k.next_request
    elapsed = time.perf_counter() - start
    return _result(pol, config, spec, k.hits, inputs, k.counters(), elapsed, history)


class _Tuner:
    """When and on what Marconi's alpha is tuned (see the module docstring)."""

    def __init__(self, trace: Trace, pol: Marconi, config: HybridConfig, fast: bool) -> None:
        self.fast = fast
        self.trace = trace
        self.pol = pol
        self.config = config
        self.tune_at = -1  # 1-based request whose insertion tunes; -1: no eviction yet
        self.history: list[tuple[int, float]] = []

    def before_insert(self, r: int) -> None:
        if r + 1 != self.tune_at:
            return
        self.pol.current_alpha = tune_alpha(
            self.trace.take(np.arange(r + 1)), self.pol, self.config, self.fast
        )
        self.history.append((r, self.pol.current_alpha))
        every = self.pol.retune_every
        self.tune_at = r + 1 + every if every else len(self.trace) + 1

    def after_insert(self, r: int, num_evict_calls: int) -> None:
        if self.tune_at < 0 and num_evict_calls > 0:
            self.tune_at = math.ceil(self.pol.bootstrap_multiplier * (r + 1))


def hybrid_metrics(spec: ModelSpec, inputs: I64, hits: I64) -> dict[str, int | float]:
    """Hit ratios and prefill FLOPs saved, in total and per layer type."""
    n_in = int(inputs.sum())
    n_hit = int(hits.sum())
    nreq = int(inputs.shape[0])
    out: dict[str, int | float] = {
        "num_requests": nreq,
        "num_input_tokens": n_in,
        "num_hit_tokens": n_hit,
        "token_hit_ratio": n_hit / n_in if n_in else 0.0,
        "request_hit_ratio": float(np.count_nonzero(hits)) / nreq if nreq else 0.0,
    }
    out.update(spec.flops_saved(inputs, hits))
    return out


def window_score(spec: ModelSpec, inputs: I64, hits: I64, objective: str, window: int) -> float:
    """The tuner's objective over the last ``window`` requests (0: all of them): FLOPs saved
    (the simulator's) or the token hit ratio (the paper's words)."""
    if window:
        inputs, hits = inputs[-window:], hits[-window:]
    if objective == "hit_ratio":
        total = int(inputs.sum())
        return int(hits.sum()) / total if total else 0.0
    return float(spec.flops_saved(inputs, hits)["flops_saved"])


def _tune_one(trace: Trace, pol: Marconi, config: HybridConfig, fast: bool = True) -> float:
    res = replay_hybrid(trace, pol, config, fast=fast)
    return window_score(
        config.spec(), res.input_tokens, res.hit_tokens, pol.objective, pol.score_window
    )


def tune_alpha(trace: Trace, pol: Marconi, config: HybridConfig, fast: bool = True) -> float:
    """Replay ``trace`` once per alpha of the grid (a fresh cache each); the best by the
    objective, ties to the smallest alpha. Parallel on a process pool (``tune_jobs``), or
    on Ray when it is running. ``fast=False``: the replays on the object tree."""
    grid = pol.alpha_grid()
    return _best(grid, _map_grid(trace, grid, pol, config, fast))


def _tune_compiled(trace: Trace, n: int, pol: Marconi, config: HybridConfig) -> float:
    """tune_alpha on the trace's first ``n`` requests, compiled: the replays read the
    trace's own arrays (no copy) and run on ``tune_jobs`` threads (the kernel releases the
    GIL); on Ray when it is running."""
    try:
        import ray

        if ray.is_initialized():
            return tune_alpha(trace.take(np.arange(n)), pol, config)
    except ImportError:
        pass
    spec = config.spec()
    values, offsets = trace.sequence_tokens()
    offsets, inputs = offsets[: n + 1], trace.input_length[:n]

    def score(alpha: float) -> float:
        k = HybridKernel(
            values,
            offsets,
            inputs,
            pol.with_alpha(alpha),
            spec,
            config.capacity_bytes,
            config.locks,
        )
        k.run(n, alpha)
        return window_score(spec, inputs, k.hits, pol.objective, pol.score_window)

    grid = pol.alpha_grid()
    if pol.tune_jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=pol.tune_jobs) as ex:
            scores = list(ex.map(score, grid))
    else:
        scores = [score(a) for a in grid]
    return _best(grid, scores)


def _best(grid: Sequence[float], scores: Sequence[float]) -> float:
    """The alpha of the best score, ties to the smallest."""
    best, best_score = grid[0], scores[0]
    for a, s in zip(grid[1:], scores[1:], strict=True):
        if s > best_score:
            best, best_score = a, s
    return best


def _map_grid(
    trace: Trace, grid: Sequence[float], pol: Marconi, config: HybridConfig, fast: bool
) -> list[float]:
    args = [(trace, pol.with_alpha(a), config, fast) for a in grid]
    try:
        import ray

        if ray.is_initialized() and fast:
            remote = ray.remote(num_cpus=1)(_tune_one)
            ref = ray.put(trace)
            return list(ray.get([remote.remote(ref, a[1], a[2]) for a in args]))
    except ImportError:
        pass
    if pol.tune_jobs > 1:
        from prefixlab.procs import process_pool

        with process_pool(pol.tune_jobs) as ex:
            return list(ex.map(_tune_one, *zip(*args, strict=True)))
    return [_tune_one(*a) for a in args]
