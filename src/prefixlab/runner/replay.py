"""The replay runner: requests one at a time, no time model (Marconi / LPC / libCacheSim).

For each request in arrival order::

    match (lookup blocks, capped)  ->  count reuse  ->  acquire (pin hits, take new blocks)
    ->  commit (cache its keyed blocks: input, and output when known)  ->  release

Logical time is the request index, so results do not depend on wall-clock speed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Hit, Miss, Observer
from prefixlab.cache.radix import RadixCache
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.metrics.replay import ReplayMetrics
from prefixlab.policies.base import EvictionPolicy, Policy, make_eviction_policy
from prefixlab.policies.block_admission import is_default, make_admission
from prefixlab.runner import _fast
from prefixlab.runner._fast_radix import radix_code, replay_radix_fast
from prefixlab.types import I64
from prefixlab.workload.trace import BlockLayout, Trace

STRUCTURES = ("block", "radix")


@dataclass(slots=True, frozen=True)
class ReplayConfig:
    """How to replay: structure, capacity and block-hashing options."""

    capacity_blocks: int
    structure: str = "block"
    block_tokens: int | None = None
    max_free_blocks: int | None = None
    cache_partial: bool = False
    min_recompute_tokens: int = 1
    extra_key: int | str | None = None
    #: False: requests never look the cache up (vLLM's --no-enable-prefix-caching); their
    #: blocks are still allocated and freed, so memory behaves as without prefix caching
    prefix_caching: bool = True
    #: the served model (a preset name): sizes the memory a policy reserves for itself
    model: str | None = None
    #: which new blocks are cached (:mod:`prefixlab.policies.block_admission`): ``all``
    #: (every engine), ``seen:n=2``, ...
    admission: str = "all"

    def validate(self) -> None:
        if self.structure not in STRUCTURES:
            raise ConfigError(
                f"unknown structure '{self.structure}'; known: {', '.join(STRUCTURES)}"
            )
        if self.capacity_blocks <= 0:
            raise ConfigError(f"capacity_blocks must be positive, got {self.capacity_blocks}")
        if self.max_free_blocks is not None and self.max_free_blocks < 0:
            raise ConfigError(f"max_free_blocks must be >= 0, got {self.max_free_blocks}")
        if self.min_recompute_tokens < 0:
            raise ConfigError(f"min_recompute_tokens must be >= 0, got {self.min_recompute_tokens}")
        if self.max_free_blocks is not None and self.structure != "block":
            raise ConfigError("max_free_blocks applies to the block structure only")
        if not isinstance(self.prefix_caching, bool):
            raise ConfigError(f"prefix_caching must be true or false, got {self.prefix_caching!r}")
        if not is_default(self.admission):
            make_admission(self.admission)  # names a bad spec now, not mid-run


@dataclass(slots=True)
class ReplayResult:
    """Summary of one replay plus per-request detail."""

    policy: str
    capacity_blocks: int
    structure: str
    metrics: dict[str, float | int]
    elapsed_s: float
    num_blocks_processed: int
    hit_tokens: I64 = field(repr=False)
    input_tokens: I64 = field(repr=False)

    def as_dict(self) -> dict[str, str | int | float]:
        out: dict[str, str | int | float] = {
            "policy": self.policy,
            "structure": self.structure,
            "capacity_blocks": self.capacity_blocks,
        }
        out.update(self.metrics)
        out["elapsed_s"] = self.elapsed_s
        out["blocks_per_s"] = (
            self.num_blocks_processed / self.elapsed_s if self.elapsed_s > 0 else 0.0
        )
        return out


def without_lookups(layout: BlockLayout) -> BlockLayout:
    """The layout with prefix caching off: no request looks up any block."""
    zeros = np.zeros_like(layout.num_lookup_blocks)
    return dataclasses.replace(layout, num_lookup_blocks=zeros, lookup_end_tokens=zeros.copy())


def reserved_blocks(policy: Policy, model: str | None, block_tokens: int) -> int:
    """Blocks of the capacity a policy takes for itself (LPC's predictor), rounded up."""
    need = int(policy.reserved_bytes)
    if need <= 0:
        return 0
    if model is None:
        raise ConfigError(
            f"policy '{policy.spec()}' reserves {need:,} bytes of GPU memory for itself (LPC's "
            "predictor, deducted from its cache as in the paper): give the model (--model, "
            "model.name) so they can be counted in blocks, or set predictor_bytes=0"
        )
    from prefixlab.model.spec import get_model

    per_block = get_model(model).kv_bytes_per_block(block_tokens)
    return -(-need // per_block)


def capped_requests(trace: Trace, block_tokens: int, min_recompute_tokens: int) -> int:
    """Requests whose input holds a full block that they can never hit because
    ``min_recompute_tokens`` leaves them no block to look up (a prompt of exactly one block
    must recompute its last token, so with the default of 1 its one block is never a hit)."""
    full = trace.input_length // block_tokens
    lookup = np.maximum(trace.input_length - min_recompute_tokens, 0) // block_tokens
    return int(np.count_nonzero((full > 0) & (lookup == 0)))


def capped_warning(trace: Trace, block_tokens: int, min_recompute_tokens: int) -> str | None:
    """A one-line warning when :func:`capped_requests` finds any, else None."""
    n = capped_requests(trace, block_tokens, min_recompute_tokens)
    return capped_message(n, len(trace), block_tokens, min_recompute_tokens)


def capped_message(
    n: int, num_requests: int, block_tokens: int, min_recompute_tokens: int
) -> str | None:
    """The warning for ``n`` capped requests of ``num_requests`` (None when n is 0)."""
    if not n:
        return None
    return (
        f"{n:,} of {num_requests:,} requests hold a full {block_tokens}-token block of input "
        f"but can never hit: min_recompute_tokens={min_recompute_tokens} leaves them no "
        "block to look up (0 lets a prompt be served whole from the cache)"
    )


def build_cache(
    config: ReplayConfig,
    policy: EvictionPolicy,
    layout: BlockLayout,
    observers: Sequence[Observer] = (),
) -> BlockCache | RadixCache:
    """Make the configured structure for a trace layout."""
    config.validate()
    admission = None if is_default(config.admission) else make_admission(config.admission)
    if config.structure == "block":
        return BlockCache(
            config.capacity_blocks,
            policy,
            layout.num_distinct_keys,
            block_tokens=layout.block_tokens,
            max_free_blocks=config.max_free_blocks,
            observers=observers,
            admission=admission,
        )
    return RadixCache(
        config.capacity_blocks,
        policy,
        layout.num_distinct_keys,
        block_tokens=layout.block_tokens,
        observers=observers,
        admission=admission,
    )


def replay(
    trace: Trace,
    policy: EvictionPolicy | str,
    config: ReplayConfig,
    observers: Sequence[Observer] = (),
    check_every: int = 0,
    on_step: Callable[[int], None] | None = None,
    fast: bool = True,
) -> ReplayResult:
    """Replay ``trace`` through one cache and policy.

    Args:
        trace: the requests.
        policy: a policy object (fresh, unbound) or a spec string such as ``"s3fifo"``.
        config: structure, capacity and hashing options.
        observers: extra event observers.
        check_every: run the structure's invariant checker every this many requests.
        on_step: called with each request index (progress bars).
        fast: use the replay kernel when it applies (numba installed; the block cache;
            vllm, lru, fifo, sieve or a keyed policy such as opt, lfu or sglang-lru; no
            observers, checks or step callback; the admission ``all``). It gives the same
            results as the generic path (tested), compiled, or interpreted under
            ``NUMBA_DISABLE_JIT=1``.
    """
    config.validate()
    pol = make_eviction_policy(policy, config.structure) if isinstance(policy, str) else policy
    if pol.requires_engine:
        raise ConfigError(
            f"policy '{pol.name}' reads the engine's waiting queue: run it with the engine "
            'runner (prefixlab simulate, or runner kind = "engine"), not replay'
        )
    layout = trace.block_layout(
        config.block_tokens, config.extra_key, config.cache_partial, config.min_recompute_tokens
    )
    if not config.prefix_caching:
        layout = without_lookups(layout)
    reserved = reserved_blocks(pol, config.model, layout.block_tokens)
    if reserved:
        if reserved >= config.capacity_blocks:
            raise ConfigError(
                f"policy '{pol.spec()}' reserves {reserved:,} blocks, the whole "
                f"capacity of {config.capacity_blocks:,}"
            )
        config = dataclasses.replace(config, capacity_blocks=config.capacity_blocks - reserved)
    if fast and _fast_applies(pol, config, observers, check_every, on_step):
        res = _replay_fast(trace, pol, config, layout)
    else:
        res = _replay_generic(trace, pol, config, layout, observers, check_every, on_step)
    res.metrics["num_reserved_blocks"] = reserved
    return res


def _replay_generic(
    trace: Trace,
    pol: EvictionPolicy,
    config: ReplayConfig,
    layout: BlockLayout,
    observers: Sequence[Observer],
    check_every: int,
    on_step: Callable[[int], None] | None,
) -> ReplayResult:
    """replay on the cache objects, which call the policy's hooks and tell the observers."""
    n = len(trace)
    metrics = ReplayMetrics(n)
    all_obs: list[Observer] = [metrics, *observers]
    cache = build_cache(config, pol, layout, all_obs)
    if pol.needs_future:
        pol.prepare(layout)
    if pol.needs_trace:
        pol.prepare_trace(trace, "arrival")
    view = cache.view
    keys_all, offs = layout.keys, layout.key_offsets
    num_lookup = layout.num_lookup_blocks.tolist()
    lookup_end = layout.lookup_end_tokens.tolist()
    held_blocks = layout.num_blocks_held.tolist()
    bt = layout.block_tokens
    start = time.perf_counter()
    for r in range(n):
        view.now = float(r)
        view.request_index = r
        keys = keys_all[offs[r] : offs[r + 1]]
        nl = num_lookup[r]
        m = cache.match(keys[:nl], lookup_end[r])
        handle = cache.acquire(m, held_blocks[r], keys[m.num_hit_blocks :])
        if handle is None:
            raise _capacity_error(trace, r, held_blocks[r], config, bt)
        for obs in all_obs:
            obs.on_event(Hit(r, m.num_hit_blocks, m.num_hit_tokens))
            obs.on_event(Miss(r, nl - m.num_hit_blocks, lookup_end[r] - m.num_hit_tokens))
        cache.commit(handle, keys, m.num_hit_blocks)  # type: ignore[arg-type]
        cache.release(handle)  # type: ignore[arg-type]
        if check_every and r % check_every == 0:
            cache.check()
        if on_step is not None:
            on_step(r)
    elapsed = time.perf_counter() - start
    if check_every:
        cache.check()
    return _result(trace, pol, config, layout, metrics, elapsed)


def _result(
    trace: Trace,
    pol: EvictionPolicy,
    config: ReplayConfig,
    layout: BlockLayout,
    metrics: ReplayMetrics,
    elapsed_s: float,
) -> ReplayResult:
    summary = metrics.summary(trace.input_length)
    if not is_default(config.admission):
        summary["num_admitted_blocks"] = metrics.num_admitted_blocks
        summary["num_rejected_blocks"] = metrics.num_rejected_blocks
    return ReplayResult(
        policy=pol.spec(),
        capacity_blocks=config.capacity_blocks,
        structure=config.structure,
        metrics=summary,
        elapsed_s=elapsed_s,
        num_blocks_processed=int(layout.num_blocks_held.sum()),
        hit_tokens=metrics.hit_tokens,
        input_tokens=trace.input_length,
    )


def _fast_applies(
    pol: EvictionPolicy,
    config: ReplayConfig,
    observers: Sequence[Observer],
    check_every: int,
    on_step: Callable[[int], None] | None,
) -> bool:
    if not is_default(config.admission):
        return False  # the kernels cache every block
    code = _fast.kernel_code(pol) if config.structure == "block" else radix_code(pol)
    return _fast.HAVE_NUMBA and code >= 0 and not observers and not check_every and on_step is None


def _replay_fast(
    trace: Trace, pol: EvictionPolicy, config: ReplayConfig, layout: BlockLayout
) -> ReplayResult:
    _fast.warm_up()
    if pol.needs_future:
        pol.prepare(layout)
    if pol.needs_trace:
        pol.prepare_trace(trace, "arrival")
    start = time.perf_counter()
    args = (
        layout.keys,
        layout.key_offsets,
        layout.num_lookup_blocks,
        layout.lookup_end_tokens,
        layout.num_blocks_held,
        config.capacity_blocks,
        layout.num_distinct_keys,
        layout.block_tokens,
        pol,
    )
    if config.structure == "block":
        hit_tokens, hit_blocks, evictions, failed = _fast.replay_fast(*args, config.max_free_blocks)
    else:
        hit_tokens, hit_blocks, evictions, failed = replay_radix_fast(*args)
    elapsed = time.perf_counter() - start
    if failed >= 0:
        held = int(layout.num_blocks_held[failed])
        raise _capacity_error(trace, failed, held, config, layout.block_tokens)
    # The kernel records exactly what the Hit / Miss / Removed events would carry.
    metrics = ReplayMetrics(len(trace))
    metrics.hit_tokens = hit_tokens
    metrics.hit_blocks = hit_blocks
    metrics.miss_blocks = layout.num_lookup_blocks - hit_blocks
    metrics.num_evictions = evictions
    return _result(trace, pol, config, layout, metrics, elapsed)


def capacity_error(
    r: int, held: int, input_tokens: int, output_tokens: int, capacity: int, block_tokens: int
) -> CapacityError:
    """The error for request r, which needs more blocks than the whole cache holds."""
    return CapacityError(
        f"request {r} needs {held} blocks of {block_tokens} tokens "
        f"({input_tokens} input + {output_tokens} output tokens) but the cache holds "
        f"{capacity} blocks in all; raise the capacity"
    )


def _capacity_error(
    trace: Trace, r: int, held: int, config: ReplayConfig, block_tokens: int
) -> CapacityError:
    inp, out = int(trace.input_length[r]), int(trace.output_length[r])
    return capacity_error(r, held, inp, out, config.capacity_blocks, block_tokens)
