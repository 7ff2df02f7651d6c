"""Conformance suite generated for every registered policy on every structure it applies to.

Each (policy, structure) pair is driven step by step through the cache lifecycle the replay
runner uses (match -> acquire -> commit -> release), and after every step the suite asserts:

* the structure's own ``check()`` invariants;
* capacity accounting (block: pinned + cached-free + empty == capacity; radix: tree pages +
  reserved pages <= capacity);
* pinned entries are never evicted, and every victim is an entry the structure announced as
  evictable (a guard policy wraps the policy under test and inspects each victim);
* the policy's view of what is evictable equals the structure's;
* hits are real prefixes and maximal; a committed request leaves all its keys cached.

Replays through :func:`prefixlab.runner.replay.replay` then check the metrics (hits + misses ==
lookups), determinism, ``clone()``, pickling and token-form == hash-form equivalence.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Event, Hit, MatchResult, Miss, Removed
from prefixlab.cache.radix import RadixCache, RadixHandle
from prefixlab.policies import EntryView, EvictionPolicy, make_policy, registered
from prefixlab.runner.replay import ReplayConfig, ReplayResult, build_cache, replay
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.trace import BlockLayout, Request, Trace, to_hash_form

I64 = npt.NDArray[np.int64]
Cache = BlockCache | RadixCache

# --------------------------------------------------------------------------- traces


def _chat_trace() -> Trace:
    """Hand-shaped token trace (block_tokens=4) covering the lifecycle's corner cases.

    Six sessions over three system prompts (8 and 12 tokens: whole blocks; 6: a partial
    block) extend their history turn by turn. Some outputs carry token ids (their blocks get
    keys), some only a length. Session 1's prompts are padded to a multiple of 4 tokens, so
    the recompute cap leaves their last block as a duplicate key. An FAQ prompt (16 tokens)
    recurs verbatim, one request is sent twice in a row, and a 1-token prompt appears.
    """
    rng = np.random.default_rng(11)

    def toks(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, 1_000_000, n)]

    systems = [toks(8), toks(12), toks(6)]
    faq = systems[0] + toks(8)
    history = {s: list(systems[s % 3]) for s in range(6)}
    reqs: list[Request] = []

    def add(prompt: list[int], out: list[int] | None, out_len: int, sid: str, turn: int) -> None:
        reqs.append(
            Request(
                arrival_s=float(len(reqs)),
                input_length=len(prompt),
                output_length=out_len,
                session_id=sid,
                turn=turn,
                input_tokens=prompt,
                output_tokens=out,
            )
        )

    for turn in range(7):
        for s in range(6):
            if (turn + s) % 4 == 3:
                continue
            user_len = int(rng.integers(1, 10))
            if s == 1:
                user_len += (-len(history[s]) - user_len) % 4
            prompt = history[s] + toks(user_len)
            out_len = int(rng.integers(0, 8))
            out = toks(out_len) if (turn + s) % 2 == 0 else None
            add(prompt, out, out_len, f"s{s}", turn)
            history[s] = prompt + (out if out is not None else toks(out_len))
        add(list(faq), None, turn % 3, "faq", turn)
        if turn == 2:
            add(list(reqs[-2].input_tokens or ()), None, 4, "dup", 0)
        if turn == 4:
            add(toks(1), toks(2), 2, "tiny", 0)
    return Trace.from_requests(reqs, name="chat")


def _sessions_trace(seed: int, preset: str) -> Trace:
    return generate_sessions(
        num_sessions=10,
        num_system_prompts=3,
        system_tokens=64,
        mean_user_tokens=24,
        mean_output_tokens=16,
        mean_turns=4.0,
        max_turns=6,
        preset=preset,
        seed=seed,
    )


@dataclass(frozen=True)
class TraceCase:
    name: str
    trace: Trace
    block_tokens: int
    max_held_blocks: int


def _case(name: str, trace: Trace, block_tokens: int) -> TraceCase:
    held = int(trace.block_layout(block_tokens).num_blocks_held.max())
    return TraceCase(name, trace, block_tokens, held)


TRACES: dict[str, TraceCase] = {
    "chat": _case("chat", _chat_trace(), 4),
    "sessions-chat": _case("sessions-chat", _sessions_trace(3, "chat"), 16),
    "sessions-agentic": _case("sessions-agentic", _sessions_trace(5, "agentic"), 8),
}


@dataclass(frozen=True)
class RunCase:
    """One trace at one capacity, with hashing options (capacity relative to the largest
    request: ``extra_blocks`` above it, times ``factor``)."""

    trace: str
    factor: int = 1
    extra_blocks: int = 0
    cache_partial: bool = False
    min_recompute_tokens: int = 1
    max_free_blocks: int | None = None

    def capacity(self) -> int:
        return TRACES[self.trace].max_held_blocks * self.factor + self.extra_blocks

    def config(self, structure: str) -> ReplayConfig:
        return ReplayConfig(
            capacity_blocks=self.capacity(),
            structure=structure,
            block_tokens=TRACES[self.trace].block_tokens,
            cache_partial=self.cache_partial,
            min_recompute_tokens=self.min_recompute_tokens,
            max_free_blocks=self.max_free_blocks if structure == "block" else None,
        )

    @property
    def id(self) -> str:
        parts = [self.trace, f"x{self.factor}+{self.extra_blocks}"]
        if self.cache_partial:
            parts.append("partial")
        if self.min_recompute_tokens != 1:
            parts.append(f"recompute{self.min_recompute_tokens}")
        if self.max_free_blocks is not None:
            parts.append(f"pool{self.max_free_blocks}")
        return "-".join(parts)


RUN_CASES = [
    RunCase("chat"),
    RunCase("chat", extra_blocks=3),
    RunCase("chat", factor=2),
    RunCase("chat", factor=2, cache_partial=True, min_recompute_tokens=0),
    RunCase("chat", extra_blocks=2, max_free_blocks=5),
    RunCase("sessions-chat"),
    RunCase("sessions-chat", factor=2, extra_blocks=1),
    RunCase("sessions-agentic", extra_blocks=4),
    RunCase("sessions-agentic", factor=3, cache_partial=True),
]

PAIRS = [
    pytest.param(name, structure, id=f"{name}-{structure}")
    for name, cls in registered().items()
    for structure in ("block", "radix")
    # lpc needs a trained model and prompt text; engine-only policies (the waiting queue)
    # run under the engine with the same checks in tests/test_unicache.py
    if structure in cls.structures and name != "lpc" and not cls.requires_engine
]
ENGINE_ONLY = {n for n, cls in registered().items() if cls.requires_engine}


def _fresh(name: str) -> EvictionPolicy:
    return make_policy(name)


# --------------------------------------------------------------------------- guard policy


class Guard(EvictionPolicy):
    """Wraps a policy: forwards every hook and checks each victim when it is chosen.

    It mirrors which entries the structure has announced as evictable (``on_evictable``
    minus ``on_pinned``/``on_remove``/evictions), so a victim must be one of them, unpinned
    (``view.ref == 0``) and not chosen twice.
    """

    def __init__(self, inner: EvictionPolicy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.structures = inner.structures  # type: ignore[misc]
        self.needs_future = inner.needs_future  # type: ignore[misc]
        self.needs_trace = inner.needs_trace  # type: ignore[misc]
        self.reads_access_metadata = inner.reads_access_metadata  # type: ignore[misc]
        self.evictable: set[int] = set()
        self.victim_refs: list[int] = []
        self.num_victim_blocks = 0
        self.block_tokens = 1

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self.inner.bind(view)

    def prepare(self, future: Any) -> None:
        self.inner.prepare(future)

    def on_insert(self, entries: I64) -> None:
        stale = self.evictable.intersection(entries.tolist())
        assert not stale, f"inserted entries {stale} are still announced evictable"
        self.inner.on_insert(entries)

    def on_access(self, entries: I64) -> None:
        self.inner.on_access(entries)

    def on_pinned(self, entries: I64) -> None:
        for e in entries.tolist():
            assert e in self.evictable, f"entry {e} pinned but never announced evictable"
            self.evictable.discard(e)
        self.inner.on_pinned(entries)

    def on_evictable(self, entries: I64) -> None:
        for e in entries.tolist():
            assert e not in self.evictable, f"entry {e} announced evictable twice"
            self.evictable.add(e)
        self.inner.on_evictable(entries)

    def on_remove(self, entries: I64) -> None:
        self.evictable.difference_update(entries.tolist())
        self.inner.on_remove(entries)

    def on_update(self, entries: I64) -> None:
        self.inner.on_update(entries)

    def on_split(self, upper: int, lower: int) -> None:
        self.inner.on_split(upper, lower)

    def on_miss(self, keys: I64) -> None:
        self.inner.on_miss(keys)

    def evict(self, n: int) -> I64:
        victims = self.inner.evict(n)
        assert victims.dtype.kind == "i", f"victims of dtype {victims.dtype}"
        got = victims.tolist()
        assert len(got) <= n, f"asked for {n} victims, got {len(got)}"
        assert len(set(got)) == len(got), f"a victim chosen twice: {got}"
        refs = self.view.ref[victims]
        self.victim_refs.extend(refs.tolist())
        assert (refs == 0).all(), f"pinned entries evicted: {got} with refs {refs.tolist()}"
        for e in got:
            assert e in self.evictable, f"victim {e} was never evictable (or already evicted)"
            self.evictable.discard(e)
        if len(got) < n:
            assert not self.evictable, f"{len(got)} of {n} victims while some are evictable"
        self.num_victim_blocks += int(self.view.size[victims].sum()) // self.block_tokens
        return victims

    def spec(self) -> str:
        return self.inner.spec()


class RemovedCounter:
    """Observer counting evicted pages (from ``Removed`` events)."""

    def __init__(self) -> None:
        self.num_evicted = 0

    def on_event(self, event: Event) -> None:
        if isinstance(event, Removed) and event.evicted:
            self.num_evicted += int(event.keys.shape[0])


# --------------------------------------------------------------------------- step checks


def _alive_radix_nodes(cache: RadixCache) -> list[int]:
    return [n for n, e in enumerate(cache.edges) if n != 0 and e is not None]


def _check_state(cache: Cache, guard: Guard) -> None:
    """Invariants that hold between any two lifecycle steps."""
    cache.check()
    v = cache.view
    cap = cache.capacity_blocks
    if isinstance(cache, BlockCache):
        pinned = int(np.count_nonzero(v.ref > 0))
        cached_free = cache.num_cached_free
        empty = cache.num_available() - cached_free
        assert empty >= 0 and cached_free >= 0
        assert pinned + cached_free + empty == cap, (pinned, cached_free, empty, cap)
        assert empty == int(np.count_nonzero((v.key < 0) & (v.ref == 0)))
        structure_free = set(np.flatnonzero((v.key >= 0) & (v.ref == 0)).tolist())
    else:
        assert cache.tree_blocks + cache.reserved_blocks <= cap, "radix over capacity"
        alive = _alive_radix_nodes(cache)
        pages = 0
        for n in alive:
            edge = cache.edges[n]
            assert edge is not None
            pages += int(edge.shape[0])
        assert pages == cache.tree_blocks
        structure_free = {n for n in alive if v.ref[n] == 0 and not cache.children[n]}
    assert guard.evictable == structure_free, (
        f"policy-visible evictable set differs from the structure's: "
        f"{sorted(guard.evictable ^ structure_free)[:10]}"
    )


def _path_keys(cache: RadixCache, path: I64) -> list[int]:
    out: list[int] = []
    for n in path.tolist():
        edge = cache.edges[n]
        assert edge is not None, f"matched node {n} is gone"
        out.extend(edge.tolist())
    return out


def _check_match(cache: Cache, keys: I64, num_lookup: int, hit: int) -> None:
    """A hit is a cached prefix of the lookup keys and cannot be extended."""
    assert 0 <= hit <= num_lookup
    if hit < num_lookup:
        assert int(keys[hit]) not in cache.cached_keys(), "match stopped at a cached key"


def _check_held(
    cache: Cache, handle: I64 | RadixHandle, keys: I64, hit: int, num_held: int, path: I64
) -> None:
    v = cache.view
    if isinstance(cache, BlockCache):
        assert isinstance(handle, np.ndarray)
        got = handle.tolist()
        assert len(got) == num_held and len(set(got)) == num_held, "held blocks malformed"
        assert all(0 <= b < cache.capacity_blocks for b in got)
        assert (v.ref[handle] > 0).all(), "a held block is not pinned"
        assert (v.key[handle[:hit]] == keys[:hit]).all(), "a hit block lost its key"
    else:
        assert isinstance(handle, RadixHandle)
        assert handle.reserved_blocks == num_held - hit
        assert _path_keys(cache, path) == keys[:hit].tolist(), "path is not the hit prefix"
        assert (v.ref[path] > 0).all(), "matched path not locked"


# --------------------------------------------------------------------------- drivers


@dataclass
class Driven:
    hit_tokens: list[int] = field(default_factory=list)
    hit_blocks: list[int] = field(default_factory=list)
    num_evicted: int = 0


def _setup(
    trace: Trace, policy: EvictionPolicy, config: ReplayConfig
) -> tuple[Cache, Guard, BlockLayout, RemovedCounter]:
    layout = trace.block_layout(
        config.block_tokens, config.extra_key, config.cache_partial, config.min_recompute_tokens
    )
    guard = Guard(policy)
    guard.block_tokens = layout.block_tokens
    counter = RemovedCounter()
    cache = build_cache(config, guard, layout, [counter])
    if policy.needs_future:
        policy.prepare(layout)
    if policy.needs_trace:
        policy.prepare_trace(trace, "arrival")
    return cache, guard, layout, counter


def drive(trace: Trace, policy: EvictionPolicy, config: ReplayConfig) -> Driven:
    """Replay like ``runner.replay`` one lifecycle step at a time, checking after each."""
    cache, guard, layout, counter = _setup(trace, policy, config)
    out = Driven()
    _check_state(cache, guard)
    for r in range(len(trace)):
        cache.view.now = float(r)
        cache.view.request_index = r
        keys = layout.request_keys(r)
        nl = int(layout.num_lookup_blocks[r])
        num_held = int(layout.num_blocks_held[r])
        m = cache.match(keys[:nl], int(layout.lookup_end_tokens[r]))
        _check_match(cache, keys, nl, m.num_hit_blocks)
        _check_state(cache, guard)
        handle = cache.acquire(m, num_held, keys[m.num_hit_blocks :])
        assert handle is not None, f"request {r} ({num_held} blocks) did not fit"
        _check_held(cache, handle, keys, m.num_hit_blocks, num_held, m.entries)
        _check_state(cache, guard)
        cache.commit(handle, keys, m.num_hit_blocks)  # type: ignore[arg-type]
        _check_state(cache, guard)
        assert set(keys.tolist()) <= cache.cached_keys(), "committed keys are not cached"
        cache.release(handle)  # type: ignore[arg-type]
        _check_state(cache, guard)
        if isinstance(cache, BlockCache):
            assert not (cache.view.ref > 0).any(), "a block stays pinned after release"
        else:
            assert cache.protected_blocks == 0 and cache.reserved_blocks == 0
        out.hit_tokens.append(m.num_hit_tokens)
        out.hit_blocks.append(m.num_hit_blocks)
    assert guard.victim_refs == [0] * len(guard.victim_refs)
    assert guard.num_victim_blocks == counter.num_evicted
    out.num_evicted = counter.num_evicted
    return out


def _expected_radix_refs(cache: RadixCache, handles: list[RadixHandle]) -> I64:
    refs = np.zeros(cache.view.num_entries, dtype=np.int64)
    for h in handles:
        node = h.last_node
        while node != 0:
            refs[node] += 1
            node = int(cache.view.parent[node])
    return refs


def drive_concurrent(
    trace: Trace, policy: EvictionPolicy, config: ReplayConfig, window: int
) -> int:
    """Keep up to ``window`` requests running at once (their entries stay pinned); when one
    does not fit, finish the oldest running one and retry. Returns the number of times a
    request had to wait."""
    cache, guard, layout, _ = _setup(trace, policy, config)
    running: list[tuple[Any, I64, int]] = []
    num_waits = 0

    def finish_oldest() -> None:
        handle, keys, hit = running.pop(0)
        cache.commit(handle, keys, hit)
        _check_state(cache, guard)
        cache.release(handle)
        _check_state(cache, guard)

    for r in range(len(trace)):
        cache.view.now = float(r)
        cache.view.request_index = r
        keys = layout.request_keys(r)
        nl = int(layout.num_lookup_blocks[r])
        num_held = int(layout.num_blocks_held[r])
        while True:
            m = cache.match(keys[:nl], int(layout.lookup_end_tokens[r]))
            handle = cache.acquire(m, num_held, keys[m.num_hit_blocks :])
            if handle is not None:
                break
            assert running, f"request {r} does not fit an idle cache"
            num_waits += 1
            _check_state(cache, guard)
            finish_oldest()
        running.append((handle, keys, m.num_hit_blocks))
        _check_held(cache, handle, keys, m.num_hit_blocks, num_held, m.entries)
        _check_state(cache, guard)
        if isinstance(cache, BlockCache):
            held = np.concatenate([h for h, _, _ in running])
            expected = np.bincount(held, minlength=cache.capacity_blocks)
        else:
            expected = _expected_radix_refs(cache, [h for h, _, _ in running])
        assert (cache.view.ref == expected).all(), "ref counts differ from running requests"
        if len(running) > window:
            finish_oldest()
    while running:
        finish_oldest()
    assert guard.victim_refs == [0] * len(guard.victim_refs)
    return num_waits


# --------------------------------------------------------------------------- helpers


def _replay(trace: Trace, policy: EvictionPolicy | str, config: ReplayConfig) -> ReplayResult:
    return replay(trace, policy, config, check_every=1)


def _same_result(a: ReplayResult, b: ReplayResult) -> None:
    assert a.hit_tokens.dtype == b.hit_tokens.dtype
    assert np.array_equal(a.hit_tokens, b.hit_tokens), "per-request hits differ"
    assert a.metrics == b.metrics


# --------------------------------------------------------------------------- tests


def test_every_policy_is_covered() -> None:
    names = {p.values[0] for p in PAIRS}
    flat = {n for n, cls in registered().items() if cls.structures & {"block", "radix"}}
    # lpc needs a trained model and prompt text; lpc-oracle runs its code here, and
    # tests/test_lpc.py runs lpc itself
    assert names == flat - {"lpc"} - ENGINE_ONLY, "a registered policy is missing from the suite"
    assert sorted(ENGINE_ONLY) == ["opt-online", "unicache-opt"]
    # the hybrid structure's policies have their own suite (tests/test_hybrid.py)
    assert set(registered()) - flat == {"vanilla", "vllm+", "sglang+", "marconi"}


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_invariants_after_every_step(name: str, structure: str, case: RunCase) -> None:
    """check(), capacity, victims unpinned, hits correct; the driver agrees with replay."""
    trace = TRACES[case.trace].trace
    config = case.config(structure)
    driven = drive(trace, _fresh(name), config)
    result = _replay(trace, _fresh(name), config)
    assert driven.hit_tokens == result.hit_tokens.tolist(), "driver and replay disagree"
    assert driven.num_evicted == result.metrics["num_evictions"]
    layout = trace.block_layout(
        config.block_tokens, None, config.cache_partial, config.min_recompute_tokens
    )
    assert sum(driven.hit_blocks) == result.metrics["num_hit_blocks"]
    assert result.metrics["num_lookup_blocks"] == int(layout.num_lookup_blocks.sum())


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_hits_plus_misses_equal_lookups(name: str, structure: str, case: RunCase) -> None:
    trace = TRACES[case.trace].trace
    config = case.config(structure)
    hits: dict[int, tuple[int, int]] = {}
    misses: dict[int, int] = {}

    class Recorder:
        def on_event(self, event: Event) -> None:
            if isinstance(event, Hit):
                hits[event.request] = (event.num_blocks, event.num_tokens)
            elif isinstance(event, Miss):
                misses[event.request] = event.num_blocks

    result = replay(trace, _fresh(name), config, observers=[Recorder()])
    layout = trace.block_layout(
        config.block_tokens, None, config.cache_partial, config.min_recompute_tokens
    )
    lookups = layout.num_lookup_blocks.tolist()
    m = result.metrics
    assert m["num_hit_blocks"] + sum(misses.values()) == m["num_lookup_blocks"]
    assert m["num_lookup_blocks"] == sum(lookups)
    assert m["num_requests"] == len(trace) == len(hits) == len(misses)
    assert m["num_input_tokens"] == int(trace.input_length.sum())
    assert m["num_hit_tokens"] == int(result.hit_tokens.sum())
    for r, (hit_blocks, hit_tokens) in hits.items():
        assert 0 <= hit_blocks <= lookups[r], f"request {r}: more hits than lookups"
        assert hit_blocks + misses[r] == lookups[r]
        assert hit_tokens == result.hit_tokens[r]
        assert hit_tokens <= max(int(trace.input_length[r]) - config.min_recompute_tokens, 0)
    assert 0.0 <= m["token_hit_ratio"] <= 1.0


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_pinned_entries_survive_concurrent_requests(name: str, structure: str) -> None:
    """Up to three requests hold their entries at once at a tight capacity."""
    tc = TRACES["chat"]
    config = ReplayConfig(
        capacity_blocks=2 * tc.max_held_blocks + 2,
        structure=structure,
        block_tokens=tc.block_tokens,
    )
    num_waits = drive_concurrent(tc.trace, _fresh(name), config, window=3)
    assert num_waits > 0, "the scenario never ran out of room: make it tighter"


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_failed_acquire_changes_nothing(name: str, structure: str) -> None:
    """A request that cannot fit while others are pinned is refused without side effects."""
    tc = TRACES["chat"]
    config = ReplayConfig(
        capacity_blocks=tc.max_held_blocks + 2, structure=structure, block_tokens=tc.block_tokens
    )
    cache, guard, layout, _ = _setup(tc.trace, _fresh(name), config)
    # Warm the cache with the first ten requests, then pin the largest request and try
    # each request again: every refusal must leave the state as it was.
    held_max = int(np.argmax(layout.num_blocks_held))
    for r in [*range(10), held_max]:
        cache.view.now = float(r)
        cache.view.request_index = r
        keys = layout.request_keys(r)
        nl = int(layout.num_lookup_blocks[r])
        m = cache.match(keys[:nl], int(layout.lookup_end_tokens[r]))
        handle = cache.acquire(m, int(layout.num_blocks_held[r]), keys[m.num_hit_blocks :])
        assert handle is not None
        cache.commit(handle, keys, m.num_hit_blocks)  # type: ignore[arg-type]
        if r != held_max:
            cache.release(handle)  # type: ignore[arg-type]
    refused = 0
    for r in range(len(tc.trace)):
        keys = layout.request_keys(r)
        nl = int(layout.num_lookup_blocks[r])
        before = (cache.view.ref.copy(), cache.view.key.copy(), cache.num_available())
        cached_before = cache.cached_keys()
        m = cache.match(keys[:nl], int(layout.lookup_end_tokens[r]))
        if m.num_hit_blocks == 0 and int(layout.num_blocks_held[r]) > cache.num_available():
            assert cache.acquire(m, int(layout.num_blocks_held[r])) is None
            refused += 1
            assert np.array_equal(cache.view.ref, before[0])
            if isinstance(cache, BlockCache):
                assert np.array_equal(cache.view.key, before[1])
            assert cache.num_available() == before[2]
            assert cache.cached_keys() == cached_before
            _check_state(cache, guard)
    assert refused > 0, "no request was refused: the scenario is too loose"


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_determinism(name: str, structure: str) -> None:
    for key in ("chat", "sessions-agentic"):
        tc = TRACES[key]
        config = ReplayConfig(
            capacity_blocks=tc.max_held_blocks + 5,
            structure=structure,
            block_tokens=tc.block_tokens,
        )
        first = _replay(tc.trace, _fresh(name), config)
        _same_result(first, _replay(tc.trace, name, config))
        # The default path (a compiled kernel for some policies) is deterministic too and
        # agrees with the checked generic path.
        default = replay(tc.trace, name, config)
        _same_result(default, replay(tc.trace, _fresh(name), config))
        _same_result(first, default)
        assert first.metrics["num_evictions"] > 0, "no eviction: the case tests nothing"


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_clone(name: str, structure: str) -> None:
    tc = TRACES["sessions-chat"]
    config = ReplayConfig(
        capacity_blocks=tc.max_held_blocks + 3, structure=structure, block_tokens=tc.block_tokens
    )
    policy = _fresh(name)
    clone = policy.clone()
    assert clone is not policy and type(clone) is type(policy)
    assert clone.spec() == policy.spec() and clone.params() == policy.params()
    assert make_policy(policy.spec()).params() == policy.params()
    used = _replay(tc.trace, policy, config)
    # A clone of a used policy is fresh: unbound, same parameters, same results.
    late_clone = policy.clone()
    assert not hasattr(late_clone, "view"), "clone() carried the bound state over"
    assert late_clone.spec() == policy.spec()
    _same_result(used, _replay(tc.trace, clone, config))
    _same_result(used, _replay(tc.trace, late_clone, config))


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_pickle(name: str, structure: str) -> None:
    tc = TRACES["chat"]
    config = ReplayConfig(
        capacity_blocks=tc.max_held_blocks + 3, structure=structure, block_tokens=tc.block_tokens
    )
    fresh = _fresh(name)
    fresh_copy = pickle.loads(pickle.dumps(fresh))
    assert type(fresh_copy) is type(fresh) and fresh_copy.spec() == fresh.spec()
    bound = _fresh(name)
    expected = _replay(tc.trace, bound, config)
    bound_copy = pickle.loads(pickle.dumps(bound))
    assert type(bound_copy) is type(bound) and bound_copy.params() == bound.params()
    for attr in ("ref", "key", "depth", "last_access", "hits"):
        assert np.array_equal(getattr(bound_copy.view, attr), getattr(bound.view, attr))
    # The copy carries the policy's state: it picks the same next victims.
    # (A radix tree offers only its leaves, possibly a single one: take one victim.)
    victims = bound.evict(1)
    assert victims.shape[0] == 1
    assert np.array_equal(bound_copy.evict(1), victims)
    _same_result(expected, _replay(tc.trace, fresh_copy, config))


@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: c.id)
@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_token_form_equals_hash_form(name: str, structure: str, case: RunCase) -> None:
    tc = TRACES[case.trace]
    config = case.config(structure)
    hashed = to_hash_form(tc.trace, tc.block_tokens)
    assert hashed.is_hash_form
    token_result = _replay(tc.trace, _fresh(name), config)
    hash_result = _replay(hashed, _fresh(name), config)
    _same_result(token_result, hash_result)


@pytest.mark.parametrize(("name", "structure"), PAIRS)
def test_evicts_when_only_hit_entries_are_evictable(name: str, structure: str) -> None:
    """One cached block, hit once, is the only evictable entry: a request that needs it
    must get it (``evict(n)`` returns fewer than n only if fewer are evictable)."""
    prompt = list(range(5))  # one full 4-token block + 1 token
    trace = Trace.from_requests(
        [
            Request(arrival_s=0.0, input_length=5, output_length=0, input_tokens=prompt),
            Request(arrival_s=1.0, input_length=5, output_length=0, input_tokens=prompt),
            Request(arrival_s=2.0, input_length=64, output_length=0, input_tokens=range(100, 164)),
        ]
    )
    config = ReplayConfig(capacity_blocks=16, structure=structure, block_tokens=4)
    driven = drive(trace, _fresh(name), config)
    assert driven.hit_tokens == [0, 4, 0]
    assert driven.num_evicted == 1


def test_acquire_result_is_owned_by_the_caller() -> None:
    """Two requests run at once; the first one's release must not change what the second
    holds (the engine runner keeps many handles alive)."""
    cache = BlockCache(8, _fresh("lru"), num_keys=4, block_tokens=4)
    no_hit = MatchResult(0, 0, np.zeros(0, dtype=np.int64))
    a = cache.acquire(no_hit, 2)
    b = cache.acquire(no_hit, 2)
    assert a is not None and b is not None
    held_b = b.tolist()
    assert sorted(a.tolist() + held_b) == [0, 1, 2, 3]
    cache.release(a)
    assert b.tolist() == held_b, "releasing request A changed the blocks request B holds"
    cache.release(b)
    cache.check()
    assert cache.num_available() == 8


class _EvictsPinned(EvictionPolicy):
    """A deliberately broken policy: its victims are the entries in use."""

    structures = frozenset({"block", "radix"})

    def evict(self, n: int) -> I64:
        return np.flatnonzero(self.view.ref > 0)[:n].astype(np.int64)


class _ForgetsHits(EvictionPolicy):
    """A deliberately broken policy: it never hears that a hit pinned an entry again."""

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._order: list[int] = []

    def on_evictable(self, entries: I64) -> None:
        self._order.extend(entries.tolist())

    def evict(self, n: int) -> I64:
        out, self._order = self._order[:n], self._order[n:]
        return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("structure", ["block", "radix"])
@pytest.mark.parametrize("policy", [_EvictsPinned, _ForgetsHits])
def test_the_guard_catches_broken_policies(structure: str, policy: type[EvictionPolicy]) -> None:
    """The suite's checks can fail: broken policies are caught at their first bad victim."""
    tc = TRACES["chat"]
    config = ReplayConfig(
        capacity_blocks=tc.max_held_blocks, structure=structure, block_tokens=tc.block_tokens
    )
    with pytest.raises(AssertionError, match=r"pinned entries evicted|was never evictable"):
        drive(tc.trace, policy(), config)
