"""A cache tier below GPU memory: CPU memory of one replica, or a store shared by several.

A tier holds whole blocks under the same chained keys as the GPU cache, in a pool of
``capacity_blocks`` with its own eviction policy. It is a :class:`BlockCache` whose blocks
are never pinned for longer than one call, so every registered block policy (and block
admission) runs on a tier as it does on GPU memory. Its verbs::

    peek(keys)   how many of keys, from the first, the tier holds   (no side effect)
    take(keys)   the same run, read: the policy sees an access      (a promotion)
    store(keys)  keep the keys it lacks, evicting to make room       (a demotion)

A lookup starts where the tier above stopped, so a tier may hold a block without the
blocks before it; keys name whole prefixes, so a held key is always a valid hit. A store
offers a run of a request's blocks; the ones already held are left alone (vLLM's
``prepare_store`` drops them), the rest are cached in order and become evictable at
once; how they rank among themselves is the policy's (``lru`` by insertion, the run's
first key the least recent; ``vllm`` by release, deepest first). vLLM 0.33's CPU
``LRUCachePolicy`` ranks a request's keys deepest first too, but commits their recency
when the request finishes, which a tier does not model. A run longer than the tier keeps
its first ``capacity_blocks`` keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import MatchResult, Observer, Removed
from prefixlab.cache.view import BlockAdmission, CachePolicy
from prefixlab.types import I64

_NONE = np.zeros(0, dtype=np.int64)


class Tier:
    """One lower cache level: a block pool, its policy, and what was read and written."""

    def __init__(
        self,
        name: str,
        capacity_blocks: int,
        policy: CachePolicy,
        num_keys: int,
        *,
        block_tokens: int,
        observers: Sequence[Observer] = (),
        admission: BlockAdmission | None = None,
    ) -> None:
        self.name = name
        self.cache = BlockCache(
            capacity_blocks,
            policy,
            num_keys,
            block_tokens=block_tokens,
            observers=observers,
            admission=admission,
        )
        #: blocks read (promoted) and written (demoted), over the whole run
        self.blocks_read = 0
        self.blocks_written = 0
        #: whether a replica already watches its evictions (a shared store has several)
        self.watched = False
        #: keys whose write is still in flight, and when it lands (a tier's readers skip
        #: them until then; the engine's tier stack keeps it)
        self.pending: dict[int, float] = {}

    @property
    def capacity_blocks(self) -> int:
        return self.cache.capacity_blocks

    @property
    def observers(self) -> list[Observer]:
        return self.cache.observers

    def holds(self, keys: I64) -> np.ndarray:
        """Which of ``keys`` the tier holds."""
        held: np.ndarray = self.cache.key_block[keys] >= 0
        return held

    def peek(self, keys: I64) -> int:
        """How many of ``keys``, from the first, the tier holds."""
        present = self.holds(keys)
        if present.all():
            return int(keys.shape[0])
        return int(np.argmin(present))

    def finish(self, request: int) -> None:
        """A request finished (the block policies have nothing to do then)."""

    def take(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> None:
        """Read ``keys`` (all held: :meth:`holds` said so): the policy sees one access
        each."""
        if not keys.shape[0]:
            return
        c = self.cache
        c.view.now, c.view.request_index = now, request
        held = c.acquire(c.match(keys), int(keys.shape[0]))
        assert held is not None  # hits only: nothing to take
        c.release(held)
        self.blocks_read += int(keys.shape[0])

    def store(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> int:
        """Keep the keys of ``keys`` the tier lacks; returns how many it wrote (``pos``,
        the keys' block positions, is for :class:`VllmLruTier`)."""
        c = self.cache
        new = keys[c.key_block[keys] < 0] if keys.shape[0] else _NONE
        if not new.shape[0]:
            return 0
        if new.shape[0] > 1:  # a GPU eviction may drop two holders of one key
            first = np.unique(new, return_index=True)[1]
            if first.shape[0] < new.shape[0]:
                new = new[np.sort(first)]
        new = new[: c.capacity_blocks]
        c.view.now, c.view.request_index = now, request
        held = c.acquire(MatchResult(0, 0, _NONE), int(new.shape[0]))
        assert held is not None  # nothing is pinned between calls: the whole pool is free
        written = c.commit(held, new, 0)
        c.release(held)
        self.blocks_written += written
        return written

    def check(self) -> None:
        """The pool's invariants, and nothing left pinned."""
        self.cache.check()
        if int(np.count_nonzero(self.cache.view.ref[: self.capacity_blocks])):
            raise AssertionError(f"tier {self.name}: a block is still pinned")


class VllmLruTier:
    """vLLM 0.33's CPU offload tier, call for call: ``CPUOffloadingManager`` with its
    ``LRUCachePolicy`` (``vllm/v1/kv_offload/cpu/``), as the offloading connector drives it
    when every transfer completes at once.

    - A key's rank is a pair; the smallest evictable rank goes first. A request takes a
      rank from a counter the first time it reaches the policy; the keys it reads or
      stores rank ``(request rank, -position)``, so its deepest block goes before its
      first, and an older request's blocks before a newer one's.
    - When the request finishes, every key it saw that is still held gets a new rank from
      the counter, deepest first, so its first block is the most recent of all.
    - A store keeps the offered keys the tier lacks; the keys offered in the same call are
      never evicted for it, and if room cannot be made the store is dropped whole.
    - ``store_threshold`` >= 2: a key is stored from its ``store_threshold``-th offer,
      offers counted in a table of ``max_tracker_size`` keys trimmed least recent first.

    Positions are block indices (vLLM's are end tokens: the same order).
    """

    def __init__(
        self,
        name: str,
        capacity_blocks: int,
        *,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
    ) -> None:
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.rank: dict[int, tuple[int, int]] = {}
        self._heap: list[tuple[tuple[int, int], int]] = []
        self._next = 0
        self._request_rank: dict[int, int] = {}
        self._seen: dict[int, dict[int, int]] = {}  # request -> key -> position
        self._counts: dict[int, int] = {}  # offers per key (insertion ordered: LRU)
        self.observers: list[Observer] = []
        self.blocks_read = 0
        self.blocks_written = 0
        self.watched = False
        #: keys whose write is still in flight, and when it lands (a tier's readers skip
        #: them until then; the engine's tier stack keeps it)
        self.pending: dict[int, float] = {}

    # --------------------------------------------------------------- lookups
    def holds(self, keys: I64) -> np.ndarray:
        return np.fromiter((k in self.rank for k in keys.tolist()), bool, keys.shape[0])

    def peek(self, keys: I64) -> int:
        held = self.holds(keys)
        return int(keys.shape[0]) if held.all() else int(np.argmin(held))

    # --------------------------------------------------------------- ranks
    def _req_rank(self, r: int) -> int:
        if r not in self._request_rank:
            self._next += 1
            self._request_rank[r] = self._next
        return self._request_rank[r]

    def _set(self, key: int, rank: tuple[int, int]) -> None:
        self.rank[key] = rank
        heapq.heappush(self._heap, (rank, key))
        if len(self._heap) > 64 + 2 * len(self.rank):  # drop the stale entries
            self._heap = [(v, k) for k, v in self.rank.items()]
            heapq.heapify(self._heap)

    def _access(self, keys: list[int], pos: list[int], r: int) -> None:
        """The manager's ``_record_request_cache_access``: keys new to the request rank
        ``(request rank, -position)`` if that is more recent than their rank."""
        seen = self._seen.setdefault(r, {})
        new = [(k, p) for k, p in zip(keys, pos, strict=True) if k not in seen]
        if not new:
            return
        seen.update(new)
        rank = self._req_rank(r)
        for k, p in new:
            if k in self.rank and self.rank[k] < (rank, -p):
                self._set(k, (rank, -p))

    # --------------------------------------------------------------- verbs
    def take(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> None:
        """``prepare_load`` then ``complete_load`` of held keys."""
        if not keys.shape[0]:
            return
        positions = pos.tolist() if pos is not None else list(range(keys.shape[0]))
        self._access(keys.tolist(), positions, request)
        self.blocks_read += int(keys.shape[0])

    def store(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> int:
        """``prepare_store`` then ``complete_store``; returns how many keys it wrote."""
        ks = keys.tolist()
        if not ks:
            return 0
        positions = pos.tolist() if pos is not None else list(range(len(ks)))
        if len(set(ks)) < len(ks):  # a GPU eviction may drop two holders of one key
            first = dict(zip(reversed(ks), reversed(positions), strict=True))
            ks = list(dict.fromkeys(ks))
            positions = [first[k] for k in ks]
        if self.store_threshold >= 2:
            self._count(ks)
        new = [k for k in ks if k not in self.rank]
        if self.store_threshold >= 2:
            new = [k for k in new if self._counts.get(k, 0) >= self.store_threshold]
        offered = set(new) | {k for k in ks if k in self.rank}
        if request >= 0:  # (a write-back has no request: its keys rank as they come)
            self._access(
                [k for k in ks if k in offered],
                [p for k, p in zip(ks, positions, strict=True) if k in offered],
                request,
            )
        if not new:
            return 0
        victims = self._evict(len(self.rank) + len(new) - self.capacity_blocks, set(ks), now)
        if victims is None:
            return 0
        where = dict(zip(ks, positions, strict=True))
        for k in new:
            if request >= 0:
                self._set(k, (self._req_rank(request), -where[k]))
            else:
                self._next += 1
                self._set(k, (self._next, 0))
        self.blocks_written += len(new)
        return len(new)

    def finish(self, request: int) -> None:
        """``on_request_finished``: the request's keys become the most recent, first
        block last."""
        seen = self._seen.pop(request, None)
        self._request_rank.pop(request, None)
        if not seen:
            return
        for k in sorted(seen, key=seen.__getitem__, reverse=True):
            if k in self.rank:
                self._next += 1
                self._set(k, (self._next, 0))

    def _count(self, keys: list[int]) -> None:
        """The manager's ``_record_accesses``: count offers, trimming the table."""
        counts = self._counts
        protected = 0
        for k in keys:
            if k in counts:
                counts[k] = counts.pop(k) + 1  # most recent
                protected += 1
        unprotected = len(counts) - protected
        for k in keys:
            if k in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                del counts[next(iter(counts))]
                unprotected -= 1
            counts[k] = 1

    def _evict(self, n: int, protected: set[int], now: float) -> list[int] | None:
        """``n`` victims, least recent first, never a protected key nor one whose write is
        in flight (vLLM: a store in flight holds its chunk at ref_cnt -1, not evictable)."""
        if n <= 0:
            return []
        chosen: list[tuple[tuple[int, int], int]] = []
        picked: set[int] = set()
        deferred = []
        while self._heap and len(chosen) < n:
            entry = heapq.heappop(self._heap)
            rank, k = entry
            if self.rank.get(k) != rank or k in picked:
                continue
            if k in protected or self.pending.get(k, now) > now:
                deferred.append(entry)
                continue
            chosen.append(entry)
            picked.add(k)
        for entry in deferred:
            heapq.heappush(self._heap, entry)
        if len(chosen) < n:
            for entry in chosen:
                heapq.heappush(self._heap, entry)
            return None
        victims = [k for _, k in chosen]
        for k in victims:
            del self.rank[k]
        if self.observers:
            event = Removed(np.array(victims, dtype=np.int64), True)
            for obs in self.observers:
                obs.on_event(event)
        return victims

    def check(self) -> None:
        if len(self.rank) > self.capacity_blocks:
            raise AssertionError(f"tier {self.name}: {len(self.rank)} keys over capacity")


#: a tier's pool: a block cache under a block policy, or vLLM's CPU tier
AnyTier = Tier | VllmLruTier
