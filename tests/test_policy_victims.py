"""Hand-computed victim orders for every registered eviction policy.

Two kinds of scenario per policy:

* direct: the policy is driven through its batch hooks with a small :class:`EntryView`, the way
  a structure would drive it (insert pinned -> release -> hit = access + pin -> release), and
  ``evict(n)`` must return the exact order derived from the policy's published definition;
* through a real :class:`BlockCache` with a 4-block pool, replaying tiny hash-form traces
  (one key per block, ``min_recompute_tokens=0`` so every block of a request is looked up),
  asserting the cached keys after every request.

Every expectation is derived by hand in the comment next to it. Last, two checks of OPT
through ``replay``: a duplicate holder of a key ranks as never used again (hand-computed
hits), and, on random traces, OPT never keeps a block whose prefix it evicted.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Event, Removed, Stored
from prefixlab.policies import EntryView, EvictionPolicy, make_policy, registered
from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import BlockLayout, Request, Trace

I64 = npt.NDArray[np.int64]
BT = 4  # tokens per block in every trace of this module


def ids(*entries: int) -> I64:
    return np.array(entries, dtype=np.int64)


class Driver:
    """Drives one policy through its hooks as a structure would (metadata first, then hook)."""

    def __init__(self, spec: str, num_entries: int) -> None:
        self.policy: EvictionPolicy = make_policy(spec)
        self.view = EntryView(num_entries)
        self.policy.bind(self.view)

    def _clock(self, t: float) -> None:
        self.view.now = t
        self.view.request_index = int(t)

    def insert(
        self,
        e: int,
        t: float,
        *,
        key: int | None = None,
        depth: int = 0,
        primary: bool = True,
        release: bool = True,
    ) -> None:
        """A new entry (pinned by its request); released right away unless told otherwise."""
        v = self.view
        self._clock(t)
        v.key[e] = 10 + e if key is None else key
        v.depth[e] = depth
        v.is_primary[e] = primary
        v.created[e] = v.last_access[e] = t
        v.hits[e] = 0
        v.ref[e] = 1
        self.policy.on_insert(ids(e))
        if release:
            self.release(e)

    def release(self, *entries: int) -> None:
        """Ref counts reach 0, in this order (a block cache gives tail-first order)."""
        self.view.ref[list(entries)] -= 1
        self.policy.on_evictable(ids(*entries))

    def pin(self, e: int) -> None:
        self.view.ref[e] += 1
        self.policy.on_pinned(ids(e))

    def hit(self, e: int, t: float, *, release: bool = True) -> None:
        """A lookup hits e: on_access, on_pinned if it was free, then metadata (BlockCache order)."""
        v = self.view
        self._clock(t)
        self.policy.on_access(ids(e))
        if v.ref[e] == 0:
            self.policy.on_pinned(ids(e))
        v.ref[e] += 1
        v.last_access[e] = t
        v.hits[e] += 1
        if release:
            self.release(e)

    def evict(self, n: int) -> list[int]:
        out: list[int] = self.policy.evict(n).tolist()
        return out


# ---------------------------------------------------------------------------- direct scenarios


def test_every_registered_policy_has_a_scenario() -> None:
    # the hybrid structure's policies have hand-computed scenarios in tests/test_hybrid.py
    flat = {n for n, cls in registered().items() if cls.structures & {"block", "radix"}}
    assert set(registered()) - flat == {"vanilla", "vllm+", "sglang+", "marconi"}
    # LPC's hand-computed victims are in tests/test_lpc.py; unicache, unicache-opt, wa and
    # opt-online have one scenario each here and many more in tests/test_unicache.py
    assert flat - {"lpc", "lpc-oracle"} == {
        "arc",
        "fifo",
        "hashtable",
        "lecar",
        "lfu",
        "lru",
        "mru",
        "opt",
        "opt-online",
        "s3fifo",
        "sglang-lru",
        "sieve",
        "unicache",
        "unicache-opt",
        "vllm",
        "wa",
        "wa-atc25",
    }


@pytest.mark.parametrize(
    ("spec", "first", "second"),
    [
        # LRU: recency queue after the hit on 2 at t=4 is 0 1 3 2; 0 is pinned (its request
        # still runs) so it is skipped, not consumed: [1, 3]; once released it is the oldest.
        ("lru", [1, 3], [0, 2]),
        # FIFO: insertion order 0 1 2 3, the hit is ignored; 0 pinned -> [1, 2], then [0, 3].
        ("fifo", [1, 2], [0, 3]),
    ],
)
def test_lru_fifo_differ_on_a_hit_and_skip_pinned(
    spec: str, first: list[int], second: list[int]
) -> None:
    d = Driver(spec, 6)
    d.insert(0, 0, release=False)
    for e in (1, 2, 3):
        d.insert(e, e)
    d.hit(2, 4)
    assert d.evict(2) == first
    d.release(0)
    assert d.evict(2) == second
    assert d.evict(1) == []


def test_lfu_counts_hits() -> None:
    d = Driver("lfu", 6)
    d.insert(0, 0)
    d.insert(1, 1, release=False)  # pinned throughout
    d.insert(2, 2)
    d.insert(3, 3)
    d.hit(0, 4)
    d.hit(0, 5)
    d.hit(2, 6)
    d.insert(4, 7, depth=0)
    d.insert(5, 7, depth=1)
    # (hits, last access, -depth): 3=(0,3) 5=(0,7,-1) 4=(0,7,0) 2=(1,6) 0=(2,5); 1 pinned.
    # 5 and 4 tie on hits and time: the deeper one first, although 4 was released first.
    assert d.evict(6) == [3, 5, 4, 2, 0]


def test_mru_evicts_newest() -> None:
    d = Driver("mru", 6)
    for e in range(4):
        d.insert(e, e)
    d.hit(1, 4)
    d.pin(2)
    d.insert(4, 5, depth=0)
    d.insert(5, 5, depth=1)
    # (-last access, -depth): 5=(-5,-1) 4=(-5,0) 1=(-4) 3=(-3) 0=(0); 2 pinned.
    assert d.evict(6) == [5, 4, 1, 3, 0]


def test_arc_t2_promotion_and_ghost_hits_move_p() -> None:
    d = Driver("arc", 4)  # c = 4 entries
    arc = d.policy
    for e in range(4):  # keys 10..13, all in T1
        d.insert(e, e)
    d.hit(1, 4)
    # A hit moves 1 from T1 to T2.
    assert list(arc.t1) == [0, 2, 3] and list(arc.t2) == [1]  # type: ignore[attr-defined]
    # |T1| = 3 > p = 0: evict T1's LRU end, 0; its key 10 goes to ghost B1.
    assert d.evict(1) == [0]
    assert 10 in arc.b1  # type: ignore[attr-defined]
    # Key 10 comes back (a miss on a B1 ghost): p += max(|B2| / |B1|, 1) = max(0 / 1, 1) = 1,
    # and the entry goes straight to T2.
    d.insert(0, 5, key=10)
    assert arc.p == 1.0  # type: ignore[attr-defined]
    assert list(arc.t2) == [1, 0] and 10 not in arc.b1  # type: ignore[attr-defined]
    # T1 = [2, 3]: |T1| = 2 > p = 1 -> evict 2 (key 12 -> B1). Then |T1| = 1, not > p:
    # evict T2's LRU end, 1 (key 11 -> B2).
    assert d.evict(2) == [2, 1]
    # Key 11 returns (a B2 ghost): p -= max(|B1| / |B2|, 1) = max(1 / 1, 1) -> p = 0.
    d.insert(1, 6, key=11)
    assert arc.p == 0.0  # type: ignore[attr-defined]
    # T1 = [3], T2 = [0, 1]; 0 pinned. |T1| = 1 > 0 -> 3; T1 empty -> T2 skipping 0 -> 1.
    d.pin(0)
    assert d.evict(3) == [3, 1]


@pytest.mark.parametrize(
    ("seed", "first_lru", "victims"),
    [
        # seed 11 draws 0.1286, 0.4993. Draw 1 < w_lru = 0.5 -> LRU evicts 0 (key 10 -> LRU
        # history). After the regret on key 10, w_lru = 0.4701 <= 0.4993 -> LFU evicts 2.
        (11, True, [0, 2]),
        # seed 4 draws 0.9431, 0.5113. Draw 1 >= 0.5 -> LFU evicts 2 (key 12 -> LFU
        # history). After the regret on key 12, w_lru = 0.5299 > 0.5113 -> LRU evicts 0.
        (4, False, [2, 0]),
    ],
)
def test_lecar_expert_draw_and_regret_update(
    seed: int, first_lru: bool, victims: list[int]
) -> None:
    rng = np.random.default_rng(seed)
    draw1, draw2 = rng.random(), rng.random()
    assert (draw1 < 0.5) == first_lru
    d = Driver(f"lecar:seed={seed}", 4)
    lecar = d.policy
    lr = 0.45
    discount = 0.005 ** (1 / 4)  # capacity 4
    # LeCaR's own clock ticks on every insert and hit: 0@1, hit 0@2, 1@3, hit 1@4, 2@5, 3@6.
    d.insert(0, 0)
    d.hit(0, 1)
    d.insert(1, 2)
    d.hit(1, 3)
    d.insert(2, 4)
    d.insert(3, 5)
    # LRU's victim is 0 (oldest touch, t=2); LFU's is 2 (freq 1, older than 3).
    assert d.evict(1) == [victims[0]]
    d.hit(3, 6)  # clock 7
    # The victim's key is inserted again at clock 7 (before its own tick); it entered the
    # history at clock 6, so regret = discount ** (7 - 6) for the expert that evicted it.
    d.insert(victims[0], 7)
    e = math.exp(-lr * discount)
    if first_lru:
        expected = 0.5 * e / (0.5 * e + 0.5)
        assert expected < draw2 < 0.5  # the update flips the second choice to LFU
    else:
        expected = 0.5 / (0.5 + 0.5 * e)
        assert 0.5 <= draw2 < expected  # the update flips the second choice to LRU
    assert lecar.w_lru == pytest.approx(expected, rel=1e-12)  # type: ignore[attr-defined]
    # Second eviction: recency 1 2 3 0 (seed 11) / 0 1 3 2 (seed 4); LFU's pick is the only
    # other freq-1 entry with the oldest touch: 2 (seed 11) / 2 (seed 4).
    assert d.evict(1) == [victims[1]]


def test_lecar_skips_pinned() -> None:
    d = Driver("lecar:seed=2", 4)  # draws 0.2616 then 0.2985: LRU twice
    assert np.random.default_rng(2).random() < 0.5
    d.insert(0, 0, release=False)
    d.insert(1, 1)
    d.insert(2, 2)
    # LRU: 0 is the oldest but pinned -> 1, then 2; nothing else is evictable.
    assert d.evict(3) == [1, 2]


def test_s3fifo_small_main_ghost() -> None:
    d = Driver("s3fifo:small_ratio=0.25", 8)  # S target = round(0.25 * 8) = 2, ghost size 6
    s3 = d.policy
    for e in range(3):  # keys 10, 11, 12 into S
        d.insert(e, e)
    d.hit(0, 3)
    # |S| = 3 >= 2: drain S. 0 was hit (freq 1 >= 1) -> moves to M with freq 0; 1 is a
    # one-hit wonder -> evicted, its key 11 into the ghost.
    assert d.evict(1) == [1]
    assert list(s3.main) == [0] and list(s3.small) == [2]  # type: ignore[attr-defined]
    assert 11 in s3.ghost  # type: ignore[attr-defined]
    # Key 11 again: a ghost hit goes straight to M (and leaves the ghost).
    d.insert(1, 4, key=11)
    assert list(s3.main) == [0, 1] and 11 not in s3.ghost  # type: ignore[attr-defined]
    d.insert(3, 5, release=False)  # S = [2, 3], 3 pinned
    d.hit(0, 6)  # freq[0] = 1 in M
    # v1: |S| = 2 >= 2 -> S, skipping pinned 3 -> 2 (freq 0; key 12 to ghost).
    # v2: |S| = 1 < 2 -> M: 0 has freq 1 -> decrement, reinsert at the tail; 1 -> evicted.
    # v3: M = [0], freq 0 -> 0.  v4: M empty, S holds only pinned 3 -> nothing.
    assert d.evict(4) == [2, 1, 0]
    assert 12 in s3.ghost  # type: ignore[attr-defined]


def test_sieve_hand_clears_visited_bits() -> None:
    d = Driver("sieve", 6)
    sieve = d.policy
    for e in range(5):  # queue tail -> head: 0 1 2 3 4
        d.insert(e, e)
    d.hit(0, 5)
    d.hit(2, 6)
    # Hand starts at the tail: 0 visited -> bit cleared, passed; 1 unvisited -> evicted;
    # the hand stays on 2 (the next entry towards the head).
    assert d.evict(1) == [1]
    assert sieve.hand == 2  # type: ignore[attr-defined]
    # 2 visited -> cleared, passed; 3 evicted; 4 evicted (hand falls off the head);
    # wrap to the tail: 0 lost its bit on the first pass -> evicted; then 2 (also cleared).
    assert d.evict(4) == [3, 4, 0, 2]


def test_sieve_passes_pinned_without_clearing() -> None:
    d = Driver("sieve", 4)
    d.insert(0, 0)
    d.insert(1, 1)
    d.insert(2, 2)
    d.hit(0, 3, release=False)  # visited and pinned
    # 0 pinned: passed and keeps its bit; 1 evicted, hand on 2.
    assert d.evict(1) == [1]
    d.release(0)
    # 2 unvisited -> evicted (hand falls off the head); wrap: 0 still visited -> cleared and
    # passed; wrap again -> 0 evicted.
    assert d.evict(2) == [2, 0]


def test_vllm_release_order() -> None:
    d = Driver("vllm", 8)
    for e in range(5):
        d.insert(e, 0, release=False)
    d.release(2, 1, 0)  # request A, tail first
    d.release(4, 3)  # request B, tail first
    d.hit(1, 1, release=False)  # a hit takes 1 out of the free queue
    # Queue: 2 0 4 3 (1 removed).
    assert d.evict(2) == [2, 0]
    d.release(1)  # back of the queue: 4 3 1
    assert d.evict(5) == [4, 3, 1]


@pytest.mark.parametrize(
    ("spec", "order"),
    [
        # sglang-lru: last access only; ties go to the first to become evictable: 0 (batch X)
        # then 2, 1 (batch Y); 3 (t=1) last. 5 (t=0) is pinned again.
        ("sglang-lru", [0, 2, 1, 3]),
        # hashtable: (last access, -depth): among t=0 the deepest first: 2, 1, 0; then 3.
        ("hashtable", [2, 1, 0, 3]),
    ],
)
def test_last_access_tie_breaking(spec: str, order: list[int]) -> None:
    d = Driver(spec, 8)
    for e, depth in ((0, 0), (1, 1), (2, 2), (5, 3)):
        d.insert(e, 0, depth=depth, release=False)
    d.insert(3, 1, depth=5, release=False)
    d.release(0, 5)  # batch X
    d.release(2, 1)  # batch Y
    d.release(3)
    d.pin(5)
    assert d.evict(6) == order


def hash_trace(seqs: list[list[int]]) -> Trace:
    """One request per key list; every block is full and keyed by its hash id."""
    reqs = [
        Request(arrival_s=float(r), input_length=BT * len(s), output_length=0, hash_ids=s)
        for r, s in enumerate(seqs)
    ]
    return Trace.from_requests(reqs, block_tokens=BT)


def identity_layout(seqs: list[list[int]]) -> BlockLayout:
    """Layout whose dense key ids equal the hash ids (every id 0..K-1 occurs)."""
    layout = hash_trace(seqs).block_layout(min_recompute_tokens=0)
    assert layout.keys.tolist() == layout.raw_keys.astype(np.int64).tolist()
    assert layout.num_lookup_blocks.tolist() == [len(s) for s in seqs]
    return layout


def test_opt_farthest_next_use_then_deepest() -> None:
    layout = identity_layout([[0, 1, 2], [3, 4], [0, 1, 2], [3]])
    d = Driver("opt", 8)
    d.policy.prepare(layout)
    # Entry e holds key e; 5 and 6 are later (non-primary) holders of keys 0 and 3.
    for e, key, depth in ((0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 0), (4, 4, 1)):
        d.insert(e, 1, key=key, depth=depth, release=False)
    d.insert(5, 1, key=0, depth=0, primary=False, release=False)
    d.insert(6, 1, key=3, depth=0, primary=False, release=False)
    d.release(0, 1, 2, 3, 4, 5, 6)  # after request 1 (parents released first, on purpose)
    d.pin(6)
    # Next use after request 1: keys 0, 1, 2 -> request 2; key 3 -> request 3; key 4 -> never.
    # Holder 5 is not the one lookups of key 0 take, so it is never used either.
    # Farthest first: the "never" tie, deepest first: 4 (depth 1), 5 (depth 0); then 3 (r3);
    # then the r2 tie, deepest first: 2, 1, 0. 6 is pinned. A parent never goes before its
    # evictable child.
    assert d.evict(8) == [4, 5, 3, 2, 1, 0]


def labelled(rows: list[tuple[str | None, str | None, int, int]]) -> Trace:
    """Request r arrives at t = r: (task, session, input tokens, turn); tokens unshared."""
    reqs = [
        Request(
            arrival_s=float(r),
            input_length=n,
            output_length=0,
            session_id=sid,
            turn=turn,
            task=task,
            input_tokens=list(range(100 * r, 100 * r + n)),
        )
        for r, (task, sid, n, turn) in enumerate(rows)
    ]
    return Trace.from_requests(reqs)


def unicache_driver(spec: str) -> Driver:
    """Blocks of BT tokens; the policy's clock is the view's (t = request index).

    r0 chat a, 8-token prompt: entries 0 1 (offsets 0 1) -> chat queue.
    r1 programming, 8 tokens: 2 3 (offsets 0 1) structural; 4 (offset 2, its end 12 > 8: a
       decode block of a single-turn task) -> evict queue.
    r2 untemplated: 5 -> evict queue.  r3 agentic b: 6 -> agentic queue.
    Gap models (given): log-normal mu 0, sigma 1 for both session queues.
    """
    d = Driver(spec, 8)
    d.view.size[:] = BT
    trace = labelled(
        [
            ("chat", "a", 8, 0),
            ("programming", None, 8, 0),
            ("untemplated", None, 4, 0),
            ("agentic", "b", 4, 0),
            ("chat", "a", 4, 1),
        ]
    )
    d.policy.prepare_trace(trace, "view")
    d.insert(0, 0, depth=0, release=False)
    d.insert(1, 0, depth=1, release=False)
    d.release(1, 0)
    for e in (2, 3, 4):
        d.insert(e, 1, depth=e - 2, release=False)
    d.release(4, 3, 2)
    d.insert(5, 2)
    d.insert(6, 3)
    d._clock(4)
    return d


GIVEN = "fit=given,chat_mu=0,chat_sigma=1,agentic_mu=0,agentic_sigma=1"


def test_unicache_evict_first_then_lowest_weighted_priority() -> None:
    d = unicache_driver(f"unicache:{GIVEN}")
    # Evict queue first, largest offset first: 4 (offset 2), 5 (0). Then stage 2 at t = 4,
    # G = alpha * s with alpha = 1: structural max offset 1: 3 has s = 1 - 1/1 = 0;
    # chat (idle 4): s = 1 - Phi(ln 4) = 0.083 for 1 then 0 (tail released first);
    # agentic (idle 1): s = 1 - Phi(0) = 0.5; structural 2: s = 1 - 0/1 = 1.
    assert d.evict(3) == [4, 5, 3]
    assert d.evict(8) == [1, 0, 6, 2]


def test_unicache_opt_keeps_blocks_the_waiting_queue_needs() -> None:
    d = unicache_driver(f"unicache-opt:{GIVEN}")
    # Waiting: [keys of 3 and 0] then [key of 4]. The others keep UniCache's order
    # (4 5 3 1 0 6 2 without 4, 3, 0): 5 1 6 2. Then the needed ones, the one needed last
    # first: 4 (position 1); then position 0, deepest first: 3 (offset 1), 0 (offset 0).
    d.policy.on_waiting([ids(13, 10), ids(14)])
    assert d.evict(8) == [5, 1, 6, 2, 4, 3, 0]


def _two_categories(d: Driver) -> None:
    """Blocks 0-1 of request 0 and 2-4 of request 1, each released tail first; then t = 2."""
    for e in (0, 1):
        d.insert(e, 0, depth=e, release=False)
    d.release(1, 0)
    for e in (2, 3, 4):
        d.insert(e, 1, depth=e - 2, release=False)
    d.release(4, 3, 2)
    d._clock(2)


def test_wa_lowest_reuse_probability_first() -> None:
    d = Driver("wa-atc25:window_s=1", 8)
    trace = labelled([("chat", "a", 8, 0), ("programming", None, 12, 0), ("chat", "a", 4, 1)])
    d.policy.prepare(trace.block_layout(BT))
    d.policy.prepare_trace(trace, "view")
    wa = d.policy
    assert wa.names == ["chat_1", "programming_1", "chat_2"]  # type: ignore[attr-defined]
    # Fits set by hand: p = (0.5, 0.9), rate = (1, 0.1) per second.
    wa.p, wa.rate = np.array([0.5, 0.9, 0.0]), np.array([1.0, 0.1, 1.0])  # type: ignore[attr-defined]
    _two_categories(d)
    # At t = 2, window 1 s: chat head (idle 2): 0.5 (e^-2 - e^-3) = 0.0428; programming head
    # (idle 1): 0.9 (e^-0.1 - e^-0.2) = 0.0775. Chat's blocks go first (same score, the tail
    # was pushed first), then programming's, tail first.
    assert d.evict(8) == [1, 0, 4, 3, 2]


def test_wa_per_category_lru_evicts_from_the_category_most_over_its_share() -> None:
    d = Driver("wa", 8)
    trace = labelled([("chat", "a", 8, 0), ("programming", None, 12, 0), ("chat", "a", 4, 1)])
    d.policy.prepare(trace.block_layout(BT))
    d.policy.prepare_trace(trace, "view")
    wa = d.policy
    assert wa.names == ["chat", "programming"]  # type: ignore[attr-defined]
    wa.share = np.array([0.3, 0.7])  # type: ignore[attr-defined]
    _two_categories(d)
    # held (chat, programming), held fraction - share: (2, 3): chat over by 0.1 -> its LRU
    # head, the tail 1; (1, 3): programming over by 0.05 -> 4 (tail first); (1, 2): chat
    # over by 1/30 -> 0; chat is empty: 3, 2. (Global LRU would take 1 0 first.)
    assert d.evict(8) == [1, 4, 0, 3, 2]


def test_opt_online_unneeded_lru_first_then_farthest_waiting() -> None:
    d = Driver("opt-online", 8)
    for e, depth in ((0, 0), (1, 0), (2, 0), (3, 1), (4, 2), (5, 0)):
        d.insert(e, e, depth=depth)
    d.insert(6, 6, release=False)  # pinned throughout
    d.hit(1, 7)  # recency: 0 2 3 4 5 1
    # Waiting: [keys 12 13] [15] [12 13 14 16]: key 12, 13 at position 0, 15 at 1, 14 at 2;
    # 16 belongs to the pinned entry. Unneeded, least recent first: 0, 1. Then farthest
    # position first: 4 (2), 5 (1); position 0, deepest first: 3 (offset 1), 2 (offset 0).
    d.policy.on_waiting([ids(12, 13), ids(15), ids(12, 13, 14, 16)])
    assert d.evict(1) == [0]
    assert d.evict(8) == [1, 4, 5, 3, 2]


# ---------------------------------------------------------------------------- block cache


class BlockRun:
    """Replays a hash-form trace on a BlockCache exactly like ``runner.replay``, step by step."""

    def __init__(self, spec: str, seqs: list[list[int]], capacity_blocks: int = 4) -> None:
        self.layout = identity_layout(seqs)
        self.policy = make_policy(spec, "block")
        self.cache = BlockCache(
            capacity_blocks, self.policy, self.layout.num_distinct_keys, block_tokens=BT
        )
        if self.policy.needs_future:
            self.policy.prepare(self.layout)
        self.r = 0

    def step(self) -> set[int]:
        cache, lay, r = self.cache, self.layout, self.r
        cache.view.now = float(r)
        cache.view.request_index = r
        keys = lay.request_keys(r)
        m = cache.match(keys[: int(lay.num_lookup_blocks[r])], int(lay.lookup_end_tokens[r]))
        held = cache.acquire(m, int(lay.num_blocks_held[r]))
        assert held is not None
        cache.commit(held, keys, m.num_hit_blocks)
        cache.release(held)
        cache.check()
        self.r += 1
        return cache.cached_keys()

    def run(self) -> list[set[int]]:
        return [self.step() for _ in range(len(self.layout.key_offsets) - 1)]


def singles(*keys: int) -> list[list[int]]:
    return [[k] for k in keys]


WARM = [{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}]  # four misses fill the 4-block pool


@pytest.mark.parametrize(
    ("spec", "seqs", "after"),
    [
        # LRU: hit 0 at r4 -> recency 1 2 3 0; 4 evicts 1, 5 evicts 2.
        ("lru", singles(0, 1, 2, 3, 0, 4, 5), [*WARM, WARM[3], {0, 2, 3, 4}, {0, 3, 4, 5}]),
        # FIFO: the hit is ignored; 4 evicts 0, 5 evicts 1.
        ("fifo", singles(0, 1, 2, 3, 0, 4, 5), [*WARM, WARM[3], {1, 2, 3, 4}, {2, 3, 4, 5}]),
        # LFU: hits 0:2 (t5), 1:1 (t6), 2:0 (t2), 3:0 (t3). 4 evicts 2 (0 hits, oldest);
        # 5 evicts 3; 6 evicts 4 (0 hits, t7 < t8 of key 5).
        (
            "lfu",
            singles(0, 1, 2, 3, 0, 0, 1, 4, 5, 6),
            [*WARM, *[WARM[3]] * 3, {0, 1, 3, 4}, {0, 1, 4, 5}, {0, 1, 5, 6}],
        ),
        # MRU: 4 evicts the newest, 3 (t3); the hit at r5 makes 0 the newest; 5 evicts 0.
        ("mru", singles(0, 1, 2, 3, 4, 0, 5), [*WARM, {0, 1, 2, 4}, {0, 1, 2, 4}, {1, 2, 4, 5}]),
        # ARC (c = 4): hit 0 -> T2. r5: |T1| = 3 > p = 0 -> evict 1 (B1 = [1]), 4 into T1.
        # r6: evict T1 head 2 (B1 = [1, 2]); key 1 is a B1 ghost -> p = 1, into T2.
        # r7: T1 = [3, 4], |T1| = 2 > 1 -> evict 3. r8: T1 = [4, 5] -> evict 4. Keys 0 and 1
        # survive in T2 (LRU would have dropped 0 at r8).
        (
            "arc",
            singles(0, 1, 2, 3, 0, 4, 1, 5, 6),
            [*WARM, WARM[3], {0, 2, 3, 4}, {0, 1, 3, 4}, {0, 1, 4, 5}, {0, 1, 5, 6}],
        ),
        # S3-FIFO (S target = max(1, round(0.4)) = 1): r5 drains S: 0 (hit) -> M, 1 -> ghost.
        # r6 evicts 2 (ghost [1, 2]); key 1 is a ghost hit -> M. r7 evicts 3, r8 evicts 4
        # (S is FIFO: [3, 4] then [4, 5]); M keeps 0 and 1.
        (
            "s3fifo",
            singles(0, 1, 2, 3, 0, 4, 1, 5, 6),
            [*WARM, WARM[3], {0, 2, 3, 4}, {0, 1, 3, 4}, {0, 1, 4, 5}, {0, 1, 5, 6}],
        ),
        # SIEVE: hit 0 sets its bit. r5: hand at tail 0 (visited, cleared) -> evict 1, hand on
        # 2. r6: evict 2, hand on 3. r7: hit 3. r8: 3 visited (cleared) -> evict 4 (key 4 sits
        # in block 1, re-inserted at the head after 3).
        (
            "sieve",
            singles(0, 1, 2, 3, 0, 4, 5, 3, 6),
            [*WARM, WARM[3], {0, 2, 3, 4}, {0, 3, 4, 5}, {0, 3, 4, 5}, {0, 3, 5, 6}],
        ),
        # vllm: r0, r1 release tail first -> queue b1(k1) b0(k0) b3(k3) b2(k2).
        # r2 evicts k1. r3 [0, 5]: hit b0 (leaves the queue), evict b3 (k3); release b3, b0.
        # Queue b2(k2) b1(k4) b3(k5) b0(k0): r4 evicts k2, k4.
        (
            "vllm",
            [[0, 1], [2, 3], [4], [0, 5], [6, 7]],
            [{0, 1}, {0, 1, 2, 3}, {0, 2, 3, 4}, {0, 2, 4, 5}, {0, 5, 6, 7}],
        ),
        # sglang-lru on the same replay: last access is the release time, ties go to the
        # first released (the tail): the same order as vllm.
        (
            "sglang-lru",
            [[0, 1], [2, 3], [4], [0, 5], [6, 7]],
            [{0, 1}, {0, 1, 2, 3}, {0, 2, 3, 4}, {0, 2, 4, 5}, {0, 5, 6, 7}],
        ),
        # hashtable: oldest access first, deepest on ties: r2 evicts k1 (t0, depth 1);
        # r3 evicts k3 (t1, depth 1); r4 evicts k2 (t1) then k4 (t2).
        (
            "hashtable",
            [[0, 1], [2, 3], [4], [0, 5], [6, 7]],
            [{0, 1}, {0, 1, 2, 3}, {0, 2, 3, 4}, {0, 2, 4, 5}, {0, 5, 6, 7}],
        ),
        # OPT: at r2, next uses after the releases: k0, k1 -> r4, k2 -> r3, k3 -> r5:
        # evict k3. At r5 [2, 3]: k2 is hit; k0, k1 (released at r4) and k4 are never used
        # again: the deepest, k1, goes first (not its parent k0).
        (
            "opt",
            [[0, 1], [2, 3], [4], [2], [0, 1], [2, 3]],
            [{0, 1}, {0, 1, 2, 3}, {0, 1, 2, 4}, {0, 1, 2, 4}, {0, 1, 2, 4}, {0, 2, 3, 4}],
        ),
    ],
)
def test_block_cache_replay(spec: str, seqs: list[list[int]], after: list[set[int]]) -> None:
    assert BlockRun(spec, seqs).run() == after


def test_block_cache_arc_p_and_lists() -> None:
    run = BlockRun("arc", singles(0, 1, 2, 3, 0, 4, 1))
    for _ in range(6):
        run.step()
    arc = run.policy
    assert arc.p == 0.0  # type: ignore[attr-defined]
    # r6: key 1 misses, but it is in B1: p = 0 + max(|B2| / |B1|, 1) = 1 and its new block
    # (block 2, freed by evicting key 2) joins T2 behind block 0.
    assert run.step() == {0, 1, 3, 4}
    assert arc.p == 1.0  # type: ignore[attr-defined]
    assert list(arc.t2) == [0, 2]  # type: ignore[attr-defined]


def test_block_cache_s3fifo_ghost_readmission_goes_to_main() -> None:
    run = BlockRun("s3fifo", singles(0, 1, 2, 3, 0, 4, 1))
    snaps = run.run()
    assert snaps[-1] == {0, 1, 3, 4}
    s3 = run.policy
    # Block 0 (key 0, hit once) was promoted to M at r5; block 2 took key 1 back from the
    # ghost at r6, straight into M. S holds blocks 3 (key 3) and 1 (key 4).
    assert list(s3.main) == [0, 2]  # type: ignore[attr-defined]
    assert list(s3.small) == [3, 1]  # type: ignore[attr-defined]
    assert 2 in s3.ghost and 1 not in s3.ghost  # type: ignore[attr-defined]


def test_block_cache_lecar_weights() -> None:
    # seed 2 draws 0.2616, 0.2985, ...: both first evictions use LRU (w_lru = 0.5).
    rng = np.random.default_rng(2)
    assert rng.random() < 0.5 and rng.random() < 0.5
    run = BlockRun("lecar:seed=2", singles(0, 0, 1, 2, 3, 4, 0, 1))
    lecar = run.policy
    e = math.exp(-0.45 * 0.005 ** (1 / 4))  # learning rate 0.45, capacity 4
    # LeCaR's clock: insert 0 @1, hit 0 @2, 1 @3, 2 @4, 3 @5.
    assert [run.step() for _ in range(5)] == [{0}, {0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}]
    # r5: LRU evicts key 0 (oldest touch @2; history time 5); key 4 inserted @6.
    assert run.step() == {1, 2, 3, 4}
    assert lecar.w_lru == 0.5  # type: ignore[attr-defined]
    # r6: LRU evicts key 1 (@3; history time 6). Key 0 returns at clock 6: regret
    # discount ** (6 - 5) on the LRU expert.
    assert run.step() == {0, 2, 3, 4}
    w1 = 0.5 * e / (0.5 * e + 0.5)
    assert lecar.w_lru == pytest.approx(w1, rel=1e-12)  # type: ignore[attr-defined]
    # r7: both experts pick key 2 (oldest and least frequent); key 1 returns at clock 7,
    # its LRU history time was 6: the LRU weight is penalised again by discount ** 1.
    assert run.step() == {0, 1, 3, 4}
    w2 = w1 * e / (w1 * e + (1 - w1))
    assert lecar.w_lru == pytest.approx(w2, rel=1e-12)  # type: ignore[attr-defined]


def start(cache: BlockCache, keys: list[int], now: float) -> I64:
    """Match, acquire and commit one request (it keeps running until ``finish``)."""
    cache.view.now = now
    cache.view.request_index = int(now)
    k = np.array(keys, dtype=np.int64)
    m = cache.match(k)
    held = cache.acquire(m, len(keys))
    assert held is not None
    cache.commit(held, k, m.num_hit_blocks)
    cache.check()
    return held


def finish(cache: BlockCache, held: I64) -> None:
    cache.release(held)
    cache.check()


@pytest.mark.parametrize(
    ("spec", "after"),
    [
        # vllm: release order is B (b3, b2) then A (b1, b0): [4, 5] evicts keys 3, 2.
        ("vllm", {0, 1, 4, 5}),
        # sglang-lru: A's blocks were last accessed at t=0, B's at t=1: evict 1, 0 (tail
        # first among A's: b1 became evictable before b0).
        ("sglang-lru", {2, 3, 4, 5}),
        # hashtable: t=0 first, deepest first: keys 1, 0.
        ("hashtable", {2, 3, 4, 5}),
        # lru: insertion/access order b0 b1 b2 b3: keys 0, 1.
        ("lru", {2, 3, 4, 5}),
    ],
)
def test_overlapping_requests_release_order_vs_access_order(spec: str, after: set[int]) -> None:
    cache = BlockCache(4, make_policy(spec, "block"), 8, block_tokens=BT)
    a = start(cache, [0, 1], 0)
    b = start(cache, [2, 3], 1)
    finish(cache, b)  # B finishes first although it started later
    finish(cache, a)
    finish(cache, start(cache, [4, 5], 2))
    assert cache.cached_keys() == after


@pytest.mark.parametrize(
    ("spec", "after"),
    [
        # sglang-lru: all three blocks at t=0; B's b2 became evictable first -> key 2.
        ("sglang-lru", {0, 1, 3, 4}),
        # hashtable: all at t=0; the deepest (A's b1, depth 1) first -> key 1.
        ("hashtable", {0, 2, 3, 4}),
    ],
)
def test_same_time_tie_breaking_through_block_cache(spec: str, after: set[int]) -> None:
    cache = BlockCache(4, make_policy(spec, "block"), 8, block_tokens=BT)
    a = start(cache, [0, 1], 0)
    b = start(cache, [2], 0)
    finish(cache, b)
    finish(cache, a)
    # [3, 4] takes the empty block 3, then evicts one cached block.
    held = start(cache, [3, 4], 1)
    assert held[0] == 3
    finish(cache, held)
    assert cache.cached_keys() == after


# ---------------------------------------------------------------------------- OPT through replay
def _trace(seqs: list[list[int]]) -> Trace:
    return Trace.from_requests(
        [Request(float(i), len(s), 0, input_tokens=s) for i, s in enumerate(seqs)]
    )


class CachedKeys:
    """Which keys have at least one holder, from Stored / Removed events."""

    def __init__(self) -> None:
        self.holders: Counter[int] = Counter()

    def on_event(self, event: Event) -> None:
        if isinstance(event, Stored):
            self.holders.update(event.keys.tolist())
        elif isinstance(event, Removed):
            self.holders.subtract(event.keys.tolist())

    def cached(self) -> set[int]:
        return {k for k, n in self.holders.items() if n > 0}


def test_opt_ranks_a_duplicate_holder_as_never_used() -> None:
    # [26,49,49,22] recomputes block (26,49)'s key... a second holder of a key must not look
    # "needed soon" after its key's use has passed (OPT fell below vllm here).
    t = _trace(
        [
            [26, 49, 27],
            [26, 49],
            [26, 49, 49, 22],
            [49, 46, 48, 7],
            [1, 6, 16, 34, 19, 6, 16, 19],
            [49, 46, 48, 7],
        ]
    )
    cfg = ReplayConfig(capacity_blocks=5, block_tokens=2)
    assert replay(t, "opt", cfg, check_every=1).hit_tokens.tolist() == [0, 0, 2, 0, 0, 2]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=9), min_size=2, max_size=9),
    capacity=st.integers(5, 9),
)
def test_opt_never_keeps_a_block_whose_prefix_it_evicted(
    seqs: list[list[int]], capacity: int
) -> None:
    trace = _trace(seqs)
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=1)
    layout = trace.block_layout(1)
    if int(layout.num_blocks_held.max()) > capacity:
        return
    parent: dict[int, int] = {}
    for r in range(len(trace)):
        ks = layout.request_keys(r).tolist()
        parent.update({k: p for p, k in itertools.pairwise(ks)})
    tracker = CachedKeys()
    checked: list[int] = []

    def after_request(r: int) -> None:
        cached = tracker.cached()
        orphans = [k for k in cached if k in parent and parent[k] not in cached]
        assert not orphans, f"after request {r}: {orphans} cached without their prefix"
        checked.append(r)

    replay(trace, "opt", cfg, observers=[tracker], on_step=after_request)
    assert len(checked) == len(trace)
