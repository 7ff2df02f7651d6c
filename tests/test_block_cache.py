"""vLLM-style block cache scenarios on exact tiny pools, every expectation computed by hand.

Conventions: blocks are named b0..b{n-1}; a fresh pool hands out empty blocks in id order
(vLLM's free queue starts as [0, 1, ..., n-1]; its null block is not modelled, so vLLM's
11-block test pool is our 10-block pool). Hash-form traces give every block its key
directly: hash ids 0..K-1 are used so the dense key ids equal them (asserted).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Event, MatchResult, Removed
from prefixlab.policies import make_policy
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import BlockLayout, Request, Trace

I64 = npt.NDArray[np.int64]
BT = 4  # tokens per block


def arr(*values: int) -> I64:
    return np.array(values, dtype=np.int64)


def hash_layout(reqs: list[tuple[int, list[int]]], *, min_recompute_tokens: int = 1) -> BlockLayout:
    """Layout of a hash-form trace of (input_length, hash_ids) requests, no output tokens."""
    requests = [
        Request(arrival_s=float(r), input_length=n, output_length=0, hash_ids=h)
        for r, (n, h) in enumerate(reqs)
    ]
    trace = Trace.from_requests(requests, block_tokens=BT)
    layout = trace.block_layout(min_recompute_tokens=min_recompute_tokens)
    assert layout.keys.tolist() == layout.raw_keys.astype(np.int64).tolist()
    return layout


class LayoutRun:
    """Runs requests of a layout on a BlockCache with the replay contract, one phase at a time."""

    def __init__(self, layout: BlockLayout, capacity_blocks: int, spec: str = "vllm") -> None:
        self.layout = layout
        self.cache = BlockCache(
            capacity_blocks, make_policy(spec, "block"), layout.num_distinct_keys, block_tokens=BT
        )

    def start(self, r: int) -> tuple[MatchResult, I64]:
        cache, lay = self.cache, self.layout
        cache.view.now = float(r)
        cache.view.request_index = r
        keys = lay.request_keys(r)
        m = cache.match(keys[: int(lay.num_lookup_blocks[r])], int(lay.lookup_end_tokens[r]))
        held = cache.acquire(m, int(lay.num_blocks_held[r]))
        assert held is not None
        cache.commit(held, keys, m.num_hit_blocks)
        cache.check()
        return m, held

    def finish(self, held: I64) -> None:
        self.cache.release(held)
        self.cache.check()

    def serve(self, r: int) -> tuple[MatchResult, I64]:
        m, held = self.start(r)
        acquired = held.copy()  # see test_held_blocks_survive_other_releases
        self.finish(held)
        return m, acquired


def holders(cache: BlockCache, key: int) -> list[int]:
    found: list[int] = np.flatnonzero(cache.view.key == key).tolist()
    return found


def test_prefill_eviction_order_like_vllm() -> None:
    # A and B share a 3-block prefix (keys 0, 1, 2) and end in a partial block; C is 10
    # unrelated full blocks (keys 3..12); D repeats A. Pool of 10 blocks.
    layout = hash_layout(
        [
            (14, [0, 1, 2, 100]),  # A: 3 full blocks + 2 tokens
            (14, [0, 1, 2, 101]),  # B: same prefix, other tail
            (40, list(range(3, 13))),  # C: 10 full blocks
            (14, [0, 1, 2, 100]),  # D = A
        ]
    )
    assert layout.num_lookup_blocks.tolist() == [3, 3, 9, 3]  # cap: (len - 1) // 4
    run = LayoutRun(layout, 10)
    cache = run.cache

    m_a, a = run.start(0)
    assert m_a.num_hit_blocks == 0 and a.tolist() == [0, 1, 2, 3]  # empty blocks in id order
    # B runs concurrently: it shares A's 3 cached blocks and takes one new block.
    m_b, b = run.start(1)
    assert m_b.num_hit_tokens == 12 and b.tolist() == [0, 1, 2, 4]
    assert cache.view.ref[:5].tolist() == [2, 2, 2, 1, 1]

    run.finish(a)  # b3 (partial, keyless) -> front of the empty pool; b0..b2 still held by B
    run.finish(b)  # b4 (keyless) -> front; b2, b1, b0 -> free queue, tail first
    assert cache.num_cached_free == 3 and cache.num_available() == 10

    # C needs 10 blocks: keyless ones first, most recently freed first (b4, b3), then the
    # never-used b5..b9, and only then the cached ones in eviction order: b2, b1, b0.
    m_c, c = run.start(2)
    assert m_c.num_hit_blocks == 0
    assert c.tolist() == [4, 3, 5, 6, 7, 8, 9, 2, 1, 0]
    assert cache.cached_keys() == set(range(3, 13))
    run.finish(c)
    # Released tail first: b0 (key 12), b1 (11), b2 (10), b9 (9), b8, b7, b6, b5, b3, b4.
    # D misses and needs 4 blocks: the 4 deepest blocks of C go first.
    m_d, d = run.start(3)
    assert m_d.num_hit_blocks == 0 and d.tolist() == [0, 1, 2, 9]
    run.finish(d)
    assert cache.cached_keys() == {0, 1, 2, *range(3, 9)}


def test_keyless_output_blocks_reused_first() -> None:
    # A: 8 input tokens (keys 0, 1) + 4 output tokens -> 3 blocks, the output one keyless.
    requests = [
        Request(arrival_s=0.0, input_length=8, output_length=4, hash_ids=[0, 1]),
        Request(arrival_s=1.0, input_length=4, output_length=4, hash_ids=[2]),
    ]
    layout = Trace.from_requests(requests, block_tokens=BT).block_layout()
    assert layout.num_blocks_held.tolist() == [3, 2]
    run = LayoutRun(layout, 4)
    _, a = run.serve(0)
    assert a.tolist() == [0, 1, 2]
    # b2 went to the front of the empty pool, ahead of the never-used b3; b1, b0 are cached.
    _, b = run.serve(1)
    # B (lookup capped at (4 - 1) // 4 = 0 blocks) needs 2: b2 then b3; nothing evicted.
    assert b.tolist() == [2, 3]
    assert run.cache.cached_keys() == {0, 1, 2}


def test_recompute_cap_caches_a_duplicate() -> None:
    layout = hash_layout(
        [
            (8, [0, 1]),  # r0: two full blocks, both cached at the end
            (8, [0, 1]),  # r1: same prompt
            (24, list(range(2, 8))),  # r2: 6 unrelated blocks
            (9, [0, 1, 50]),  # r3: the prompt plus one token
        ]
    )
    # Cap (8 - 1) // 4 = 1: an 8-token prompt can hit only its first block.
    assert layout.num_lookup_blocks.tolist() == [1, 1, 5, 2]
    run = LayoutRun(layout, 8)
    cache = run.cache

    _, h0 = run.serve(0)
    assert h0.tolist() == [0, 1]  # queue after release: b1 (key 1), b0 (key 0)
    m1, h1 = run.serve(1)
    # Hit capped one block short: key 0 (b0); the last block is recomputed in b2 and cached
    # again under key 1, next to b1.
    assert m1.num_hit_tokens == 4 and h1.tolist() == [0, 2]
    assert holders(cache, 1) == [1, 2]
    assert not cache.view.is_primary[2]
    # A lookup takes the earliest-registered holder, b1.
    assert cache.match(arr(0, 1)).entries.tolist() == [0, 1]
    # Queue now: b1 (released by r0), b2, b0 (released by r1, tail first).

    # r2 takes the 5 empty blocks b3..b7 and evicts the front of the queue: b1.
    _, h2 = run.serve(2)
    assert h2.tolist() == [3, 4, 5, 6, 7, 1]
    assert holders(cache, 1) == [2]
    assert cache.view.is_primary[2]
    # The lookup falls back to the other holder.
    assert cache.match(arr(0, 1)).entries.tolist() == [0, 2]
    assert cache.cached_keys() == set(range(8))  # key 7 sits in b1

    # r3 (9 tokens, cap 2) hits both blocks b0, b2; its partial block evicts the queue's
    # front after them: b1 (key 7, released tail first by r2).
    m3, h3 = run.serve(3)
    assert m3.num_hit_tokens == 8 and h3.tolist() == [0, 2, 1]
    assert cache.cached_keys() == set(range(7))


def test_evicting_the_later_duplicate_keeps_the_primary() -> None:
    layout = hash_layout([(8, [0, 1]), (8, [0, 1]), (9, [0, 1, 60])])
    run = LayoutRun(layout, 3)
    cache = run.cache
    run.serve(0)  # b0 <- 0, b1 <- 1; queue b1, b0
    run.serve(1)  # hit b0 (capped), b2 <- 1 again; queue b1, b2, b0
    assert holders(cache, 1) == [1, 2]
    # r2 (9 tokens, cap 2) hits b0 and b1 (the primary), which leave the queue; its
    # partial block evicts the queue's front, the later holder b2.
    m2, h2 = run.serve(2)
    assert m2.num_hit_tokens == 8 and h2.tolist() == [0, 1, 2]
    assert holders(cache, 1) == [1]
    assert cache.match(arr(0, 1)).entries.tolist() == [0, 1]
    assert cache.cached_keys() == {0, 1}


@pytest.mark.parametrize(
    ("spec", "after_a", "b_held", "after_b"),
    [
        # vllm: A's release order b2, b1, b0; the bound 2 trims one: b2 (key 2), which goes to
        # the front of the empty pool. B takes b2, b3; its release puts 4 in the pool, the
        # bound trims the two oldest releases, b1 and b0.
        ("vllm", {0, 1}, [2, 3], {3, 4}),
        # lru: insertion order b0, b1, b2: the trim drops b0 (key 0, the parent!). B takes
        # b0, b3; then LRU order b1, b2, b0, b3 trims b1 and b2.
        ("lru", {1, 2}, [0, 3], {3, 4}),
    ],
)
def test_max_free_blocks_trims_in_policy_order(
    spec: str, after_a: set[int], b_held: list[int], after_b: set[int]
) -> None:
    cache = BlockCache(6, make_policy(spec, "block"), 8, block_tokens=BT, max_free_blocks=2)

    def serve(keys: list[int], now: float) -> list[int]:
        cache.view.now = now
        k = arr(*keys)
        m = cache.match(k)
        held = cache.acquire(m, len(keys))
        assert held is not None
        out: list[int] = held.tolist()  # before release (see the aliasing test below)
        cache.commit(held, k, m.num_hit_blocks)
        cache.release(held)
        cache.check()
        return out

    assert serve([0, 1, 2], 0) == [0, 1, 2]
    assert cache.cached_keys() == after_a and cache.num_cached_free == 2
    assert serve([3, 4], 1) == b_held
    assert cache.cached_keys() == after_b and cache.num_cached_free == 2
    # Trimmed blocks go to the front of the empty pool, first victim first: b1 is next.
    assert serve([5], 2) == [1]


class RemovedLog:
    def __init__(self) -> None:
        self.events: list[Removed] = []

    def on_event(self, event: Event) -> None:
        if isinstance(event, Removed):
            self.events.append(event)


def test_trimming_is_an_eviction_by_policy() -> None:
    # Keeping a bounded free pool within its bound is the policy's choice (the hash-table
    # report's pool of size K), so it is reported and counted as an eviction.
    log = RemovedLog()
    cache = BlockCache(
        4, make_policy("vllm", "block"), 4, block_tokens=BT, max_free_blocks=1, observers=[log]
    )
    k = arr(0, 1)
    held = cache.acquire(cache.match(k), 2)
    assert held is not None
    cache.commit(held, k, 0)
    cache.release(held)  # 2 cached-free > 1: key 1 (released first) is trimmed
    assert [e.keys.tolist() for e in log.events] == [[1]]
    assert log.events[0].evicted is True


def test_partial_block_full_hit_without_recompute() -> None:
    # The hash-table report's setting: cache the trailing partial block and recompute
    # nothing. Two identical 15-token prompts with 16-token blocks: one (partial) block each.
    tokens = list(range(15))
    trace = Trace.from_requests(
        [
            Request(arrival_s=float(i), input_length=15, output_length=0, input_tokens=tokens)
            for i in range(2)
        ]
    )
    report = ReplayConfig(
        capacity_blocks=4, block_tokens=16, cache_partial=True, min_recompute_tokens=0
    )
    layout = trace.block_layout(16, cache_partial=True, min_recompute_tokens=0)
    assert layout.num_lookup_blocks.tolist() == [1, 1]
    assert layout.lookup_end_tokens.tolist() == [15, 15]
    assert replay(trace, "vllm", report).hit_tokens.tolist() == [0, 15]
    # Either setting alone is not enough: the default cap recomputes >= 1 token of 15, so no
    # block can hit; without cache_partial the 15-token prompt has no full block to cache.
    for partial, recompute in ((True, 1), (False, 0)):
        config = ReplayConfig(
            capacity_blocks=4,
            block_tokens=16,
            cache_partial=partial,
            min_recompute_tokens=recompute,
        )
        assert replay(trace, "vllm", config).hit_tokens.tolist() == [0, 0]

    cache = BlockCache(4, make_policy("vllm", "block"), layout.num_distinct_keys, block_tokens=16)
    keys = layout.request_keys(0)
    for r in range(2):
        m = cache.match(keys[:1], 15)
        held = cache.acquire(m, 1)
        assert held is not None
        assert (m.num_hit_tokens, held.tolist()) == ((0, [0]) if r == 0 else (15, [0]))
        cache.commit(held, keys, m.num_hit_blocks)
        cache.release(held)
        cache.check()


def test_miss_event_tokens_for_a_partial_block() -> None:
    from prefixlab.cache.events import Miss

    misses: list[Miss] = []

    class Log:
        def on_event(self, event: Event) -> None:
            if isinstance(event, Miss):
                misses.append(event)

    t = Trace.from_requests([Request(0.0, 5, 0, input_tokens=[1, 2, 3, 4, 5])])
    cfg = ReplayConfig(
        capacity_blocks=8, block_tokens=4, cache_partial=True, min_recompute_tokens=0
    )
    replay(t, "lru", cfg, observers=[Log()])
    assert (misses[0].num_blocks, misses[0].num_tokens) == (2, 5)
    assert np.sum([m.num_tokens for m in misses]) == 5


def start_keys(cache: BlockCache, keys: list[int], extra_blocks: int = 0) -> I64 | None:
    k = arr(*keys)
    m = cache.match(k)
    held = cache.acquire(m, len(keys) + extra_blocks)
    if held is not None:
        cache.commit(held, k, m.num_hit_blocks)
    cache.check()
    return held


def in_use(cache: BlockCache) -> int:
    return int(np.count_nonzero(cache.view.ref > 0))


def test_capacity_in_use_never_exceeds_pool() -> None:
    cache = BlockCache(6, make_policy("vllm", "block"), 16, block_tokens=BT)
    a = start_keys(cache, [0, 1, 2])
    b = start_keys(cache, [3, 4], extra_blocks=1)  # 2 keyed + 1 output block
    assert a is not None and b is not None
    assert in_use(cache) == 6 and cache.num_available() == 0
    # A 1-block request cannot fit while A and B hold all 6 blocks.
    assert start_keys(cache, [5]) is None
    # A second user of A's prefix needs only one new block: still none available.
    assert start_keys(cache, [0, 1, 2, 6]) is None
    cache.release(b)
    cache.check()
    # B's output block went back empty, its 2 keyed blocks are cached-free: 3 available.
    assert in_use(cache) == 3 and cache.num_available() == 3
    # D shares A's whole prefix (pinned, ref 2) and needs 3 new blocks: the empty b5 first,
    # then B's blocks in release order b4 (key 4), b3 (key 3).
    d = start_keys(cache, [0, 1, 2, 6, 7, 8])
    assert d is not None and d.tolist() == [0, 1, 2, 5, 4, 3]
    assert cache.view.ref[:3].tolist() == [2, 2, 2]
    assert in_use(cache) == 6 and cache.cached_keys() == {0, 1, 2, 6, 7, 8}
    cache.release(a)
    cache.release(d)
    cache.check()
    assert in_use(cache) == 0 and cache.num_available() == 6


def snapshot(cache: BlockCache) -> tuple[object, ...]:
    v = cache.view
    return (
        v.ref.tolist(),
        v.key.tolist(),
        v.last_access.tolist(),
        v.hits.tolist(),
        cache.key_block.tolist(),
        cache.num_cached_free,
        cache.num_available(),
    )


@pytest.mark.parametrize("spec", ["vllm", "lru", "hashtable"])
def test_acquire_none_changes_nothing(spec: str) -> None:
    cache = BlockCache(4, make_policy(spec, "block"), 16, block_tokens=BT)
    a = start_keys(cache, [0, 1])
    assert a is not None
    cache.release(a)  # free queue b1 (key 1), b0 (key 0); empty b2, b3
    before = snapshot(cache)
    cache.view.now = 1.0
    # 5 blocks: hits b0, b1 (both free, they would be pinned) + 3 new; only b2, b3 remain.
    k = arr(0, 1, 2, 3, 4)
    m = cache.match(k)
    assert m.num_hit_blocks == 2
    assert cache.acquire(m, 5) is None
    assert snapshot(cache) == before
    cache.check()
    # The eviction order is intact: a 3-block miss takes b2, b3, then the first victim.
    # vllm: b1 (released first); lru: b0 (inserted first); hashtable: b1 (deepest of t=0).
    held = start_keys(cache, [5, 6, 7])
    assert held is not None
    first_victim = {"vllm": 1, "lru": 0, "hashtable": 1}[spec]
    assert held.tolist() == [2, 3, first_victim]


def test_held_blocks_survive_other_releases() -> None:
    cache = BlockCache(4, make_policy("vllm", "block"), 4, block_tokens=BT)
    c = start_keys(cache, [], extra_blocks=1)  # C: one keyless block, b0
    k = arr(0, 1)
    a = start_keys(cache, [0, 1])  # A: b1, b2, straight from the empty pool
    assert c is not None and a is not None
    assert c.tolist() == [0] and a.tolist() == [1, 2]
    cache.release(c)  # b0 goes back to the empty pool
    cache.check()
    assert a.tolist() == [1, 2]  # A still holds b1, b2
    cache.release(a)
    cache.check()
    assert cache.cached_keys() == {0, 1}
    assert cache.match(k).entries.tolist() == [1, 2]


def test_acquire_exactly_fits_with_own_free_hits() -> None:
    cache = BlockCache(4, make_policy("vllm", "block"), 16, block_tokens=BT)
    a = start_keys(cache, [0, 1])
    assert a is not None
    cache.release(a)
    # 4 blocks: 2 hits (free, pinned now) + 2 new = the 2 empty blocks. Nothing evicted.
    held = start_keys(cache, [0, 1, 2, 3])
    assert held is not None and held.tolist() == [0, 1, 2, 3]
    assert in_use(cache) == 4 and cache.cached_keys() == {0, 1, 2, 3}
