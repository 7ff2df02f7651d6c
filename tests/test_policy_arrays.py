"""The array structures behind ARC, S3-FIFO and LeCaR against naive models: the ordered
queue (an OrderedDict walked from the front past every pinned entry) and the ghost list (a
bounded OrderedDict of keys)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from prefixlab.policies._arrays import (
    HN0,
    LEN0,
    MEMBER,
    POSITION,
    SC,
    fq_append,
    fq_discard,
    fq_oldest_free,
    ghost_add,
    ghost_contains,
    ghost_len,
    ghost_pop,
    ghost_trim,
    new_state,
    set_free,
)


def _members(ist: np.ndarray, q: int) -> list[int]:
    m = np.flatnonzero(ist[MEMBER] == q + 1)
    return m[np.argsort(ist[POSITION][m])].tolist()  # type: ignore[no-any-return]


def test_ordered_queue_matches_a_walk_past_pinned_entries() -> None:
    for seed in range(30):
        rng = np.random.default_rng(seed)
        ist, _ = new_state(12, 1, (1, 1))
        free: set[int] = set()
        refs: list[OrderedDict[int, None]] = [OrderedDict(), OrderedDict()]
        for _ in range(400):
            op, e, q = int(rng.integers(4)), int(rng.integers(12)), int(rng.integers(2))
            if op == 0:  # append or move to the back (out of the other queue first)
                fq_discard(ist, 1 - q, e)
                refs[1 - q].pop(e, None)
                fq_append(ist, q, e)
                refs[q].pop(e, None)
                refs[q][e] = None
            elif op == 1:
                fq_discard(ist, q, e)
                refs[q].pop(e, None)
            elif op == 2:  # becomes evictable
                set_free(ist, e, True)
                free.add(e)
            else:  # pinned
                set_free(ist, e, False)
                free.discard(e)
            for k in range(2):
                want = next((x for x in refs[k] if x in free), -1)
                assert fq_oldest_free(ist, k) == want
                assert _members(ist, k) == list(refs[k])
                assert ist[SC, LEN0 + k] == len(refs[k])


def test_ordered_queue_heap_stays_within_its_row_however_often_entries_move() -> None:
    ist, _ = new_state(4, 1, (1, 1))
    for e in range(4):
        set_free(ist, e, True)
    for i in range(10_000):  # every append pushes an item; stale ones are compacted away
        fq_append(ist, 0, i % 4)
    assert ist[SC, HN0] <= ist.shape[1]
    assert fq_oldest_free(ist, 0) == 0 and _members(ist, 0) == [0, 1, 2, 3]


def test_ghost_list_matches_a_bounded_ordered_dict() -> None:
    for seed in range(20):
        rng = np.random.default_rng(seed)
        limit = int(rng.integers(1, 6))
        ist, fst = new_state(4, 16, (limit, 1))
        ref: OrderedDict[int, float] = OrderedDict()
        for step in range(500):
            op, key = int(rng.integers(3)), int(rng.integers(16))
            if op == 0:
                ghost_add(ist, fst, 0, key, float(step))
                ref.pop(key, None)
                ref[key] = float(step)
                while len(ref) > limit:
                    ref.popitem(last=False)
            elif op == 1:
                assert ghost_pop(ist, fst, 0, key) == ref.pop(key, -1.0)
            else:
                cut = int(rng.integers(0, limit + 1))
                ghost_trim(ist, 0, cut)
                while len(ref) > cut:
                    ref.popitem(last=False)
            assert ghost_len(ist, 0) == len(ref)
            assert all(ghost_contains(ist, 0, k) == (k in ref) for k in range(16))


def test_sorted_list_head_is_the_minimum_under_random_inserts_and_removals() -> None:
    """The pairing heap behind slist_*: after every operation list c's head is its member
    with the lowest (rank, tie), as a naive sorted model says, ranks in any order."""
    from prefixlab.policies._arrays import new_state, slist_insert, slist_remove

    rng = np.random.default_rng(7)
    n, lists = 300, 3
    ist, fst = new_state(n, 1, (0, 0), (6, 1))
    kr, kt, prv, hd = 3, 29, 30, 32  # rank row (float), tie, prev/next, head/child rows
    ist[hd] = -1
    members: list[set[int]] = [set() for _ in range(lists)]
    where = {}
    tie = 0
    for _ in range(4000):
        free = [e for e in range(n) if e not in where]
        if free and (rng.random() < 0.55 or not where):
            e = int(rng.choice(free))
            c = int(rng.integers(lists))
            fst[kr, e] = float(rng.integers(0, 40))  # many equal ranks: ties decide
            ist[kt, e] = tie
            tie += 1
            slist_insert(ist, fst, kr, kt, prv, hd, c, e)
            members[c].add(e)
            where[e] = c
        else:
            e = int(rng.choice(list(where)))
            c = where.pop(e)
            slist_remove(ist, fst, kr, kt, prv, hd, c, e)
            members[c].discard(e)
        for c in range(lists):
            want = min(members[c], key=lambda x: (fst[kr, x], ist[kt, x]), default=-1)
            assert ist[hd, c] == want
