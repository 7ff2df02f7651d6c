"""The compiled replay kernel gives exactly the generic path's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefixlab.errors import CapacityError
from prefixlab.policies import make_policy
from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.hooks.unicache import AUX_Q
from prefixlab.policies.unicache import AGENTIC, CHAT, EVICT, STRUCT, UniCache
from prefixlab.runner import _fast, replay
from prefixlab.runner._fast_radix import radix_code
from prefixlab.runner.replay import ReplayConfig
from prefixlab.workload import Request, Trace
from prefixlab.workload.generators import GENERATORS, generate_sessions
from prefixlab.workload.trace import to_hash_form

pytestmark = pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba (the 'fast' extra) absent")


def _dup_heavy() -> Trace:
    # Exact multiples of the block size (recompute cap -> duplicate keys) and prefixes whose
    # root gets evicted while extensions stay cached (recomputed -> duplicates again).
    rng = np.random.default_rng(11)
    base = [rng.integers(0, 1000, 64).tolist() for _ in range(6)]
    reqs = []
    for i in range(300):
        b = base[int(rng.integers(0, 6))]
        n = int(rng.choice([16, 32, 48, 64, 40]))
        reqs.append(
            Request(float(i), n, int(rng.integers(0, 20)), input_tokens=b[:n], output_tokens=None)
        )
    return Trace.from_requests(reqs)


FAST_POLICIES = [
    "vllm",
    "lru",
    "fifo",
    "sieve",
    "sglang-lru",
    "hashtable",
    "lfu",
    "mru",
    "opt",
    "arc",
    "s3fifo",
    "lecar",
    "s3fifo:small_ratio=0.3,move_to_main_threshold=2",
    "lecar:seed=3",
    "lpc-oracle",
    "lpc-oracle:update_interval_s=0,scale=0.05",
    "wa",
    "wa-atc25",
    "wa-atc25:window_s=5,max_turn=2,min_samples=5",
    "unicache",
    "unicache:stage2=false,offset=request,alg2=clip-ehat,hits=cumulative,update_every=3",
    "unicache:offset=cached,min_gaps=2",
]

TRACES = {
    "chat": (generate_sessions(num_sessions=40, seed=1), 16),
    "agentic": (generate_sessions(num_sessions=40, seed=2, preset="agentic"), 32),
    "dups": (_dup_heavy(), 16),
}


@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("policy", FAST_POLICIES)
@pytest.mark.parametrize(("scale", "max_free"), [(1.05, None), (2.5, None), (2.5, 4)])
def test_fast_equals_generic(name: str, policy: str, scale: float, max_free: int | None) -> None:
    trace, bt = TRACES[name]
    # Capacities relative to the largest request: tight (just fits) and roomier.
    capacity = int(scale * int(trace.block_layout(bt).num_blocks_held.max())) + 2
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=bt, max_free_blocks=max_free)
    fast = replay(trace, policy, cfg)
    slow = replay(trace, policy, cfg, fast=False)
    assert np.array_equal(fast.hit_tokens, slow.hit_tokens)
    assert fast.metrics == slow.metrics
    assert fast.metrics["num_evictions"] > 0  # the scenario exercises eviction


def test_fast_path_on_hash_form_and_partial_blocks() -> None:
    trace = to_hash_form(generate_sessions(num_sessions=30, seed=5), 16)
    for cfg in (
        ReplayConfig(capacity_blocks=700),
        ReplayConfig(capacity_blocks=700, cache_partial=True, min_recompute_tokens=0),
    ):
        a, b = replay(trace, "vllm", cfg), replay(trace, "vllm", cfg, fast=False)
        assert np.array_equal(a.hit_tokens, b.hit_tokens) and a.metrics == b.metrics


def test_fast_path_capacity_error_names_request() -> None:
    trace, bt = TRACES["chat"]
    with pytest.raises(CapacityError, match=r"request 0 needs \d+ blocks"):
        replay(trace, "vllm", ReplayConfig(capacity_blocks=5, block_tokens=bt))


RADIX_POLICIES = [p for p in FAST_POLICIES if p != "vllm" and not p.startswith(("wa", "unicache"))]


@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("policy", RADIX_POLICIES)
@pytest.mark.parametrize("scale", [1.05, 2.5])
def test_radix_kernel_equals_generic(name: str, policy: str, scale: float) -> None:
    trace, bt = TRACES[name]
    capacity = int(scale * int(trace.block_layout(bt).num_blocks_held.max())) + 2
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=bt, structure="radix")
    fast = replay(trace, policy, cfg)
    slow = replay(trace, policy, cfg, fast=False)
    assert np.array_equal(fast.hit_tokens, slow.hit_tokens)
    assert fast.metrics == slow.metrics
    assert fast.metrics["num_evictions"] > 0


@pytest.mark.parametrize(
    "spec",
    [
        "unicache",
        "unicache:stage2=false,offset=request,update_every=4",
        "unicache:offset=cached,fit=given,alg2=clip-ehat,hits=cumulative",
    ],
)
def test_unicache_kernel_on_the_task_mix(spec: str) -> None:
    """Every queue in play (chat, agentic, templated and untemplated single-turn tasks):
    the kernel gives the generic path's hits, evictions and weight updates."""
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    cfg = ReplayConfig(capacity_blocks=230, block_tokens=64)
    a, b = make_policy(spec), make_policy(spec)
    assert isinstance(a, UniCache) and isinstance(b, UniCache)
    assert _fast.kernel_code(a) >= 0 and _fast.kernel_code(make_policy("unicache-opt")) < 0
    fast = replay(trace, a, cfg)
    slow = replay(trace, b, cfg, fast=False)
    assert np.array_equal(fast.hit_tokens, slow.hit_tokens)
    assert fast.metrics == slow.metrics and fast.metrics["num_evictions"] > 1000
    assert len(a.weight_history) == 300 // a.update_every  # every request has a hook
    assert a.weight_history == b.weight_history
    assert a.alpha.tolist() == b.alpha.tolist() and len(set(a.alpha.tolist())) > 2
    assert a.held.tolist() == b.held.tolist()
    assert set(a.aux[AUX_Q].tolist()) == {EVICT, CHAT, AGENTIC, STRUCT}  # requests' queues


class _OldestCreated(KeyedPolicy):
    """A third-party keyed policy: its sort key is all the kernels need."""

    name = "oldest-created-test"
    sort_key = (("created", 1), ("depth", -1))


class _Overridden(_OldestCreated):
    def evict(self, n: int) -> np.ndarray:  # a hook of its own: the generic path only
        return super().evict(n)


@pytest.mark.parametrize("structure", ["block", "radix"])
def test_a_third_party_keyed_policy_runs_compiled(structure: str) -> None:
    trace, bt = TRACES["chat"]
    cfg = ReplayConfig(capacity_blocks=900, block_tokens=bt, structure=structure)
    code = _fast.kernel_code if structure == "block" else radix_code
    assert code(_OldestCreated()) >= 0 and code(_Overridden()) < 0
    fast = replay(trace, _OldestCreated(), cfg)
    assert fast.metrics == replay(trace, _OldestCreated(), cfg, fast=False).metrics
    assert fast.metrics == replay(trace, _Overridden(), cfg).metrics
    assert fast.metrics["num_evictions"] > 0


@pytest.mark.parametrize("name", sorted(TRACES))
def test_next_use_at_every_position_equals_the_per_key_search(name: str) -> None:
    from prefixlab.policies.opt import OPT, next_use_at

    trace, bt = TRACES[name]
    layout = trace.block_layout(bt)
    opt = OPT()
    opt.prepare(layout)
    got = next_use_at(layout)
    counts = np.diff(layout.key_offsets)
    reqs = np.repeat(np.arange(counts.shape[0]), counts)
    want = [opt.next_use(int(k), int(r)) for k, r in zip(layout.keys, reqs, strict=True)]
    assert got.tolist() == want
    assert np.isfinite(got).any() and np.isinf(got).any()


def test_the_compile_cache_is_keyed_by_every_source_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixlab import _jit

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    first = _jit.cache_dir()
    assert first.parent == tmp_path and first == _jit.cache_dir()
    for i in range(6):
        (tmp_path / f"old{i}").mkdir()
    _jit._prune(tmp_path, keep=4)
    assert len(list(tmp_path.iterdir())) == 4


@pytest.mark.parametrize("structure", ["block", "radix"])
def test_lpc_records_outgrow_the_state_inside_the_kernel(structure: str) -> None:
    """300 conversations share a 4-block system prompt: each shared block keeps one record
    per conversation, far more than the state's columns (4 x capacity + 64), so the pool
    widens mid-run, in the kernel and in the generic path alike."""
    from tests.test_lpc import shared_prompt_trace

    trace = shared_prompt_trace(900, 300)
    cfg = ReplayConfig(capacity_blocks=40, block_tokens=16, structure=structure)
    pol = _fast_policy("lpc-oracle", structure)
    fast = replay(trace, pol, cfg)
    slow = replay(trace, "lpc-oracle", cfg, fast=False)
    assert np.array_equal(fast.hit_tokens, slow.hit_tokens) and fast.metrics == slow.metrics
    assert pol.state[0].shape[1] > 4 * 42 + 64  # widened
    assert max(len(r) for r in pol.shared.values()) >= 200


def _fast_policy(spec: str, structure: str) -> Any:
    from prefixlab.policies.base import make_policy

    return make_policy(spec, structure)
