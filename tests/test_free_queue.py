"""FreeQueue (the ordered queue ARC, LeCaR and S3-FIFO evict from) against a naive model:
an OrderedDict walked from the front past every pinned entry."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from prefixlab.policies._ordered import FreeQueue


def test_free_queue_matches_a_walk_past_pinned_entries() -> None:
    for seed in range(30):
        rng = np.random.default_rng(seed)
        free: set[int] = set()
        q = FreeQueue(free)
        ref: OrderedDict[int, None] = OrderedDict()
        for _ in range(400):
            op = int(rng.integers(5))
            e = int(rng.integers(12))
            if op == 0:  # append or move to the back
                q.append(e)
                ref.pop(e, None)
                ref[e] = None
            elif op == 1:
                q.discard(e)
                ref.pop(e, None)
            elif op == 2:  # becomes evictable
                free.add(e)
                q.freed(e)
            elif op == 3:  # pinned
                free.discard(e)
            want = next((x for x in ref if x in free), -1)
            assert q.oldest_free() == want
            assert list(q) == list(ref) and len(q) == len(ref)
            assert all((x in q) == (x in ref) for x in range(12))


def test_free_queue_drops_stale_items_so_its_heap_stays_bounded() -> None:
    free: set[int] = set(range(4))
    q = FreeQueue(free)
    for i in range(10_000):
        q.append(i % 4)
    assert len(q) == 4 and q.oldest_free() == 0
    assert len(q._heap) <= 2 * len(q) + 64


def test_free_queue_holds_one_live_item_per_member_however_often_it_is_freed() -> None:
    free: set[int] = set()
    q = FreeQueue(free)
    for e in range(5):
        q.append(e)
    for _ in range(100):  # released again and again (every request end does this)
        for e in range(5):
            free.add(e)
            q.freed(e)
    live = [(p, e) for p, e in q._heap if q._pos.get(e) == p]
    assert sorted(live) == [(e + 1, e) for e in range(5)]
    assert q.oldest_free() == 0
