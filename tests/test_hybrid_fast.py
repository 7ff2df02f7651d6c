"""The compiled hybrid replay (``runner/_fast_hybrid.py``) against the object tree.

Every built-in hybrid policy, with every option that changes what the tree does, on two
tiny models (a hybrid with a state per checkpoint and a Transformer without one) and under
both lock modes: per-request hit tokens, every counter and Marconi's tuning history must be
equal to the object tree's (``replay_hybrid(..., fast=False)``), which
``tests/test_hybrid.py`` checks by hand and against naive references. CI also runs this
file with ``NUMBA_DISABLE_JIT=1`` (the same kernel interpreted).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixlab.errors import ConfigError
from prefixlab.model.spec import ModelSpec
from prefixlab.policies import make_policy
from prefixlab.policies.hybrid import HybridPolicy, Marconi, SglangPlus
from prefixlab.runner._fast_hybrid import hybrid_code
from prefixlab.runner.hybrid import HybridConfig, HybridResult, replay_hybrid
from tests.test_hybrid import HYB, TF, trace_of

POLICIES = [
    "vanilla",
    "sglang+",
    "sglang+:branch=input",
    "sglang+:chunk_tokens=2",
    "vllm+:block_tokens=2",
    "vllm+:block_tokens=3,partial_blocks=false",
    "vllm+:block_tokens=2,sizing=estimate",
    "marconi:alpha=0",
    "marconi:alpha=1",
    "marconi:alpha=2,recency=last-access",
    "marconi:alpha=0.5,efficiency=node",
    "marconi:alpha=1,branch=input,chunk_tokens=2",
    "marconi:bootstrap_multiplier=1.5,alpha_step=0.5,score_window=0",
    "marconi:bootstrap_multiplier=1,alpha_step=1,retune_every=3,objective=hit_ratio",
]


def random_requests(seed: int, n: int = 30) -> list[tuple[list[int], list[int]]]:
    """Short sequences over a small alphabet (shared prefixes, branches), some long ones,
    and conversations that extend an earlier request's input and output."""
    rng = random.Random(seed)
    out: list[tuple[list[int], list[int]]] = []
    for _ in range(n):
        u = rng.random()
        if u < 0.15:
            out.append(([rng.randrange(3, 10**6) for _ in range(rng.randint(4, 40))], []))
        elif u < 0.45 and out:
            inp, outp = out[rng.randrange(len(out))]
            more = [rng.randrange(3) for _ in range(rng.randint(1, 6))]
            out.append((inp + outp + more, [rng.randrange(3) for _ in range(rng.randint(0, 4))]))
        else:
            out.append(
                (
                    [rng.randrange(3) for _ in range(rng.randint(2, 12))],
                    [rng.randrange(3) for _ in range(rng.randint(0, 3))],
                )
            )
    return out


def assert_same(a: HybridResult, b: HybridResult) -> None:
    assert a.hit_tokens.tolist() == b.hit_tokens.tolist()
    ma = {k: v for k, v in a.metrics.items()}
    mb = {k: v for k, v in b.metrics.items()}
    assert ma == mb
    assert a.alpha_history == b.alpha_history


def both(
    reqs: list[tuple[list[int], list[int]]],
    spec: str,
    capacity: int,
    model: ModelSpec,
    locks: str = "path",
) -> tuple[HybridResult, HybridResult]:
    trace = trace_of(reqs)
    config = HybridConfig(capacity, model, locks)
    slow = replay_hybrid(trace, spec, config, fast=False)
    fast = replay_hybrid(trace, spec, config)
    return slow, fast


@pytest.mark.parametrize("spec", POLICIES)
@pytest.mark.parametrize("model", [HYB, TF], ids=["hybrid", "transformer"])
@pytest.mark.parametrize("locks", ["path", "none"])
def test_every_policy_equals_the_object_tree(spec: str, model: ModelSpec, locks: str) -> None:
    evicted = 0
    for seed in range(6):
        reqs = random_requests(seed)
        for capacity in (24, 60, 150, 400):
            slow, fast = both(reqs, spec, capacity, model, locks)
            assert_same(slow, fast)
            evicted += int(fast.metrics["num_evicted_nodes"])
    if not spec.startswith("vanilla"):
        assert evicted > 0  # the pool was under pressure


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.integers(8, 300),
    spec=st.sampled_from(POLICIES),
    transformer=st.booleans(),
    locks=st.sampled_from(["path", "none"]),
)
def test_random_workloads_equal_the_object_tree(
    seed: int, capacity: int, spec: str, transformer: bool, locks: str
) -> None:
    slow, fast = both(random_requests(seed, 24), spec, capacity, TF if transformer else HYB, locks)
    assert_same(slow, fast)


def test_hand_computed_lru_victims_compiled() -> None:
    """SGLang+ on HYB (KV 4 bytes per token, a state 8 bytes), 56 bytes.

    1. [0,1,2,3] + [4]: one leaf [0,5) with its state: 20 + 8 = 28 bytes.
    2. [0,1,5,6] leaves that edge after 2 tokens: no reuse (no state at 2). It stores [5,6]
       (8 bytes) and two states, the branch at 2 and its end at 4 (16): 52 bytes (the peak).
       The edge splits into [0,2) and [2,5); SGLang+ stamped [0,5) (matched in part) and
       every node the insertion walked: both leaves, [2,5) and [2,4), now share a stamp.
    3. [7,7] needs 8 + 8 bytes: 68 > 56. The tie goes to the deeper leaf, [2,5) (it ends at
       5): 3 tokens and a state, 20 bytes, freed; [0,2) keeps its state and one child.
    """
    reqs = [([0, 1, 2, 3], [4]), ([0, 1, 5, 6], []), ([7, 7], [])]
    slow, fast = both(reqs, "sglang+", 56, HYB)
    assert_same(slow, fast)
    m = fast.metrics
    assert fast.hit_tokens.tolist() == [0, 0, 0]
    assert m["bytes_written"] == (5 * 4 + 8) + (2 * 4 + 8 + 8) + (2 * 4 + 8)
    assert m["peak_bytes"] == 52 and m["num_checkpoints"] == 3
    assert m["num_evicted_nodes"] == 1
    assert m["bytes_evicted"] == 3 * 4 + 8
    assert m["bytes_used"] == m["bytes_written"] - m["bytes_evicted"] <= 56


def test_hits_by_hand_on_a_conversation() -> None:
    """Marconi on HYB, no pressure: turn 2 extends turn 1's input and output, so it reuses
    all 6 tokens (the state after the last decoded token); turn 3 leaves turn 2 after 4
    tokens, inside an edge with no state: no reuse, and a branch state is written at 4."""
    reqs = [([1, 2, 3, 4], [5, 6]), ([1, 2, 3, 4, 5, 6, 7], [8]), ([1, 2, 3, 4, 9], [])]
    slow, fast = both(reqs, "marconi:alpha=1", 10**6, HYB)
    assert_same(slow, fast)
    assert fast.hit_tokens.tolist() == [0, 6, 0]
    assert fast.metrics["num_checkpoints"] == 4  # ends 6, 8, 5, and the branch at 4


def test_tuning_compiled_matches_and_happens() -> None:
    reqs = random_requests(7, 40)
    slow, fast = both(reqs, "marconi:bootstrap_multiplier=1.5,alpha_step=0.5", 60, HYB)
    assert_same(slow, fast)
    assert fast.alpha_history and fast.alpha_history == slow.alpha_history


def test_only_built_in_policies_compile() -> None:
    class Mine(SglangPlus):
        pass

    assert hybrid_code(Mine()) < 0
    for spec in ("vllm+", "sglang+", "marconi", "vanilla"):
        pol = make_policy(spec, "hybrid")
        assert isinstance(pol, HybridPolicy) and hybrid_code(pol) >= 0


def test_subclass_runs_on_the_object_tree_with_its_own_rule() -> None:
    """A subclass's hook is honoured: it runs on the object tree (the generic path)."""

    class EvictNothing(Marconi):
        def free(self, need: int) -> int:
            return 0

    reqs = random_requests(3)
    trace = trace_of(reqs)
    res = replay_hybrid(trace, EvictNothing(alpha=1.0), HybridConfig(40, HYB))
    assert res.metrics["num_evicted_nodes"] == 0 and res.metrics["num_rejected"] > 0


def test_progress_reports_every_request_in_order() -> None:
    reqs = random_requests(5, 600)
    seen: list[int] = []
    res = replay_hybrid(trace_of(reqs), "sglang+", HybridConfig(100, HYB), on_step=seen.append)
    assert seen == list(range(600))
    ref = replay_hybrid(trace_of(reqs), "sglang+", HybridConfig(100, HYB), fast=False)
    assert_same(ref, res)


def test_large_tokens_and_growth() -> None:
    """Token ids beyond 31 bits, and enough nodes that the slot arrays and the children
    table grow several times mid-replay."""
    rng = np.random.default_rng(0)
    reqs = []
    for _ in range(200):
        base = [int(x) for x in rng.integers(2**40, 2**40 + 4, size=3)]
        reqs.append((base + [int(x) for x in rng.integers(0, 2**62, size=20)], []))
    slow, fast = both(reqs, "vllm+:block_tokens=2", 10**6, HYB)
    assert_same(slow, fast)
    assert fast.metrics["num_nodes"] > 1000


@pytest.mark.parametrize(
    "spec",
    [
        "marconi:alpha=nan",
        "marconi:alpha=inf",
        "marconi:bootstrap_multiplier=inf",
        "marconi:alpha_step=nan",
        "vllm+:block_tokens=10000000000000000000",
        "sglang+:chunk_tokens=10000000000000000000",
        "marconi:retune_every=10000000000000000000",
    ],
)
def test_values_the_tree_cannot_hold_are_refused(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"finite|2\*\*62"):
        make_policy(spec, "hybrid")


def test_capacity_beyond_int64_is_refused() -> None:
    with pytest.raises(ConfigError, match="capacity_bytes must be an integer from 1 to 2"):
        replay_hybrid(trace_of(random_requests(0)), "sglang+", HybridConfig(10**19, HYB))


@pytest.mark.parametrize("fast", [True, False])
def test_a_policy_instance_replays_twice_alike(fast: bool) -> None:
    """Reusing one instance starts afresh: a new candidate index, alpha as constructed."""
    trace = trace_of(random_requests(1, 30))
    for pol in (Marconi(alpha=1.0), Marconi(bootstrap_multiplier=1.5, alpha_step=0.5)):
        first = replay_hybrid(trace, pol, HybridConfig(60, HYB), fast=fast)
        again = replay_hybrid(trace, pol, HybridConfig(60, HYB), fast=fast)
        assert_same(first, again)
        assert first.metrics["num_evicted_nodes"] > 0
