"""Admission policies (prefixlab.policies.admission) and the hybrid cache's Admitted /
Rejected events; every registered policy honours the protocol of its structures.

The tiny hybrid model: KV 4 bytes per token, one checkpoint 8 bytes (see test_hybrid.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from prefixlab.cache.events import Admitted, Event, Rejected
from prefixlab.cache.hybrid import HybridCache
from prefixlab.errors import ConfigError
from prefixlab.policies import make_policy, registered
from prefixlab.policies.admission import AllBlocks, Judicious, NoAdmission
from prefixlab.policies.base import EvictionPolicy, make_eviction_policy
from prefixlab.policies.hybrid import HybridPolicy, SglangPlus
from prefixlab.runner._fast_hybrid import hybrid_code
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.trace import Request, Trace
from tests.helpers import HYB, KV, ST


def test_all_blocks_checkpoints_every_block_boundary() -> None:
    a = AllBlocks(4)
    assert a.checkpoints(10, None) == [4, 8] and a.stored_tokens(10) == 8
    assert a.checkpoints(3, None) == [] and a.stored_tokens(3) == 0
    p = AllBlocks(4, partial_blocks=True)
    assert p.checkpoints(10, 7) == [4, 8, 10] and p.stored_tokens(10) == 10
    assert p.fills_partial_blocks and not a.fills_partial_blocks
    # a model without state reuses KV in whole blocks; with state, what the states allow
    assert a.reusable(10, has_state=False) == 8 and a.reusable(10, has_state=True) == 10
    assert a.branch_match() == ""  # it needs no match of the sequence


def test_judicious_checkpoints_the_branch_point_and_the_end() -> None:
    j = Judicious()
    assert j.checkpoints(12, 7) == [7, 12] and j.checkpoints(12, None) == [12]
    assert j.checkpoints(12, 12) == [12]  # the same position once
    # chunked prefill keeps a state only at a chunk's end: 7 -> 4; 3 -> 0 (none)
    c = Judicious(chunk_tokens=4)
    assert c.checkpoints(12, 7) == [4, 12] and c.checkpoints(12, 3) == [12]
    assert j.stored_tokens(12) == 12 and j.reusable(9, False) == 9
    assert (j.branch_match(), Judicious(branch="input").branch_match()) == ("sequence", "input")
    with pytest.raises(ValueError, match="branch must be one of sequence, input"):
        Judicious(branch="prefix")


def test_no_admission_stores_nothing() -> None:
    n = NoAdmission()
    assert not n.admit(10) and n.stored_tokens(10) == 0 and n.checkpoints(10, 3) == []


def test_policies_hold_their_admission_object() -> None:
    assert make_policy("vllm+:block_tokens=8,partial_blocks=false", "hybrid").admission == (
        AllBlocks(8, False)
    )
    assert make_policy("sglang+:chunk_tokens=16", "hybrid").admission == Judicious(16)
    assert make_policy("marconi:branch=input,alpha=1", "hybrid").admission == Judicious(0, "input")
    assert make_policy("vanilla", "hybrid").admission == NoAdmission()


class Events:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.seen.append(event)


def _cache(spec: str, capacity: int) -> tuple[HybridCache, Events]:
    pol = make_policy(spec, "hybrid")
    assert isinstance(pol, HybridPolicy)
    ev = Events()
    return HybridCache(capacity, HYB, pol, observers=[ev]), ev


def _store(cache: HybridCache, tokens: list[int], input_len: int) -> bool:
    seq = np.array(tokens, dtype=np.int64)
    m = cache.lookup(seq[:input_len])
    return cache.admit(seq, input_len, m)


def _keys(event: Event) -> list[int]:
    assert isinstance(event, Admitted | Rejected)
    return event.keys.tolist()


def test_judicious_cache_emits_the_checkpoints_it_admits() -> None:
    cache, ev = _cache("sglang+", 10_000)
    assert _store(cache, [1, 2, 3, 4, 5, 6], 4)
    # a fresh tree: no branch point, one state after the last token
    assert [type(e) for e in ev.seen] == [Admitted] and _keys(ev.seen[0]) == [6]
    assert ev.seen[0].tokens == 6  # type: ignore[union-attr]
    # [1, 2, 3, 9, 9] leaves the edge [1..6] after 3 tokens: a branch state at 3, and the end
    assert _store(cache, [1, 2, 3, 9, 9], 4)
    assert _keys(ev.seen[1]) == [3, 5]
    assert sorted((nd.start, nd.end, nd.ckpt) for nd in cache.iter_nodes()) == [
        (0, 3, True),
        (3, 5, True),
        (3, 6, True),
    ]


def test_all_blocks_cache_emits_block_boundaries_and_rejects_what_cannot_fit() -> None:
    cache, ev = _cache("vllm+:block_tokens=2,partial_blocks=false", 10 * KV + 5 * ST)
    assert _store(cache, [1, 2, 3, 4, 5], 5)  # 4 tokens stored, states at 2 and 4
    assert _keys(ev.seen[0]) == [2, 4] and cache.used == 4 * KV + 2 * ST
    # 12 tokens need 12 x 4 + 6 x 8 = 96 bytes > 10 x 4 + 5 x 8 = 80: refused, nothing kept
    assert not _store(cache, list(range(20, 32)), 12)
    last = ev.seen[-1]
    assert isinstance(last, Rejected) and last.keys.tolist() == [2, 4, 6, 8, 10, 12]
    assert last.tokens == 12 and cache.num_rejected == 1 and cache.used == 4 * KV + 2 * ST


def test_vanilla_rejects_every_sequence_with_no_checkpoints() -> None:
    cache, ev = _cache("vanilla", 10_000)
    assert not _store(cache, [1, 2, 3], 2)
    assert len(ev.seen) == 1 and isinstance(ev.seen[0], Rejected)
    assert ev.seen[0].keys.tolist() == [] and ev.seen[0].tokens == 3 and cache.used == 0


@dataclass(frozen=True, slots=True)
class EndOnly(Judicious):
    """A third-party admission: the state after the last token only (no branch point)."""

    def checkpoints(self, seq_tokens: int, branch_at: int | None) -> list[int]:
        return [seq_tokens]


def _trace(seqs: list[tuple[list[int], list[int]]]) -> Trace:
    return Trace.from_requests(
        [
            Request(float(i), len(a), len(b), input_tokens=a, output_tokens=b)
            for i, (a, b) in enumerate(seqs)
        ]
    )


def test_a_custom_admission_runs_on_the_object_tree_with_its_own_checkpoints() -> None:
    pol = SglangPlus()
    pol.admission = EndOnly()
    assert hybrid_code(pol) == -1  # the compiled replay carries the built-in three only
    cache = HybridCache(10_000, HYB, pol)
    _store(cache, [1, 2, 3, 4, 5, 6], 4)
    _store(cache, [1, 2, 3, 9, 9], 4)
    # no branch state at 3: the split node (0, 3) has none, so [1, 2, 3, 7] reuses nothing
    assert sorted((nd.start, nd.end, nd.ckpt) for nd in cache.iter_nodes()) == [
        (0, 3, False),
        (3, 5, True),
        (3, 6, True),
    ]
    assert cache.reuse(np.array([1, 2, 3, 7], dtype=np.int64)).reusable == 0
    # the same requests through the replay runner: the third request hits 0 tokens with
    # EndOnly, 3 with the built-in judicious admission
    seqs = [([1, 2, 3, 4], [5, 6]), ([1, 2, 3, 9], [9]), ([1, 2, 3, 7], [8])]
    config = HybridConfig(capacity_bytes=10_000, model=HYB)
    custom = SglangPlus()
    custom.admission = EndOnly()
    hits = replay_hybrid(_trace(seqs), custom, config).hit_tokens.tolist()
    assert hits[2] == 0
    assert replay_hybrid(_trace(seqs), "sglang+", config).hit_tokens.tolist()[2] == 3


def test_every_registered_policy_implements_the_protocol_of_its_structures() -> None:
    """No registered policy inherits a hook that raises: the block and radix caches'
    policies implement ``evict``, the hybrid cache's ``free``; neither is the other's."""
    for name, cls in registered().items():
        if cls.structures & {"block", "radix"}:
            assert issubclass(cls, EvictionPolicy), name
            assert cls.evict is not EvictionPolicy.evict, name
        if "hybrid" in cls.structures:
            assert issubclass(cls, HybridPolicy) and not issubclass(cls, EvictionPolicy), name
            assert cls.free is not HybridPolicy.free, name
    with pytest.raises(ConfigError, match="policy 'marconi' applies to the hybrid structure only"):
        make_eviction_policy("marconi")
