"""SGLang's SWA radix cache (cache/swa_radix.py): hand-computed trees, hits and evictions,
the invariant checker on random traces, and a naive model of what a full-KV match can hit.

The comparison with SGLang's own cache is tests/test_reference_sglang_swa.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixlab.cache.swa_radix import SwaNode, SwaRadixCache
from prefixlab.errors import ConfigError
from prefixlab.model.spec import get_model
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.swa_radix import sglang_pools, sglang_window
from prefixlab.runner.engine.tiers import TierConfig
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders.base import load_trace
from prefixlab.workload.loaders.native import write_native
from tests.reference.swa_protocol import page_keys, read_requests, serve

TIMING = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.01")

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


# ---------------------------------------------------------------- the engine's SWA rule


def gpt_oss_like(tmp_path: Path, window: int) -> Path:
    """A small model whose attention layers alternate sliding and full (gpt-oss's form)."""
    spec = {
        "hidden_size": 64,
        "num_attention_layers": 6,
        "num_sliding_layers": 3,
        "sliding_window": window,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 32,
    }
    path = tmp_path / "model.json"
    path.write_text(json.dumps(spec))
    return path


def one_at_a_time(capacity: int, page: int, model: Path, **kw: object) -> EngineConfig:
    return EngineConfig(
        capacity_blocks=capacity,
        block_tokens=page,
        structure="radix",
        model=str(model),
        max_num_seqs=1,
        chunked_prefill=False,
        max_num_batched_tokens=1 << 24,
        **kw,  # type: ignore[arg-type]
    )


def test_sglang_pools_split_the_memory_as_sglang_does() -> None:
    # gpt-oss-20b: 12 full and 12 sliding layers. 1,000 blocks of 16 tokens of every layer
    # are 16,000 x 24 layer-tokens; SGLang's cell is 12 + 0.8 x 12 = 21.6 of them:
    # 17,777 tokens, 17,776 in whole pages (1,111); the SWA pool 0.8 of that, 14,220 ->
    # 14,208 tokens (888 pages). gpt-oss's window of 128 is 127 in SGLang's model code.
    model = get_model("gpt-oss-20b")
    assert sglang_pools(1000, model, 16) == (1111, 888)
    assert sglang_window(model) == 127


@pytest.mark.parametrize(
    ("page", "window", "capacity"), [(16, 128, 1500), (1, 128, 20000), (4, 41, 8000)]
)
def test_engine_one_at_a_time_equals_the_cache_protocol(
    tmp_path: Path, page: int, window: int, capacity: int
) -> None:
    # The engine's scheduler driving SwaEngineCache makes the calls the protocol replay
    # makes (tests/reference/swa_protocol.py, which equals SGLang): the same hit for every
    # request, on 120 requests of the demo workload.
    model = gpt_oss_like(tmp_path, window)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=120)
    path = tmp_path / "trace.jsonl"
    write_native(trace, path)
    spec = get_model(str(model))
    full, swa = sglang_pools(capacity, spec, page)
    want = serve(read_requests(path), page, sglang_window(spec), full * page, swa * page)
    assert "failed_request" not in want and sum(want["swa_evicted"]) > 0  # it evicts
    cfg = one_at_a_time(capacity, page, model)
    every = 1 if page > 1 else 40  # (1-token pages: a check per 40 steps keeps it quick)
    got = simulate(trace, "sglang-lru", cfg, TIMING, check_every=every).hit_tokens
    assert got.tolist() == want["hit_tokens"]


def test_engine_batches_keep_the_invariants(tmp_path: Path) -> None:
    # Several requests at once, chunked prefill: every scheduler step checks the pools
    # and every running request's holdings; the same run twice gives the same result.
    model = gpt_oss_like(tmp_path, 64)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=150)
    cfg = EngineConfig(
        capacity_blocks=1200,
        block_tokens=16,
        structure="radix",
        model=str(model),
        max_num_seqs=8,
        max_num_batched_tokens=2048,
    )
    a = simulate(trace, "sglang-lru", cfg, TIMING, check_every=1)
    b = simulate(trace, "sglang-lru", cfg, TIMING)
    assert np.array_equal(a.hit_tokens, b.hit_tokens)
    assert np.array_equal(a.first_token_s, b.first_token_s)
    full = simulate(trace, "sglang-lru", _with_rule(cfg, "full"), TIMING)
    assert a.hit_tokens.sum() > 0 and full.hit_tokens.sum() > 0
    assert not np.array_equal(a.hit_tokens, full.hit_tokens)  # the rule changed the run


def _with_rule(cfg: EngineConfig, rule: str) -> EngineConfig:
    return replace(cfg, sliding_window_rule=rule)


def test_gemma_3_on_the_radix_structure_keeps_every_layer(tmp_path: Path) -> None:
    # SGLang 0.5.23 serves Gemma 2 and 3 on one full-size pool: the window rule on the
    # radix structure is then the full rule.
    trace = GENERATORS["mix"].fn(trace=2, num_requests=60)
    base = EngineConfig(
        capacity_blocks=1000, block_tokens=16, structure="radix", model="gemma-3-12b"
    )
    a = simulate(trace, "sglang-lru", base, TIMING)
    b = simulate(trace, "sglang-lru", _with_rule(base, "full"), TIMING)
    assert np.array_equal(a.hit_tokens, b.hit_tokens) and a.hit_tokens.sum() > 0
    # while gpt-oss gets SGLang's SWA pools
    c = simulate(trace, "sglang-lru", replace(base, model="gpt-oss-20b"), TIMING)
    d = simulate(
        trace, "sglang-lru", replace(base, model="gpt-oss-20b", sliding_window_rule="full"), TIMING
    )
    assert not np.array_equal(c.hit_tokens, d.hit_tokens)


@pytest.mark.parametrize(
    ("policy", "extra", "message"),
    [
        ("lru", {}, "SGLang's own LRU"),
        ("sglang-lru", {"tiers": (TierConfig(name="cpu", capacity_blocks=100),)}, "tiers"),
    ],
)
def test_what_the_rule_does_not_combine_with_is_refused(
    tmp_path: Path, policy: str, extra: dict[str, object], message: str
) -> None:
    model = gpt_oss_like(tmp_path, 64)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=10)
    cfg = one_at_a_time(400, 16, model, **extra)
    with pytest.raises(ConfigError, match=message):
        simulate(trace, policy, cfg, TIMING)


def test_one_replica_fleet_is_the_engine_and_kv_aware_hears_the_full_kv(tmp_path: Path) -> None:
    # The fleet runs SGLang's rule on its reference loop: one replica is the engine runner;
    # behind kv-aware (which hears the replicas' stored and removed full-KV pages) the
    # invariants hold at every step of every replica.
    model = gpt_oss_like(tmp_path, 64)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=80)
    cfg = EngineConfig(capacity_blocks=1500, block_tokens=16, structure="radix", model=str(model))
    engine = simulate(trace, "sglang-lru", cfg, TIMING)
    fleet = simulate_fleet(trace, "sglang-lru", cfg, FleetConfig(1, "random"), TIMING)
    assert np.array_equal(engine.hit_tokens, fleet.engine.hit_tokens)
    assert np.array_equal(engine.first_token_s, fleet.engine.first_token_s)
    busy = trace.time_scaled(0.002)  # (500 times the rate: the replicas overlap)
    two = simulate_fleet(busy, "sglang-lru", cfg, FleetConfig(2, "kv-aware"), TIMING, check_every=1)
    assert sorted(set(two.replica.tolist())) == [0, 1]
    assert two.engine.hit_tokens.sum() > 0


@pytest.mark.parametrize(
    ("capacity", "hits"), [(300, [0, 0, 14, 0, 17, 18]), (25, [0, 0, 14, 0, 0, 8])]
)
def test_engine_on_the_worked_example(tmp_path: Path, capacity: int, hits: list[int]) -> None:
    # Through the engine, one request at a time. R4 has one output token: it finishes at
    # its prefill and (as in SGLang) frees no out-of-window slot. At 25 blocks (pools of
    # 27 full and 21 SWA tokens) it misses, recomputes its prompt and leaves it live, so
    # R5 (R4's prompt resent) hits what the pools kept of it.
    model = gpt_oss_like(tmp_path, 5)  # SGLang's window: 4
    full, swa = sglang_pools(capacity, get_model(str(model)), 1)
    reqs = [*EXAMPLE, (EXAMPLE[4][0] + [306, 307], [308])]  # R5 resends R4's whole prompt
    want = serve(reqs, 1, 4, full, swa)
    trace = load_trace(_native(tmp_path, reqs))
    got = simulate(trace, "sglang-lru", one_at_a_time(capacity, 1, model), TIMING, check_every=1)
    assert got.hit_tokens.tolist() == want["hit_tokens"]
    assert want["hit_tokens"] == hits


@pytest.mark.parametrize("budget", [3, 5, 20])
def test_chunked_prefill_equals_the_replay(tmp_path: Path, budget: int) -> None:
    # Chunked prefill (8-token pages, chunks of 3, 5 and 20 tokens): SGLang checkpoints
    # after every chunk; one request at a time the hits equal a replay that does, and
    # every step keeps the invariants. (A chunk that completes no page frees what the
    # next checkpoint would: with one request running that is not observable.)
    model = gpt_oss_like(tmp_path, 9)  # SGLang's window: 8
    reqs = _chats(7, 2, 6)
    path = _native(tmp_path, reqs)
    cfg = replace(one_at_a_time(100, 8, model), chunked_prefill=True, max_num_batched_tokens=budget)
    got = simulate(load_trace(path), "sglang-lru", cfg, TIMING, check_every=1).hit_tokens
    full, swa = sglang_pools(100, get_model(str(model)), 8)
    want = _serve_chunked(reqs, 8, 8, full * 8, swa * 8, budget)
    assert got.tolist() == want


def _serve_chunked(
    reqs: list[tuple[list[int], list[int]]], page: int, window: int, full: int, swa: int, chunk: int
) -> list[int]:
    """The protocol replay with the prompt prefilled in chunks of ``chunk`` tokens, a
    checkpoint after each but the last of a request that finishes at its prefill."""
    cache = SwaRadixCache(full // page, swa // page, page, window)
    table: dict[tuple[int, ...], int] = {}
    hits = []
    for inp, out in reqs:
        n, length = max(len(out), 1), len(inp)
        keys = page_keys(inp + out, page, table)
        m = cache.match(keys[: (length - 1) // page])
        hits.append(m.num_hit_tokens)
        req = cache.admit(m)
        cache.evict_for(length - m.num_hit_tokens + page)
        assert cache.allocate(req, -(-length // page) - m.num_hit_blocks)
        done = m.num_hit_tokens
        while done < length:
            done = min(done + chunk, length)
            if done < length or n > 1:
                cache.checkpoint(req, keys, done, finished=False)
        for k in range(1, n):
            pos = length + k - 1
            if k >= 2 and pos - window >= req.freed * page + 128:
                cache.free_out_of_window(req, pos)
            cache.evict_for(page)
            if pos % page == 0:
                assert cache.allocate(req, 1)
        cache.checkpoint(req, keys, length + n - 1, finished=True)
        cache.finish(req)
        cache.check()
    return hits


def _native(tmp_path: Path, reqs: list[tuple[list[int], list[int]]]) -> Path:
    """The requests as a native token-form trace, one a second."""
    lines = ['{"prefixlab_trace": 1}']
    for i, (inp, out) in enumerate(reqs):
        row = {"arrival_s": float(i), "input_length": len(inp), "output_length": len(out)}
        lines.append(json.dumps({**row, "input_tokens": inp, "output_tokens": out}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
