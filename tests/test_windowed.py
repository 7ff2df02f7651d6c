"""vLLM's hybrid KV-cache manager for sliding-window models (runner/engine/windowed.py):
the grouping, the hit rule and the pages freed past the window, by hand; the engine's
invariants under it; the limits it refuses. (Request by request against vLLM itself:
tests/test_reference_vllm_window.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.model.presets import MODEL_PRESETS
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import make_policy
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.tiers import TierConfig
from prefixlab.runner.engine.windowed import (
    WindowedBlockCache,
    WindowedMatch,
    _window_hit,
    window_groups,
)
from prefixlab.workload.generators import GENERATORS

TIMING = make_timing("power:preset=llama-3.2-1b-a100+tpot:s=0.01")


def _model(tmp_path: Path, layers: int, sliding: int, window: int) -> str:
    path = tmp_path / f"swa-{layers}-{sliding}-{window}.json"
    spec = {
        "hidden_size": 64,
        "num_attention_layers": layers,
        "num_sliding_layers": sliding,
        "sliding_window": window,
        "num_heads": 2,
        "num_kv_heads": 1,
        "head_dim": 32,
    }
    path.write_text(json.dumps(spec))
    return str(path)


def test_vllm_groups_the_presets() -> None:
    # Gemma 3 27B: 10 full, 52 sliding: groups of 10 (the fewer), 6 sliding (last padded)
    g = window_groups(MODEL_PRESETS["gemma-3-27b"], 16)
    assert (g.group_size, g.full_groups, g.sliding_groups) == (10, 1, 6)
    assert g.window_blocks == 64  # ceil(1023 / 16)
    # gpt-oss: 18 and 18: one group of each
    g = window_groups(MODEL_PRESETS["gpt-oss-120b"], 16)
    assert (g.group_size, g.full_groups, g.sliding_groups, g.window_blocks) == (18, 1, 1, 8)
    # Gemma 3 12B: 8 full, 40 sliding: 5 sliding groups
    assert window_groups(MODEL_PRESETS["gemma-3-12b"], 16).sliding_groups == 5


def test_grouping_rule_of_one_and_a_half(tmp_path: Path) -> None:
    from prefixlab.model.spec import get_model

    # 4 sliding, 3 full: 4 < 1.5 x 3, so groups of 4 (the full one padded)
    g = window_groups(get_model(_model(tmp_path, 7, 4, 64)), 16)
    assert (g.group_size, g.full_groups, g.sliding_groups) == (4, 1, 1)
    # 6 sliding, 2 full: groups of 2
    g = window_groups(get_model(_model(tmp_path, 8, 6, 64)), 16)
    assert (g.group_size, g.full_groups, g.sliding_groups) == (2, 1, 3)
    # every layer sliding (Mistral): one group
    g = window_groups(get_model(_model(tmp_path, 4, 4, 64)), 16)
    assert (g.full_groups, g.sliding_groups) == (0, 1)
    with pytest.raises(ConfigError, match="no sliding-window layers"):
        window_groups(MODEL_PRESETS["llama-3.1-8b"], 16)


@pytest.mark.parametrize(
    ("cached", "window", "hit"),
    [
        ("1111", 2, 4),  # the whole full hit
        ("1101", 2, 2),  # the rightmost run of 2 ends at block 2
        ("0110", 2, 3),
        ("1010", 2, 1),  # no run of 2: the run from the first block
        ("0101", 2, 0),
        ("0001", 1, 4),
        ("", 3, 0),
        ("110", 0, 3),  # a window of one token needs no block
    ],
)
def test_window_hit_by_hand(cached: str, window: int, hit: int) -> None:
    mask = np.array([c == "1" for c in cached], dtype=bool)
    assert _window_hit(mask, window) == hit


def _pool(tmp_path: Path, capacity_blocks: int) -> WindowedBlockCache:
    """One full and one sliding layer (groups of one), 4-token blocks, window 5 tokens
    (a hit needs ceil(4 / 4) = 1 sliding block); pages = 2 x capacity_blocks."""
    from prefixlab.model.spec import get_model

    model = get_model(_model(tmp_path, 2, 1, 5))
    return WindowedBlockCache(capacity_blocks, make_policy("vllm", "block"), 16, model, 4)


def _run(cache: WindowedBlockCache, keys: list[int], blocks: int, tokens: int) -> int:
    """One request: match, acquire, cache its prompt, slide past ``tokens``, finish."""
    k = np.array(keys, dtype=np.int64)
    m = cache.match(k)
    handle = cache.acquire(m, blocks, k[m.num_hit_blocks :])
    assert handle is not None
    cache.commit(handle, k, m.num_hit_blocks)
    cache.slide(handle, tokens, k)
    cache.check([handle])
    cache.commit(handle, k, len(keys))
    cache.release(handle)
    cache.check([])
    return m.num_hit_blocks


def _cached(cache: WindowedBlockCache, keys: list[int], group: int) -> str:
    k = np.array(keys, dtype=np.int64) + group * cache.num_keys
    return "".join("1" if b >= 0 else "0" for b in cache.pool.key_block[k])


def test_pages_freed_past_the_window_and_the_hit_rule(tmp_path: Path) -> None:
    cache = _pool(tmp_path, 5)  # 10 pages
    assert (cache.pages, cache.capacity_blocks) == (10, 5)
    # r1: 16 tokens (keys 0-3) and room for one more: 5 blocks in each group. Sliding
    # past 16 computed tokens frees the sliding pages of blocks before (16 - 5 + 1) // 4
    # = 3, cached first.
    assert _run(cache, [0, 1, 2, 3], 5, 16) == 0
    assert _cached(cache, [0, 1, 2, 3], 0) == "1111"  # full group
    assert _cached(cache, [0, 1, 2, 3], 1) == "1111"  # sliding group
    # the free queue is now s2 s1 s0 (freed at the slide), s3 (at the end), f3 f2 f1 f0
    # (keyless pages of block 4 went to the front). r2: 2 new blocks + 1 = 3 blocks, 6
    # pages: the 2 keyless ones, then s2, s1, s0, s3 are evicted
    assert _run(cache, [8, 9], 3, 8) == 0
    assert _cached(cache, [0, 1, 2, 3], 0) == "1111"
    assert _cached(cache, [0, 1, 2, 3], 1) == "0000"
    # the full groups hold the whole prefix, the sliding one not the block before it
    assert cache.match(np.array([0, 1, 2, 3], dtype=np.int64)).num_hit_blocks == 0


def test_a_hit_pins_only_its_window(tmp_path: Path) -> None:
    cache = _pool(tmp_path, 8)  # 16 pages
    _run(cache, [0, 1, 2, 3], 5, 16)
    m = cache.match(np.array([0, 1, 2, 3, 7], dtype=np.int64))
    assert isinstance(m, WindowedMatch)
    assert (m.num_hit_blocks, m.start) == (4, 3)  # sliding pages of block 3 only
    handle = cache.acquire(m, 6, np.array([7], dtype=np.int64))
    assert handle is not None
    assert [p.shape[0] for p in handle.full] == [6]
    assert [p.shape[0] for p in handle.sliding] == [3]  # blocks 3, 4, 5
    assert int(np.count_nonzero(cache.view.ref)) == 9
    cache.check([handle])
    cache.release(handle)
    cache.check([])


def test_sliding_pages_stop_at_the_cap(tmp_path: Path) -> None:
    """With 8 tokens a step, a sliding group holds at most ceil((5 - 1 + 8) / 4) + 1 = 4
    pages (vLLM's admission cap); they move forward as the request slides."""
    from prefixlab.model.spec import get_model

    model = get_model(_model(tmp_path, 2, 1, 5))
    cache = WindowedBlockCache(12, make_policy("vllm", "block"), 16, model, 4, (), 8)
    assert (cache.pages, cache.cap) == (24, 4)
    assert cache.capacity_blocks == 20  # 20 full pages + 4 sliding ones
    keys = np.arange(10, dtype=np.int64)
    handle = cache.acquire(cache.match(keys), 10, keys)
    assert handle is not None
    assert (handle.lo, handle.hi, int(np.count_nonzero(cache.view.ref))) == (0, 4, 14)
    cache.commit(handle, keys[:2], 0)
    cache.slide(handle, 8, keys)  # blocks before (8 - 5 + 1) // 4 = 1 go; 4 is taken
    assert (handle.lo, handle.hi, int(np.count_nonzero(cache.view.ref))) == (1, 5, 14)
    assert _cached(cache, [0, 1], 1) == "11"  # cached before they were released
    assert int(cache.view.depth[handle.sliding[0][1]]) == 1  # depth counts from block 0
    cache.check([handle])
    assert cache.grow(handle, 1) is handle  # the eleventh block: a full page only
    assert (handle.hi, int(np.count_nonzero(cache.view.ref))) == (5, 15)
    cache.release(handle)
    cache.check([])


def test_acquire_is_all_or_nothing(tmp_path: Path) -> None:
    cache = _pool(tmp_path, 4)  # 8 pages
    held = cache.acquire(cache.match(np.array([0, 1], dtype=np.int64)), 3, None)  # 6 pages
    assert held is not None
    before = cache.view.ref.copy()
    assert cache.acquire(cache.match(np.array([5, 6], dtype=np.int64)), 2, None) is None
    assert np.array_equal(cache.view.ref, before)
    assert cache.grow(held, 2) is None  # 4 more pages, 2 free
    assert cache.grow(held, 1) is held
    cache.check([held])


@pytest.mark.parametrize(("capacity", "budget"), [(1200, 8192), (1200, 512), (5000, 8192)])
def test_engine_invariants_under_the_window_rule(
    tmp_path: Path, capacity: int, budget: int
) -> None:
    model = _model(tmp_path, 6, 4, 64)
    trace = GENERATORS["sessions"].fn(num_sessions=30, seed=2)
    cfg = EngineConfig(
        capacity_blocks=capacity,
        block_tokens=16,
        model=model,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
    )
    # the pool's invariants and every page held exactly by its requests, step by step
    res = simulate(trace, "lru", cfg, TIMING, check_every=1 if capacity < 2000 else 10)
    full = simulate(
        trace, "lru", EngineConfig(**{**_fields(cfg), "sliding_window_rule": "full"}), TIMING
    )
    assert res.metrics["token_hit_ratio"] > 0
    if capacity == 5000:  # nothing evicted: the rules hit alike
        assert np.array_equal(res.hit_tokens, full.hit_tokens)


def _fields(cfg: EngineConfig) -> dict[str, object]:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def test_limits_are_refused(tmp_path: Path) -> None:
    model = _model(tmp_path, 2, 1, 64)
    trace = GENERATORS["sessions"].fn(num_sessions=3, seed=1)
    base = EngineConfig(capacity_blocks=2000, block_tokens=16, model=model)
    with pytest.raises(ConfigError, match=r"policy 'opt'.*sliding_window_rule = 'full'"):
        simulate(trace, "opt", base, TIMING)
    tiers = (TierConfig("cpu", 100),)
    with pytest.raises(ConfigError, match="tiers below GPU memory are not modelled"):
        simulate(trace, "lru", EngineConfig(**{**_fields(base), "tiers": tiers}), TIMING)
    with pytest.raises(ConfigError, match="sliding_window_rule is 'window' or 'full'"):
        simulate(
            trace, "lru", EngineConfig(**{**_fields(base), "sliding_window_rule": "x"}), TIMING
        )
    # the full rule takes them all
    opt = simulate(
        trace, "opt", EngineConfig(**{**_fields(base), "sliding_window_rule": "full"}), TIMING
    )
    assert opt.metrics["token_hit_ratio"] > 0


def test_cli_rule_option() -> None:
    args = [
        "simulate",
        "gen:sessions:num_sessions=20,seed=1",
        "--block-tokens",
        "16",
        "-p",
        "lru",
        "--model",
        "gpt-oss-20b",
        "--capacity-bytes",
        "300MB",
        "--timing",
        "power:preset=llama-3.2-1b-a100+tpot:s=0.01",
        "--json",
    ]
    window = CliRunner().invoke(app, args)
    full = CliRunner().invoke(app, [*args, "--sliding-window-rule", "full"])
    assert window.exit_code == 0 and full.exit_code == 0, window.output + full.output
    w, f = json.loads(window.stdout)[0], json.loads(full.stdout)[0]
    # the window rule frees the sliding layers' pages early: more prompts stay cached
    assert w["token_hit_ratio"] > f["token_hit_ratio"]
