"""SGLang-style radix cache: tree shape, splits, locks and leaf-first eviction, by hand.

Sequences are lists of page keys (one chained block key per page): two sequences share a
k-page prefix exactly when their first k keys are equal. Node ids come from a stack, so a
fresh tree hands out 1, 2, 3, ... and reuses the id of a removed node first. ``check()``
runs after every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from prefixlab.cache.events import Event, MatchResult, Removed
from prefixlab.cache.radix import ROOT, RadixCache, RadixHandle
from prefixlab.policies import make_policy

I64 = npt.NDArray[np.int64]
BT = 4  # tokens per page


def arr(*values: int) -> I64:
    return np.array(values, dtype=np.int64)


def tree(cache: RadixCache, node: int = ROOT) -> dict[tuple[int, ...], Any]:
    """The tree as nested ``{edge keys: subtree}`` dicts."""
    children = cache.children[node]
    assert children is not None
    out: dict[tuple[int, ...], Any] = {}
    for child in children.values():
        edge = cache.edges[child]
        assert edge is not None
        out[tuple(edge.tolist())] = tree(cache, child)
    return out


class RemovedLog:
    """Observer keeping the edges of removed nodes, in order."""

    def __init__(self) -> None:
        self.edges: list[tuple[int, ...]] = []

    def on_event(self, event: Event) -> None:
        if isinstance(event, Removed):
            self.edges.append(tuple(event.keys.tolist()))


def make(capacity_blocks: int, spec: str = "lru") -> tuple[RadixCache, RemovedLog]:
    log = RemovedLog()
    cache = RadixCache(
        capacity_blocks, make_policy(spec, "radix"), block_tokens=BT, observers=[log]
    )
    return cache, log


def start(
    cache: RadixCache, keys: list[int], now: float, *, lookup: int | None = None, extra: int = 0
) -> tuple[MatchResult, RadixHandle]:
    """Match (``lookup`` pages at most), acquire and commit; the request keeps running."""
    cache.view.now = now
    k = arr(*keys)
    m = cache.match(k if lookup is None else k[:lookup])
    cache.check()
    handle = cache.acquire(m, len(keys) + extra)
    assert handle is not None
    cache.check()
    cache.commit(handle, k, m.num_hit_blocks)
    cache.check()
    assert cache.tree_blocks + cache.reserved_blocks <= cache.capacity_blocks
    return m, handle


def finish(cache: RadixCache, handle: RadixHandle) -> None:
    cache.release(handle)
    cache.check()


def serve(
    cache: RadixCache, keys: list[int], now: float, *, lookup: int | None = None, extra: int = 0
) -> MatchResult:
    m, handle = start(cache, keys, now, lookup=lookup, extra=extra)
    finish(cache, handle)
    return m


def test_edge_splits_and_tree_shape() -> None:
    cache, log = make(10)
    v = cache.view
    serve(cache, [1, 2, 3], 0)
    assert tree(cache) == {(1, 2, 3): {}}
    assert cache.children[ROOT] == {1: 1} and v.depth[1] == 3

    # [1, 2, 4, 5] leaves edge [1 2 3] after 2 pages: node 1 is split into a new upper node 2
    # = [1 2] and node 1 = [3] below it; the hit is the 2 matched pages; then [4 5] is added
    # as node 3 under node 2.
    m = serve(cache, [1, 2, 4, 5], 1)
    assert (m.num_hit_blocks, m.num_hit_tokens, m.entries.tolist()) == (2, 8, [2])
    assert tree(cache) == {(1, 2): {(3,): {}, (4, 5): {}}}
    assert cache.children[ROOT] == {1: 2}
    assert cache.children[2] == {3: 1, 4: 3}
    assert v.parent[[1, 2, 3]].tolist() == [2, ROOT, 2]
    assert v.depth[[1, 2, 3]].tolist() == [3, 2, 4]  # pages from the root to the edge end
    assert v.key[[1, 2, 3]].tolist() == [3, 1, 4]  # first page key of each edge
    assert v.size[[1, 2, 3]].tolist() == [4, 8, 8]  # tokens
    assert cache.tree_blocks == 5

    # A lookup of [1, 2, 4] ends inside edge [4 5]: split node 3 into node 4 = [4] over
    # node 3 = [5]. Only the matched pages count: 3, nothing is inserted.
    m = serve(cache, [1, 2, 4], 2)
    assert (m.num_hit_blocks, m.entries.tolist()) == (3, [2, 4])
    assert tree(cache) == {(1, 2): {(3,): {}, (4,): {(5,): {}}}}
    assert v.parent[[3, 4]].tolist() == [4, 2]
    assert cache.tree_blocks == 5

    # A lookup shorter than the first edge: [1] splits [1 2] into node 5 = [1] over [2].
    m = serve(cache, [1], 3)
    assert (m.num_hit_blocks, m.entries.tolist()) == (1, [5])
    assert tree(cache) == {(1,): {(2,): {(3,): {}, (4,): {(5,): {}}}}}
    assert v.parent[2] == 5 and v.depth[[5, 2]].tolist() == [1, 2]

    # A first page that matches no child: no split, no hit; a new branch at the root.
    m = serve(cache, [9, 1], 4)
    assert m.num_hit_blocks == 0
    assert tree(cache) == {(1,): {(2,): {(3,): {}, (4,): {(5,): {}}}}, (9, 1): {}}
    assert cache.tree_blocks == 7 and log.edges == []


def test_hit_counts_only_matched_pages_and_frees_unused_reservation() -> None:
    cache, _ = make(8)
    serve(cache, [1, 2, 3], 0)
    # The same 3 pages looked up with a recompute cap of 2 pages: the match splits [1 2 3]
    # after 2 pages and hits 2; the request reserves 1 page, commit finds [3] already
    # cached, so the reservation is returned at release.
    m, handle = start(cache, [1, 2, 3], 1, lookup=2)
    assert (m.num_hit_blocks, m.num_hit_tokens) == (2, 8)
    assert handle.reserved_blocks == 1 and cache.reserved_blocks == 1
    assert tree(cache) == {(1, 2): {(3,): {}}}
    finish(cache, handle)
    assert cache.reserved_blocks == 0 and cache.tree_blocks == 3


@pytest.mark.parametrize(
    "spec",
    [
        # lru: queue order n1 [1 2 3] (t0), n2 [1 2] (accessed t1), n3 [4 5] (t1), [6 7] (t2).
        "lru",
        # fifo: insertion order n1, n2 (inserted by the split at t1), n3, [6 7].
        "fifo",
        # sglang-lru: last access n1 = 0, n2 = n3 = 1, [6 7] = 2; n2 is offered when n3 goes.
        "sglang-lru",
        # hashtable: (last access, -depth): n1 (0), n3 (1, -4), n2 (1, -2), [6 7] (2).
        "hashtable",
    ],
)
def test_parent_offered_after_its_last_child(spec: str) -> None:
    cache, log = make(6, spec)
    serve(cache, [1, 2, 3], 0)  # n1
    serve(cache, [1, 2, 4, 5], 1)  # n2 = [1 2] over n1 = [3] and n3 = [4 5]; 5 pages
    # [6 7] needs 2 pages, 1 is free: evict one leaf. Leaves: n1 (older) and n3. n2 has
    # children and is not a candidate.
    serve(cache, [6, 7], 2)
    assert log.edges == [(3,)]
    assert tree(cache) == {(1, 2): {(4, 5): {}}, (6, 7): {}}
    # [8 9 10] needs 3 pages, none free: evict n3 [4 5] (older than [6 7]); that makes n2
    # an unlocked leaf, offered to the policy, and as the oldest it goes next, before [6 7].
    serve(cache, [8, 9, 10], 3)
    assert log.edges == [(3,), (4, 5), (1, 2)]
    assert tree(cache) == {(6, 7): {}, (8, 9, 10): {}}
    assert cache.tree_blocks == 5


def test_locked_paths_never_evicted_and_splits_keep_locks() -> None:
    cache, log = make(6)
    v = cache.view
    serve(cache, [1, 2, 3], 0)  # n1
    serve(cache, [1, 2, 4], 1)  # n2 = [1 2] over n1 = [3] and n3 = [4]
    assert tree(cache) == {(1, 2): {(3,): {}, (4,): {}}}

    # X runs on [1 2 3]: it locks n1 and n2 (3 protected pages).
    m, x = start(cache, [1, 2, 3], 2)
    assert m.entries.tolist() == [2, 1] and x.last_node == 1
    assert v.ref[[1, 2, 3]].tolist() == [1, 1, 0]
    assert cache.protected_blocks == 3

    # Y = [7 8 9] needs 3 pages, 2 are free: the only unlocked leaf, n3 [4], goes.
    serve(cache, [7, 8, 9], 3)
    assert log.edges == [(4,)]
    # Z = [10 11] needs 2, none free: [7 8 9] is the only unlocked leaf.
    serve(cache, [10, 11], 4)
    assert log.edges == [(4,), (7, 8, 9)]
    assert tree(cache) == {(1, 2): {(3,): {}}, (10, 11): {}}

    # W needs 4 pages: 1 free + 2 evictable ([10 11]) < 4 -> refused, nothing changes.
    before = (tree(cache), cache.tree_blocks, cache.protected_blocks, v.ref.tolist())
    assert cache.acquire(cache.match(arr(12, 13, 14, 15)), 4) is None
    assert (tree(cache), cache.tree_blocks, cache.protected_blocks, v.ref.tolist()) == before
    cache.check()

    # V looks up [1] while X runs: n2 = [1 2] (ref 1) splits into n4 = [1] over n2 = [2];
    # the new upper node inherits X's lock, so the protected page count is unchanged.
    cache.view.now = 5
    mv = cache.match(arr(1))
    cache.check()
    assert tree(cache) == {(1,): {(2,): {(3,): {}}}, (10, 11): {}}
    assert mv.entries.tolist() == [4]
    assert v.ref[[4, 2, 1]].tolist() == [1, 1, 1] and cache.protected_blocks == 3
    hv = cache.acquire(mv, 1)
    assert hv is not None and v.ref[[4, 2, 1]].tolist() == [2, 1, 1]
    cache.commit(hv, arr(1), 1)
    finish(cache, hv)
    assert v.ref[[4, 2, 1]].tolist() == [1, 1, 1]

    # X ends: its unlock walks n1 -> n2 -> n4, all back to 0.
    finish(cache, x)
    assert v.ref[[4, 2, 1]].tolist() == [0, 0, 0] and cache.protected_blocks == 0

    # W again. LRU order: n2, n1 (accessed by X at t2), [10 11] (t4), n4 (accessed by V at
    # t5). Evict n1 [3] (n2 has a child), then n2 [2] (now a leaf), then [10 11]: 5 free.
    serve(cache, [12, 13, 14, 15], 6)
    assert log.edges == [(4,), (7, 8, 9), (3,), (2,), (10, 11)]
    assert tree(cache) == {(1,): {}, (12, 13, 14, 15): {}}


def test_reserved_pages_count_against_capacity() -> None:
    cache, log = make(6)
    serve(cache, [1, 2, 3], 0)
    # X = [4 5] plus one output page: reserves 3 pages, the 3 free ones; nothing evicted.
    cache.view.now = 1
    kx = arr(4, 5)
    mx = cache.match(kx)
    x = cache.acquire(mx, 3)
    assert x is not None and x.reserved_blocks == 3
    assert (cache.tree_blocks, cache.reserved_blocks) == (3, 3)
    assert cache.num_available() == 3 and log.edges == []
    cache.check()
    # Y = [7] needs 1 page: the tree alone would fit (3 + 1 <= 6), but X's reservation
    # counts, so the unlocked leaf [1 2 3] is evicted.
    my, y = start(cache, [7], 2)
    assert log.edges == [(1, 2, 3)]
    assert (cache.tree_blocks, cache.reserved_blocks) == (1, 3)
    # X commits its 2 keyed pages; its output page stays reserved until release.
    cache.commit(x, kx, mx.num_hit_blocks)
    cache.check()
    assert (cache.tree_blocks, cache.reserved_blocks, x.reserved_blocks) == (3, 1, 1)
    finish(cache, x)
    finish(cache, y)
    assert (cache.tree_blocks, cache.reserved_blocks) == (3, 0)
    assert tree(cache) == {(4, 5): {}, (7,): {}}
    assert my.num_hit_blocks == 0


def test_reservations_and_locks_refuse_a_request_that_cannot_fit() -> None:
    cache, log = make(6)
    mx, x = start(cache, [1, 2, 3], 0, extra=1)  # 3 tree pages + 1 reserved, unlocked
    # A 6-page request: 6 - 3 tree - 1 reserved = 2 free, plus at most the 3 pages of
    # [1 2 3] if evictable (commit leaves X's new leaf unlocked today) = 5 < 6 -> refused.
    assert cache.acquire(cache.match(arr(7, 8, 9, 10, 11, 12)), 6) is None
    # Lock [1 2 3] by a second user: now only 2 pages are available.
    my, y = start(cache, [1, 2, 3], 1)
    assert my.num_hit_blocks == 3 and cache.protected_blocks == 3
    assert cache.acquire(cache.match(arr(7, 8, 9)), 3) is None
    assert log.edges == []
    finish(cache, x)  # frees the reserved page: 3 available
    serve(cache, [7, 8, 9], 2)
    assert log.edges == [] and tree(cache) == {(1, 2, 3): {}, (7, 8, 9): {}}
    finish(cache, y)
    assert mx.num_hit_blocks == 0


def test_running_request_keeps_its_committed_pages_locked() -> None:
    # SGLang's cache_unfinished_req: pages a running request has just cached stay locked.
    cache = RadixCache(4, make_policy("lru", "radix"), block_tokens=1)
    a_keys = np.array([1, 2], dtype=np.int64)
    a = cache.acquire(cache.match(a_keys), 2)
    assert a is not None
    cache.commit(a, a_keys, 0)
    cache.check()
    assert cache.tree_blocks == 2 and cache.protected_blocks == 2
    b_keys = np.array([7, 8, 9], dtype=np.int64)
    # 2 free pages, and A's 2 pages are locked: B (3 pages) must wait, nothing evicted.
    assert cache.acquire(cache.match(b_keys), 3) is None
    assert cache.cached_keys() == {1, 2}
    cache.release(a)
    cache.check()
    assert cache.protected_blocks == 0
    b = cache.acquire(cache.match(b_keys), 3)
    assert b is not None
    cache.commit(b, b_keys, 0)
    cache.release(b)
    cache.check()
    assert cache.cached_keys() == {7, 8, 9}  # A's leaf [1, 2] was evicted whole
