"""Hypothesis stateful tests: cache structures and the segment queue against naive models.

Each machine drives the real object and a plain-Python reference model (lists, dicts, sets,
no numpy) with the same random operations and compares them after every step:

* ``BlockCache`` with the ``vllm`` policy against a one-list model of vLLM v1's free queue
  (and, when the free pool is unbounded, against ``tests/reference/vllm_pool_ref.py`` too);
* ``BlockCache`` with ``lru`` and ``fifo`` against an ordered list of keyed blocks;
* ``SegmentQueue`` (the lazy FIFO behind lru / fifo / vllm) against a list;
* ``RadixCache`` with ``lru`` (and ``fifo``) against a page-level trie with node boundaries.

A radix node split by a lookup keeps its age: the upper part is queued right behind the
lower one (``on_split``), so LRU (even after a lookup not followed by an acquire) and FIFO
keep their order. The last four tests pin that (they found the bug when it existed).

Requests draw chained-prefix-consistent keys: a request reuses a prefix of an earlier
sequence and extends it with fresh keys, so one key always has the same parent (a key names
a whole prefix, as a chained block hash does). Several requests run at once and finish in
random order.

Runs are deterministic (``derandomize=True``, no example database) so CI is reproducible.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from prefixlab.cache.block import BlockCache
from prefixlab.cache.radix import RadixCache, RadixHandle
from prefixlab.policies import make_policy
from prefixlab.policies._segments import SegmentQueue
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import Request, Trace
from tests.reference.vllm_pool_ref import BlockPool, KVCacheBlock

I64 = npt.NDArray[np.int64]

MAX_KEYS = 400
MAX_SEQ_BLOCKS = 8
MAX_RUNNING = 4
BLOCK_TOKENS = 4


def machine_settings(max_examples: int, steps: int) -> settings:
    """Deterministic, database-less settings (same examples on every CI run)."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def arr(values: list[int]) -> I64:
    return np.array(values, dtype=np.int64)


# ---------------------------------------------------------------------- request keys
@dataclass(frozen=True, slots=True)
class RequestShape:
    """How to build one request: share ``prefix_blocks`` of a known sequence, add fresh keys."""

    base: int
    prefix_blocks: int
    fresh_blocks: int
    lookup_blocks: int
    extra_blocks: int


REQUESTS = st.builds(
    RequestShape,
    base=st.integers(0, 63),
    prefix_blocks=st.integers(0, MAX_SEQ_BLOCKS),
    fresh_blocks=st.integers(0, 4),
    lookup_blocks=st.integers(0, MAX_SEQ_BLOCKS),
    extra_blocks=st.integers(0, 3),
)


class KeyForest:
    """Key sequences where every key has one fixed parent key (-1 for a first block)."""

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self.parent: dict[int, int] = {}
        self.seqs: list[list[int]] = []
        self.next_key = 0

    def make(self, shape: RequestShape) -> list[int]:
        """A new sequence: a prefix of a known one, extended by fresh keys."""
        base = self.seqs[shape.base % len(self.seqs)] if self.seqs else []
        keys = list(base[: shape.prefix_blocks])
        num_fresh = min(
            shape.fresh_blocks, MAX_SEQ_BLOCKS - len(keys), self.max_keys - self.next_key
        )
        for _ in range(num_fresh):
            self.parent[self.next_key] = keys[-1] if keys else -1
            keys.append(self.next_key)
            self.next_key += 1
        if keys and keys not in self.seqs:
            self.seqs.append(keys)
        return keys

    def known(self, index: int, length: int) -> list[int]:
        """A prefix of a known sequence (for probes)."""
        if not self.seqs:
            return []
        return self.seqs[index % len(self.seqs)][:length]


# ---------------------------------------------------------------------- block cache model
class NaiveBlockPool:
    """vLLM-style block pool with plain lists.

    ``empty`` holds keyless free blocks, front first (reused before any cached block).
    ``order`` is the policy's ranking of keyed blocks, front = next victim candidate:
    ``vllm``: only free keyed blocks, appended when released (tail block of a request first),
    removed when hit; ``lru``: every keyed block, moved to the back on insert and on hit;
    ``fifo``: every keyed block, appended on insert only. A victim is the first block of
    ``order`` with no reference.
    """

    def __init__(self, capacity: int, policy: str, max_free: int | None) -> None:
        self.capacity = capacity
        self.policy = policy
        self.max_free = max_free
        self.empty: list[int] = list(range(capacity))
        self.key: list[int | None] = [None] * capacity
        self.ref: list[int] = [0] * capacity
        self.holders: dict[int, list[int]] = {}  # key -> blocks, registration order
        self.order: list[int] = []

    def cached_free(self) -> list[int]:
        return [b for b in range(self.capacity) if self.key[b] is not None and self.ref[b] == 0]

    def match(self, lookup: list[int]) -> list[int]:
        hits: list[int] = []
        for k in lookup:
            blocks = self.holders.get(k)
            if not blocks:
                break
            hits.append(blocks[0])
        return hits

    def acquire(self, hits: list[int], num_blocks: int) -> list[int] | None:
        need = num_blocks - len(hits)
        revived = [b for b in hits if self.ref[b] == 0]
        if need > len(self.empty) + len(self.cached_free()) - len(revived):
            return None
        for b in hits:
            if self.policy == "lru":
                self._to_back(b)
            elif self.policy == "vllm" and self.ref[b] == 0:
                self.order.remove(b)
            self.ref[b] += 1
        fresh = self.empty[:need]
        del self.empty[:need]
        while len(fresh) < need:
            fresh.append(self._evict_one())
        for b in fresh:
            self.ref[b] = 1
        return hits + fresh

    def commit(self, held: list[int], keys: list[int], num_hit: int) -> None:
        for j in range(num_hit, len(keys)):
            b = held[j]
            assert self.key[b] is None
            self.key[b] = keys[j]
            self.holders.setdefault(keys[j], []).append(b)
            if self.policy in ("lru", "fifo"):
                self._to_back(b)

    def release(self, held: list[int]) -> None:
        tail_first = held[::-1]
        for b in tail_first:
            self.ref[b] -= 1
        freed = [b for b in tail_first if self.ref[b] == 0]
        self.empty[:0] = [b for b in freed if self.key[b] is None]
        if self.policy == "vllm":
            self.order.extend(b for b in freed if self.key[b] is not None)
        if self.max_free is not None:
            excess = len(self.cached_free()) - self.max_free
            if excess > 0:
                self.empty[:0] = [self._evict_one() for _ in range(excess)]

    def _to_back(self, b: int) -> None:
        if b in self.order:
            self.order.remove(b)
        self.order.append(b)

    def _evict_one(self) -> int:
        b = next(b for b in self.order if self.ref[b] == 0)
        self.order.remove(b)
        k = self.key[b]
        assert k is not None
        self.holders[k].remove(b)
        if not self.holders[k]:
            del self.holders[k]
        self.key[b] = None
        return b


@dataclass(slots=True)
class BlockRun:
    """A running request of the block-cache machine."""

    keys: list[int]
    num_hit: int
    held: I64  # the array acquire returned, used as is (it must not change under us)
    expected: list[int]  # the model's blocks
    ref_blocks: list[KVCacheBlock] | None
    committed: bool = False


class BlockCacheMachine(RuleBasedStateMachine):
    """BlockCache + one policy against :class:`NaiveBlockPool`, with concurrent requests."""

    POLICY = "vllm"

    def __init__(self) -> None:
        super().__init__()
        self.forest = KeyForest(MAX_KEYS)
        self.running: list[BlockRun] = []
        self.ref: BlockPool | None = None

    @initialize(
        capacity=st.integers(3, 20),
        max_free=st.one_of(st.none(), st.none(), st.integers(0, 12)),
    )
    def setup(self, capacity: int, max_free: int | None) -> None:
        policy = make_policy(self.POLICY, "block")
        self.cache = BlockCache(
            capacity, policy, MAX_KEYS, block_tokens=BLOCK_TOKENS, max_free_blocks=max_free
        )
        self.model = NaiveBlockPool(capacity, self.POLICY, max_free)
        if self.POLICY == "vllm" and max_free is None:
            self.ref = BlockPool(capacity)

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(shape=REQUESTS, commit_now=st.booleans())
    def start(self, shape: RequestShape, commit_now: bool) -> None:
        keys = self.forest.make(shape)
        lookup = keys[: shape.lookup_blocks]
        num_blocks = len(keys) + shape.extra_blocks
        m = self.cache.match(arr(lookup))
        hits = self.model.match(lookup)
        assert m.num_hit_blocks == len(hits)
        assert m.entries.tolist() == hits, "lookup took another holder than the model"
        held = self.cache.acquire(m, num_blocks)
        expected = self.model.acquire(hits, num_blocks)
        ref_blocks = self._ref_acquire(lookup, num_blocks, len(hits))
        if expected is None:
            assert held is None, "acquire succeeded although the pool cannot fit the request"
            return
        assert held is not None, "acquire failed although the pool can fit the request"
        assert held.tolist() == expected, "physical blocks differ from the model's"
        run = BlockRun(keys, len(hits), held, expected, ref_blocks)
        if ref_blocks is not None:
            assert [b.block_id for b in ref_blocks] == expected, "differs from vllm_pool_ref"
        self.running.append(run)
        if commit_now:
            self._commit(run)

    @precondition(lambda self: any(not r.committed for r in self.running))
    @rule(pick=st.integers(0, 15))
    def commit(self, pick: int) -> None:
        todo = [r for r in self.running if not r.committed]
        self._commit(todo[pick % len(todo)])

    @precondition(lambda self: bool(self.running))
    @rule(pick=st.integers(0, 15), commit_first=st.booleans())
    def release(self, pick: int, commit_first: bool) -> None:
        run = self.running.pop(pick % len(self.running))
        if commit_first and not run.committed:
            self._commit(run)
        self.cache.release(run.held)
        self.model.release(run.expected)
        if self.ref is not None and run.ref_blocks is not None:
            self.ref.free_blocks(reversed(run.ref_blocks))

    @rule(index=st.integers(0, 63), length=st.integers(0, MAX_SEQ_BLOCKS))
    def probe(self, index: int, length: int) -> None:
        lookup = self.forest.known(index, length)
        m = self.cache.match(arr(lookup))
        assert m.entries.tolist() == self.model.match(lookup)

    # ------------------------------------------------------------------ helpers
    def _commit(self, run: BlockRun) -> None:
        self.cache.commit(run.held, arr(run.keys), run.num_hit)
        self.model.commit(run.expected, run.keys, run.num_hit)
        if self.ref is not None and run.ref_blocks is not None:
            self.ref.cache_full_blocks(run.ref_blocks, run.keys, run.num_hit, len(run.keys))
        run.committed = True

    def _ref_acquire(
        self, lookup: list[int], num_blocks: int, num_hit: int
    ) -> list[KVCacheBlock] | None:
        """Drive the independent vLLM pool reference the same way (unbounded pool only)."""
        if self.ref is None:
            return None
        hits: list[KVCacheBlock] = []
        for k in lookup:
            block = self.ref.get_cached_block(k)
            if block is None:
                break
            hits.append(block)
        assert len(hits) == num_hit, "hit length differs from vllm_pool_ref"
        need = num_blocks - len(hits)
        if need > self.ref.num_free_blocks - sum(b.ref_cnt == 0 for b in hits):
            return None
        self.ref.touch(hits)
        return hits + self.ref.get_new_blocks(need)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def structure_is_consistent(self) -> None:
        self.cache.check()

    @invariant()
    def agrees_with_model(self) -> None:
        cache, model = self.cache, self.model
        v = cache.view
        assert v.key.tolist() == [-1 if k is None else k for k in model.key], "block keys"
        assert v.ref.tolist() == model.ref, "reference counts"
        assert cache.cached_keys() == set(model.holders), "cached keys"
        for k, blocks in model.holders.items():
            assert int(cache.key_block[k]) == blocks[0], f"lookup holder of key {k}"
        assert cache.num_cached_free == len(model.cached_free()), "cached-free count"
        assert cache.num_available() == len(model.empty) + len(model.cached_free())
        for run in self.running:
            assert run.held.tolist() == run.expected, "an array acquire returned has changed"
        if self.ref is not None:
            ref_keys = [b.block_hash for b in self.ref.blocks]
            assert ref_keys == model.key, "model and vllm_pool_ref disagree on keys"
            queue = self.ref.free_block_queue.block_ids()
            assert queue == model.empty + model.order, "model and vllm_pool_ref free queues"

    @invariant()
    def free_order_agrees(self) -> None:
        """On copies, take every available block: empty ones first, then victims in order."""
        cache, model = copy.deepcopy(self.cache), copy.deepcopy(self.model)
        n = cache.num_available()
        held = cache.acquire(cache.match(arr([])), n)
        assert held is not None
        assert held.tolist() == model.acquire([], n), "free-queue / eviction order"


class LRUBlockCacheMachine(BlockCacheMachine):
    POLICY = "lru"


class FIFOBlockCacheMachine(BlockCacheMachine):
    POLICY = "fifo"


@pytest.mark.parametrize(
    "machine",
    [BlockCacheMachine, LRUBlockCacheMachine, FIFOBlockCacheMachine],
    ids=["vllm", "lru", "fifo"],
)
def test_block_cache_matches_naive_pool(machine: type[BlockCacheMachine]) -> None:
    run_state_machine_as_test(machine, settings=machine_settings(max_examples=120, steps=50))


# ---------------------------------------------------------------------- segment queue
def dedupe(values: list[int]) -> list[int]:
    """Keep the first occurrence of each value, in order."""
    seen: set[int] = set()
    out: list[int] = []
    for x in values:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


class SegmentQueueMachine(RuleBasedStateMachine):
    """SegmentQueue against a list: push moves an id to the back, pop takes eligible ids."""

    MAX_ENTRIES = 700

    # Tiny queues, queues longer than pop's first 64-id window, and queues long enough for
    # a push to outgrow the initial 1024-slot buffer.
    @initialize(
        num_entries=st.one_of(st.integers(1, 16), st.integers(65, 200), st.integers(400, 600))
    )
    def setup(self, num_entries: int) -> None:
        self.num_entries = num_entries
        self.queue = SegmentQueue(num_entries)
        self.order: list[int] = []

    def _ids(self, raw: list[int]) -> list[int]:
        return dedupe([x % self.num_entries for x in raw])

    @rule(raw=st.lists(st.integers(0, MAX_ENTRIES - 1), max_size=40))
    def push(self, raw: list[int]) -> None:
        self._push(self._ids(raw))

    @rule(rnd=st.randoms(use_true_random=False))
    def push_all(self, rnd: random.Random) -> None:
        ids = list(range(self.num_entries))
        rnd.shuffle(ids)
        self._push(ids)

    def _push(self, ids: list[int]) -> None:
        self.queue.push(arr(ids))
        for i in ids:
            if i in self.order:
                self.order.remove(i)
            self.order.append(i)

    @rule(raw=st.lists(st.integers(0, MAX_ENTRIES - 1), max_size=40))
    def drop(self, raw: list[int]) -> None:
        ids = self._ids(raw)
        self.queue.drop(arr(ids))
        self.order = [i for i in self.order if i not in ids]

    @rule(
        n=st.integers(0, 80),
        density=st.sampled_from([None, 0.0, 0.0, 0.02, 0.3, 0.7, 1.0]),
        rnd=st.randoms(use_true_random=False),
    )
    def pop(self, n: int, density: float | None, rnd: random.Random) -> None:
        if density is None:
            got = self.queue.pop(n)
            eligible = [True] * self.num_entries
        else:
            eligible = [rnd.random() < density for _ in range(self.num_entries)]
            got = self.queue.pop(n, np.array(eligible, dtype=bool))
        expected = [i for i in self.order if eligible[i]][:n]
        assert got.tolist() == expected
        self.order = [i for i in self.order if i not in expected]

    @rule(extra=st.integers(1, 50))
    def resize(self, extra: int) -> None:
        self.num_entries = min(self.num_entries + extra, self.MAX_ENTRIES)
        self.queue.resize(self.num_entries)

    @invariant()
    def remaining_order(self) -> None:
        # Drain a copy so the real queue is left as it is.
        rest = copy.deepcopy(self.queue).pop(self.num_entries + 1)
        assert rest.tolist() == self.order


def test_segment_queue_matches_list() -> None:
    run_state_machine_as_test(
        SegmentQueueMachine, settings=machine_settings(max_examples=120, steps=50)
    )


# ---------------------------------------------------------------------- radix cache model
class NaiveRadix:
    """Page-level trie of the radix cache (one page = one key) with node boundaries.

    ``cached`` is prefix-closed (a key's parent is cached too). ``start`` holds the first
    page of every tree node: a node is a page run from a start page through children that
    are not starts. A match that ends inside a node splits it (its continuation becomes a
    start); an insert adds one new node. Locks are per page (a request locks its matched
    pages). Recency is per page, a stamp from a global counter (deeper pages later): ``lru``
    stamps on every hit (acquire) and every insert or re-insert (commit); ``fifo`` only when
    the page enters the tree. A node's recency is its newest page; splitting a node changes
    no stamp. Eviction removes the unlocked leaf node with the oldest recency.
    """

    def __init__(self, capacity: int, parent: dict[int, int], policy: str) -> None:
        self.capacity = capacity
        self.parent = parent
        self.policy = policy
        self.cached: set[int] = set()
        self.start: set[int] = set()
        self.lock: dict[int, int] = {}
        self.stamp: dict[int, int] = {}
        self.clock = 0
        self.reserved = 0

    def children(self) -> dict[int, list[int]]:
        """Cached children of every cached key (and of -1, the root)."""
        kids: dict[int, list[int]] = {}
        for c in self.cached:
            kids.setdefault(self.parent[c], []).append(c)
        return kids

    def node_pages(self, first: int, kids: dict[int, list[int]]) -> list[int]:
        pages = [first]
        while True:
            more = [c for c in kids.get(pages[-1], []) if c not in self.start]
            if not more:
                return pages
            pages.append(more[0])

    def hit_length(self, keys: list[int]) -> int:
        i = 0
        while i < len(keys) and keys[i] in self.cached:
            i += 1
        return i

    def walk(self, keys: list[int]) -> int:
        """Matched pages; split the node the match ends inside."""
        i = self.hit_length(keys)
        if i:
            self.start.update(self.children().get(keys[i - 1], []))
        return i

    def touch(self, pages: list[int]) -> None:
        for k in pages:
            self.clock += 1
            self.stamp[k] = self.clock

    def protected(self) -> int:
        return sum(1 for k in self.cached if self.lock[k] > 0)

    def fits(self, hit: list[int], num_blocks: int) -> bool:
        need = num_blocks - len(hit)
        newly_locked = sum(1 for k in hit if self.lock[k] == 0)
        free = self.capacity - len(self.cached) - self.reserved
        evictable = len(self.cached) - self.protected() - newly_locked
        return need <= free + evictable

    def acquire(self, hit: list[int], num_blocks: int) -> int | None:
        """Lock the hit pages and reserve the rest; the reservation, or None."""
        if not self.fits(hit, num_blocks):
            return None
        need = num_blocks - len(hit)
        if self.policy == "lru":
            self.touch(hit)
        for k in hit:
            self.lock[k] += 1
        while self.capacity - len(self.cached) - self.reserved < need:
            self._evict_one()
        self.reserved += need
        return need

    def commit(self, keys: list[int], reserve: int, locked: list[int]) -> tuple[int, list[int]]:
        """Insert the sequence; the request's remaining reservation and its locked pages.

        The request keeps everything it cached locked until it finishes (SGLang's
        ``cache_unfinished_req``): its locked pages grow from its hit to the whole sequence.
        """
        i = self.walk(keys)
        if self.policy == "lru":
            self.touch(keys[:i])
        new = keys[i : i + min(len(keys) - i, reserve)]
        if new:
            self.start.add(new[0])
            self.cached.update(new)
            for k in new:
                self.lock[k] = 0
            self.touch(new)
        self.reserved -= len(new)
        now_locked = keys[: i + len(new)]
        for k in now_locked:
            self.lock[k] += 1
        for k in locked:
            self.lock[k] -= 1
        return reserve - len(new), now_locked

    def release(self, locked: list[int], reserve: int) -> None:
        self.reserved -= reserve
        for k in locked:
            self.lock[k] -= 1

    def _evict_one(self) -> None:
        kids = self.children()
        leaves = [
            pages
            for pages in (self.node_pages(s, kids) for s in self.start)
            if pages[-1] not in kids and all(self.lock[k] == 0 for k in pages)
        ]
        victim = min(leaves, key=lambda pages: max(self.stamp[k] for k in pages))
        self.start.discard(victim[0])
        for k in victim:
            self.cached.discard(k)
            del self.lock[k], self.stamp[k]


@dataclass(slots=True)
class RadixRun:
    """A running request of the radix machine."""

    keys: list[int]
    hit: list[int]
    handle: RadixHandle
    reserve: int
    locked: list[int]
    committed: bool = False


class RadixMachine(RuleBasedStateMachine):
    """RadixCache + a queue policy against :class:`NaiveRadix`, with concurrent requests.

    A request matches and acquires when it starts; it commits (inserts) either while it runs
    (its new pages stay locked) or when it finishes, right before release, as in the replay
    runner. Without ``PROBES`` every lookup is followed by a successful acquire (a request
    the model says cannot fit is skipped); ``PROBES`` adds bare lookups and requests that do
    not fit.
    """

    POLICY = "lru"
    PROBES = False

    def __init__(self) -> None:
        super().__init__()
        self.forest = KeyForest(MAX_KEYS)
        self.running: list[RadixRun] = []

    @initialize(capacity=st.integers(3, 20))
    def setup(self, capacity: int) -> None:
        self.cache = RadixCache(
            capacity, make_policy(self.POLICY, "radix"), MAX_KEYS, block_tokens=BLOCK_TOKENS
        )
        self.model = NaiveRadix(capacity, self.forest.parent, self.POLICY)

    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(shape=REQUESTS)
    def start(self, shape: RequestShape) -> None:
        keys = self.forest.make(shape)
        lookup = keys[: shape.lookup_blocks]
        num_blocks = len(keys) + shape.extra_blocks
        hit = lookup[: self.model.hit_length(lookup)]
        if not self.PROBES and not self.model.fits(hit, num_blocks):
            return
        m = self.cache.match(arr(lookup))
        num_hit = self.model.walk(lookup)
        assert m.num_hit_blocks == num_hit == len(hit), "hit length"
        handle = self.cache.acquire(m, num_blocks)
        reserve = self.model.acquire(hit, num_blocks)
        if reserve is None:
            assert handle is None, "acquire succeeded although the tree cannot fit it"
            return
        assert handle is not None, "acquire failed although the tree can fit it"
        assert handle.reserved_blocks == reserve
        self.running.append(RadixRun(keys, hit, handle, reserve, hit))

    @precondition(lambda self: any(not r.committed for r in self.running))
    @rule(pick=st.integers(0, 15))
    def commit(self, pick: int) -> None:
        todo = [r for r in self.running if not r.committed]
        self._commit(todo[pick % len(todo)])

    @precondition(lambda self: bool(self.running))
    @rule(pick=st.integers(0, 15))
    def finish(self, pick: int) -> None:
        run = self.running.pop(pick % len(self.running))
        if not run.committed:
            self._commit(run)
        self.cache.release(run.handle)
        self.model.release(run.locked, run.reserve)

    def _commit(self, run: RadixRun) -> None:
        self.cache.commit(run.handle, arr(run.keys), len(run.hit))
        run.reserve, run.locked = self.model.commit(run.keys, run.reserve, run.locked)
        assert run.handle.reserved_blocks == run.reserve
        run.committed = True

    @precondition(lambda self: self.PROBES)
    @rule(index=st.integers(0, 63), length=st.integers(0, MAX_SEQ_BLOCKS))
    def probe(self, index: int, length: int) -> None:
        lookup = self.forest.known(index, length)
        m = self.cache.match(arr(lookup))
        assert m.num_hit_blocks == self.model.walk(lookup)

    @invariant()
    def structure_is_consistent(self) -> None:
        self.cache.check()

    @invariant()
    def agrees_with_model(self) -> None:
        cache, model = self.cache, self.model
        assert cache.cached_keys() == model.cached, "cached pages"
        starts = {int(e[0]) for e in cache.edges[1:] if e is not None}
        assert starts == model.start, "node boundaries"
        for node, edge in enumerate(cache.edges):
            if node and edge is not None:
                locks = {model.lock[k] for k in edge.tolist()}
                assert locks == {int(cache.view.ref[node])}, f"lock count of node {node}"
        assert cache.tree_blocks == len(model.cached)
        assert cache.reserved_blocks == model.reserved
        assert cache.protected_blocks == model.protected()

    @invariant()
    def eviction_order_agrees(self) -> None:
        """On copies, evict one leaf at a time (a request needing one page more than is
        free) until only locked pages are left, comparing the cached pages after each."""
        cache, model = copy.deepcopy(self.cache), copy.deepcopy(self.model)
        while cache.tree_blocks > cache.protected_blocks:
            need = cache.capacity_blocks - cache.tree_blocks - cache.reserved_blocks + 1
            handle = cache.acquire(cache.match(arr([])), need)
            assert handle is not None and model.acquire([], need) == need
            assert cache.cached_keys() == model.cached, "eviction order"
            cache.release(handle)
            model.release([], need)


class RadixLRULookupMachine(RadixMachine):
    PROBES = True


class RadixFIFOMachine(RadixMachine):
    POLICY = "fifo"


def test_radix_lru_matches_naive_trie() -> None:
    run_state_machine_as_test(RadixMachine, settings=machine_settings(max_examples=130, steps=50))


# A node split by a lookup keeps its queue position (on_split). Shrinking is off to keep
# these long runs cheap; the minimal examples Hypothesis once found are the plain tests below.
NO_SHRINK = (Phase.explicit, Phase.generate)


def test_radix_lru_with_bare_lookups_matches_naive_trie() -> None:
    run_state_machine_as_test(
        RadixLRULookupMachine,
        settings=settings(machine_settings(max_examples=300, steps=50), phases=NO_SHRINK),
    )


def test_radix_fifo_matches_naive_trie() -> None:
    run_state_machine_as_test(
        RadixFIFOMachine,
        settings=settings(machine_settings(max_examples=300, steps=50), phases=NO_SHRINK),
    )


def serve(cache: RadixCache, keys: list[int], extra_blocks: int = 0) -> None:
    """One request through the radix cache: match, acquire, commit, release."""
    m = cache.match(arr(keys))
    handle = cache.acquire(m, len(keys) + extra_blocks)
    assert handle is not None
    cache.commit(handle, arr(keys), m.num_hit_blocks)
    cache.release(handle)


def test_radix_lru_bare_lookup_split_keeps_recency() -> None:
    cache = RadixCache(4, make_policy("lru", "radix"), 8, block_tokens=BLOCK_TOKENS)
    serve(cache, [0, 1])  # node [0 1]
    serve(cache, [2])  # node [2], used after [0 1]
    cache.match(arr([0]))  # a lookup with no acquire splits [0 1] into [0] + [1]
    serve(cache, [], extra_blocks=3)  # evicts [1], then the older of [0] and [2]
    assert cache.cached_keys() == {2}


def test_radix_fifo_replay_split_keeps_insertion_order() -> None:
    def request(tokens: list[int]) -> Request:
        return Request(
            arrival_s=0.0, input_length=len(tokens), output_length=0, input_tokens=tokens
        )

    trace = Trace.from_requests(
        [
            request([1, 2, 3, 4, 5, 6, 7, 8]),  # caches A0 A1 (one node)
            request([20, 21, 22, 23]),  # caches B0, inserted after A0
            request([1, 2, 3, 4, 99]),  # hits A0: splits [A0 A1] into [A0] + [A1]
            request(list(range(50, 62))),  # needs 3 pages: evicts A1, then A0 (oldest)
            request([20, 21, 22, 23, 7]),  # B0 must still be cached
        ]
    )
    config = ReplayConfig(capacity_blocks=4, structure="radix", block_tokens=4)
    result = replay(trace, "fifo", config, check_every=1)
    assert result.hit_tokens.tolist() == [0, 0, 4, 0, 4]
