"""The ``vllm-lru`` CPU tier against vLLM's own CPUOffloadingManager and LRUCachePolicy.

A simulation with a small GPU over a ``vllm-lru`` CPU tier records every call the tier
gets (loads, stores, finishes) and what it did (the keys each store wrote and evicted);
``tests/reference/vllm_offload_run.py`` replays the same calls through vLLM's manager in
vLLM's Python. Every store must write and evict the same keys in the same order, and
every load must hit. Runs where ``PREFIXLAB_VLLM_PYTHON`` names a Python with vLLM
installed (``../shared/REFERENCES.md``); the hand-computed cases at the top run always.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixlab.cache.events import Event, Removed
from prefixlab.cache.tier import VllmLruTier
from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine import tiers as tiers_module
from prefixlab.runner.engine.tiers import TierConfig
from prefixlab.types import I64
from prefixlab.workload.generators import generate_sessions
from tests.reference.drivers import json_lines

ENV = "PREFIXLAB_VLLM_PYTHON"
PYTHON = os.environ.get(ENV)
TIMING = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.01")


def _a(*keys: int) -> I64:
    return np.array(keys, dtype=np.int64)


def _evictions(tier: VllmLruTier) -> list[list[int]]:
    out: list[list[int]] = []

    class Watch:
        def on_event(self, event: Event) -> None:
            if isinstance(event, Removed):
                out.append(event.keys.tolist())

    tier.observers.append(Watch())
    return out


def test_a_request_s_blocks_go_deepest_first_after_it_finishes() -> None:
    tier = VllmLruTier("cpu", 3)
    evicted = _evictions(tier)
    assert tier.store(_a(1, 2, 3), 0.0, 0, _a(0, 1, 2)) == 3
    tier.finish(0)
    assert tier.store(_a(4, 5), 1.0, 1, _a(0, 1)) == 2  # vLLM evicts [3, 2] (run above)
    assert evicted == [[3, 2]]
    tier.take(_a(1), 2.0, 2, _a(0))
    # request 1 is running: its keys rank (its rank, -position), older than request 2's
    assert tier.store(_a(6), 3.0, 2, _a(1)) == 1
    assert evicted == [[3, 2], [5]]
    tier.check()


def test_offered_keys_are_protected_and_a_store_that_cannot_fit_is_dropped() -> None:
    tier = VllmLruTier("cpu", 2)
    assert tier.store(_a(1, 2), 0.0, 0, _a(0, 1)) == 2
    # keys 1 and 2 are offered again with a new one: they cannot be evicted, so no room
    assert tier.store(_a(1, 2, 3), 1.0, 0, _a(0, 1, 2)) == 0
    assert sorted(tier.rank) == [1, 2]


def test_a_block_whose_write_is_in_flight_is_not_evicted() -> None:
    """vLLM holds a chunk being stored at ref_cnt -1: only a ready one can go."""
    tier = VllmLruTier("cpu", 2)
    evicted = _evictions(tier)
    assert tier.store(_a(1, 2), 0.0, 0, _a(0, 1)) == 2
    tier.finish(0)
    tier.pending[2] = 5.0  # block 2 (the least recent) still being written
    assert tier.store(_a(3), 1.0, 1, _a(0)) == 1
    assert evicted == [[1]]
    tier.pending[3] = 9.0
    assert tier.store(_a(4), 2.0, 2, _a(0)) == 0  # 2 and 3 in flight: dropped whole
    assert tier.store(_a(4), 6.0, 2, _a(0)) == 1  # 2 landed at 5 s
    assert evicted == [[1], [2]]


def test_a_key_offered_twice_in_one_store_is_written_once() -> None:
    tier = VllmLruTier("cpu", 4)
    assert tier.store(_a(5, 5, 6), 0.0, -1) == 2
    assert tier.blocks_written == 2 and sorted(tier.rank) == [5, 6]


def test_store_threshold_counts_offers() -> None:
    tier = VllmLruTier("cpu", 4, store_threshold=2, max_tracker_size=2)
    assert tier.store(_a(1, 2), 0.0, 0, _a(0, 1)) == 0  # first offers: counted only
    assert tier.store(_a(1, 3), 0.0, 1, _a(0, 1)) == 1  # 1 twice; 3 pushes 2 out of the table
    assert tier.store(_a(2), 0.0, 2, _a(1)) == 0  # 2 was forgotten: one offer again
    assert sorted(tier.rank) == [1]


class _Recording(VllmLruTier):
    """A ``vllm-lru`` tier that logs its calls and what each did."""

    log: list[list[Any]] = []
    done: list[dict[str, Any]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._evicted: list[int] = []
        outer = self

        class Watch:
            def on_event(self, event: Event) -> None:
                if isinstance(event, Removed):
                    outer._evicted.extend(event.keys.tolist())

        self.observers.append(Watch())

    def take(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> None:
        assert pos is not None
        _Recording.log.append(["load", request, keys.tolist(), pos.tolist()])
        _Recording.done.append({"op": "load", "missed": []})
        super().take(keys, now, request, pos)

    def store(self, keys: I64, now: float, request: int, pos: I64 | None = None) -> int:
        assert pos is not None
        before = set(self.rank)
        self._evicted = []
        n = super().store(keys, now, request, pos)
        _Recording.log.append(["store", request, keys.tolist(), pos.tolist()])
        stored = [k for k in keys.tolist() if k not in before and k in self.rank]
        if n == 0 and self._would_store(keys, before):
            _Recording.done.append({"op": "store", "failed": True})
        else:
            _Recording.done.append({"op": "store", "stored": stored, "evicted": self._evicted})
        return n

    def _would_store(self, keys: I64, before: set[int]) -> bool:
        """Whether new keys passed the threshold but the store was dropped."""
        new = [k for k in keys.tolist() if k not in before]
        if self.store_threshold >= 2:
            new = [k for k in new if self._counts.get(k, 0) >= self.store_threshold]
        return bool(new)

    def finish(self, request: int) -> None:
        _Recording.log.append(["finish", request])
        _Recording.done.append({"op": "finish"})
        super().finish(request)


@pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with vLLM installed")
@pytest.mark.parametrize(("capacity", "threshold"), [(400, 1), (1200, 1), (2400, 1), (1200, 2)])
def test_vllm_lru_equals_vllm_s_offloading_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capacity: int, threshold: int
) -> None:
    monkeypatch.setattr(tiers_module, "VllmLruTier", _Recording)
    _Recording.log, _Recording.done = [], []
    trace = generate_sessions(num_sessions=60, seed=5, session_rate_per_s=2.0)
    policy = "vllm-lru" if threshold == 1 else f"vllm-lru:store_threshold={threshold}"
    cpu = TierConfig("cpu", capacity, policy=policy)
    cfg = EngineConfig(capacity_blocks=600, block_tokens=16, model="llama-3.1-8b", tiers=(cpu,))
    res = simulate(trace, "lru", cfg, TIMING, check_every=50)
    assert res.metrics["cpu_token_hit_ratio"] > 0.01  # the tier serves hits
    evictions = sum(len(d.get("evicted", [])) for d in _Recording.done)
    assert evictions > 100  # and evicts: the comparison has something to compare
    path = tmp_path / "ops.json"
    spec = {"capacity": capacity, "block_tokens": 16, "store_threshold": threshold}
    path.write_text(json.dumps({**spec, "ops": _Recording.log}))
    assert PYTHON is not None
    theirs = json_lines(PYTHON, "vllm_offload_run.py", str(path))
    assert len(theirs) == len(_Recording.done)
    for i, (ours, ref) in enumerate(zip(_Recording.done, theirs, strict=True)):
        assert ours == ref, (i, _Recording.log[i])
