"""SGLang's SWA radix cache (cache/swa_radix.py): hand-computed trees, hits and evictions,
the invariant checker on random traces, and a naive model of what a full-KV match can hit.

The comparison with SGLang's own cache is tests/test_reference_sglang_swa.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixlab.cache.swa_radix import SwaNode, SwaRadixCache
from prefixlab.errors import ConfigError
from tests.reference.swa_protocol import page_keys, serve

A = list(range(1, 13))
# The worked example: window 4 tokens, 1-token pages.
EXAMPLE = [
    (A, [101, 102, 103]),
    ([*range(1, 11), 201, 202], [203, 204]),
    ([*A, 101, 102, 301, 302], [303, 304]),
    (list(range(401, 417)), [501, 502, 503, 504]),
    ([*A, 101, 102, 301, 302, 303, 305], [306]),
]


def _segments(cache: SwaRadixCache) -> list[tuple[int, int, bool]]:
    """Every node as (start, end, live) in token positions, depth first."""
    out: list[tuple[int, int, bool]] = []

    def walk(node: SwaNode, start: int) -> None:
        for key in sorted(node.children):
            child = node.children[key]
            end = start + child.pages * cache.page
            out.append((start, end, child.live))
            walk(child, end)

    walk(cache.root, 0)
    return out


def test_first_request_leaves_a_tombstone_then_a_live_window() -> None:
    # R0: 12 prompt tokens, 3 outputs. Its prefill frees the SWA slots of tokens before
    # 11 - 4 = 7 and inserts [0, 12): [0, 7) a tombstone, [7, 12) live, its last 4 tokens
    # their own leaf. The finish inserts 12 + 3 - 1 = 14 tokens: [12, 14) live (103, the
    # last sampled token, has no KV).
    cache = SwaRadixCache(200, 1000, 1, 4)
    table: dict[tuple[int, ...], int] = {}
    inp, out = EXAMPLE[0]
    keys = page_keys(inp + out, 1, table)
    req = cache.admit(cache.match(keys[:11]))
    assert cache.allocate(req, 12)
    cache.checkpoint(req, keys, 12, finished=False)
    assert _segments(cache) == [(0, 7, False), (7, 8, True), (8, 12, True)]
    assert req.freed == 7 and cache.held_swa == 0 and cache.held_full == 0
    assert cache.allocate(req, 1) and cache.allocate(req, 1)  # decode positions 12, 13
    cache.checkpoint(req, keys, 14, finished=True)
    cache.finish(req)
    assert _segments(cache) == [(0, 7, False), (7, 8, True), (8, 12, True), (12, 14, True)]
    assert (cache.tree_pages, cache.tree_live) == (14, 7)
    cache.check()


def test_a_hit_needs_a_window_of_live_tokens_after_the_last_tombstone() -> None:
    # R1 shares 10 tokens with R0, but past the tombstone [0, 7) only 3 < 4 tokens are
    # live: no hit. R2 resends R0's 14 tokens: 7 live ones after the tombstone, hit 14.
    out = serve(EXAMPLE[:3], 1, 4, 200, 1000)
    assert out["hit_tokens"] == [0, 0, 14]


@pytest.mark.parametrize(
    ("swa", "hits", "full_evicted", "swa_evicted"),
    [
        # room for everything: R4 hits all 17 tokens it may
        (1000, [0, 0, 14, 0, 17], [0] * 5, [0] * 5),
        # R3 (16 new tokens, 13 SWA slots free) tombstones [5, 7) and [7, 8): 3 slots
        (28, [0, 0, 14, 0, 17], [0] * 5, [0, 0, 0, 3, 0]),
        # R3 needs 11 SWA slots: [5,7) and [7,8) tombstoned, R1's leaf [10,13) evicted
        # whole (3 full, 3 SWA), then [8,10), [10,12), [12,14) tombstoned: 12 SWA. R4's
        # path is then live only for 3 tokens after a tombstone: no hit.
        (20, [0, 0, 14, 0, 0], [0, 0, 0, 3, 4], [0, 0, 0, 12, 11]),
    ],
)
def test_worked_example(
    swa: int, hits: list[int], full_evicted: list[int], swa_evicted: list[int]
) -> None:
    out = serve(EXAMPLE, 1, 4, 200, swa, check=True)
    assert out["hit_tokens"] == hits
    assert out["full_evicted"] == full_evicted
    assert out["swa_evicted"] == swa_evicted


def test_two_token_pages_align_the_freed_point() -> None:
    # With 2-token pages R0 frees below floor_2(11 - 4) = 6: [6, 12) is live, so R1's 10
    # shared tokens carry 4 live ones after the tombstone and hit.
    out = serve(EXAMPLE, 2, 4, 200, 1000)
    assert out["hit_tokens"] == [0, 10, 14, 0, 16]


def test_the_pools_are_checked() -> None:
    with pytest.raises(ConfigError, match="larger than the window"):
        SwaRadixCache(100, 4, 1, 4)
    with pytest.raises(ConfigError, match="both pools"):
        SwaRadixCache(0, 10, 1, 4)


def _chats(seed: int, sessions: int, turns: int) -> list[tuple[list[int], list[int]]]:
    """Interleaved chats (each turn resends the whole conversation) and one-off prompts."""
    rng = np.random.default_rng(seed)
    history: list[list[int]] = [[] for _ in range(sessions)]
    reqs: list[tuple[list[int], list[int]]] = []
    fresh = 1000
    for _ in range(turns * sessions):
        s = int(rng.integers(sessions + 1))
        n_new, n_out = int(rng.integers(1, 40)), int(rng.integers(1, 30))
        new = list(range(fresh, fresh + n_new))
        out = list(range(fresh + n_new, fresh + n_new + n_out))
        fresh += n_new + n_out
        if s == sessions:
            reqs.append((new, out))
            continue
        inp = history[s] + new
        reqs.append((inp, out))
        history[s] = inp + out
    return reqs


def _naive_hits(reqs: list[tuple[list[int], list[int]]], page: int) -> list[int]:
    """What a match of the full KV alone can hit: the longest page-aligned prefix of the
    first len - 1 input tokens that an earlier request inserted (its prompt after
    prefill, then input + output but the last token)."""
    seen: set[tuple[int, ...]] = set()
    hits = []
    for inp, out in reqs:
        n = max(len(out), 1)
        k = (len(inp) - 1) // page
        while k and tuple(inp[: k * page]) not in seen:
            k -= 1
        hits.append(k * page)
        seq = inp + (list(out) or [0])
        for end in (len(inp), len(inp) + n - 1):
            for j in range(1, end // page + 1):
                seen.add(tuple(seq[: j * page]))
    return hits


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    page=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 24),
)
def test_with_room_for_everything_every_inserted_prefix_is_a_hit(
    seed: int, page: int, window: int
) -> None:
    # With both pools unbounded nothing is evicted, and a request's own frees always leave
    # a window of live tokens at the end of each insert: every turn hits the whole
    # conversation before it, as the naive model does.
    reqs = _chats(seed, 3, 5)
    window = max(window, 1)
    out = serve(reqs, page, window, 10**6, 10**6, check=True)
    assert out["hit_tokens"] == _naive_hits(reqs, page)
    assert sum(out["full_evicted"]) == sum(out["swa_evicted"]) == 0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    page=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 24),
    full=st.integers(150, 600),
    ratio=st.floats(0.2, 1.0),
)
def test_small_pools_keep_the_invariants_and_never_beat_the_naive_model(
    seed: int, page: int, window: int, full: int, ratio: float
) -> None:
    reqs = _chats(seed, 3, 5)
    swa = max(int(full * ratio) // page * page, (window // page + 2) * page + page)
    full = full // page * page
    out = serve(reqs, page, window, full, swa, check=True)
    done = len(out["hit_tokens"])
    naive = _naive_hits(reqs, page)[:done]
    assert all(h <= n for h, n in zip(out["hit_tokens"], naive, strict=True))
    assert all(h % page == 0 for h in out["hit_tokens"])
