"""Expert-cache policies and the simulator: hand-computed victims, invariants, references.

Pages are ``layer * n + expert`` and request t belongs to layer ``t mod l``. Every
hand-computed scenario lists the cache after each request in a comment, oldest first
unless said otherwise; ``f`` marks a fault, ``-v`` the victim.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixlab.errors import ConfigError
from prefixlab.experts import _kernels
from prefixlab.experts._kernels import next_use_keys
from prefixlab.experts.checks import check_result
from prefixlab.experts.policies import (
    ExpertPolicy,
    PolicyContext,
    describe,
    layer_shares,
    make_policy,
    parameters,
    registered,
)
from prefixlab.experts.simulate import (
    ExpertResult,
    fault_ratio_to_opt,
    simulate,
    sweep_capacities,
)

I64 = npt.NDArray[np.int64]
ALL = sorted(registered())
SHARED = [p for p in ALL if not make_policy(p).partitioned]
DIST = [p for p in ALL if make_policy(p).partitioned]
needs_numba = pytest.mark.skipif(not _kernels.COMPILED, reason="numba absent or disabled")


def layered(num_layers: int, num_experts: int, experts: list[int]) -> I64:
    """Pages of a request sequence given each request's expert (layer = t mod l)."""
    t = np.arange(len(experts), dtype=np.int64)
    return (t % num_layers) * num_experts + np.asarray(experts, dtype=np.int64)


def run(
    pages: I64, layers: int, n: int, k: int, policy: str, backend: str = "python", **kw: object
) -> ExpertResult:
    res = simulate(
        pages,
        num_layers=layers,
        num_experts=n,
        capacity=k,
        policy=policy,
        record=True,
        backend=backend,
        **kw,
    )  # type: ignore[arg-type]
    check_result(pages, res, num_layers=layers, num_experts=n)
    return res


def faults_and_victims(res: ExpertResult) -> tuple[list[int], dict[int, int]]:
    assert res.fault_mask is not None and res.victims is not None
    faults = np.flatnonzero(res.fault_mask).tolist()
    victims = {t: v for t, v in enumerate(res.victims.tolist()) if v >= 0}
    return faults, victims


# ------------------------------------------------------------------- hand-computed victims
# l = 1 (plain paging), n = 5, k = 3:  t: 0 1 2 3 4 5 6 7  ->  pages 0 1 2 0 3 0 4 1
CLASSIC = np.array([0, 1, 2, 0, 3, 0, 4, 1], dtype=np.int64)


def test_lru_by_hand() -> None:
    # t0 0f [0]; t1 1f [0 1]; t2 2f [0 1 2]; t3 0 hit [1 2 0]; t4 3f -1 [2 0 3];
    # t5 0 hit [2 3 0]; t6 4f -2 [3 0 4]; t7 1f -3 [0 4 1]
    res = run(CLASSIC, 1, 5, 3, "lru")
    assert faults_and_victims(res) == ([0, 1, 2, 4, 6, 7], {4: 1, 6: 2, 7: 3})


def test_fifo_by_hand() -> None:
    # insertion order: t0-2 [0 1 2]; t3 0 hit (no move); t4 3f -0 [1 2 3]; t5 0f -1 [2 3 0];
    # t6 4f -2 [3 0 4]; t7 1f -3 [0 4 1]
    res = run(CLASSIC, 1, 5, 3, "fifo")
    assert faults_and_victims(res) == ([0, 1, 2, 4, 5, 6, 7], {4: 0, 5: 1, 6: 2, 7: 3})


def test_opt_by_hand() -> None:
    # key = next request time, or 2N - t = 16 - t if never again (N = 8)
    # t0-2 {0:3, 1:7, 2:14}; t3 0 hit {0:5}; t4 3f: max key 2 (14) -2 -> {0:5, 1:7, 3:12}
    # t5 0 hit {0:11}; t6 4f: 0 and 3 never come back, 3 is older (12 > 11) -3;
    # t7 1 hit
    res = run(CLASSIC, 1, 5, 3, "opt")
    assert faults_and_victims(res) == ([0, 1, 2, 4, 6], {4: 2, 6: 3})
    assert next_use_keys(CLASSIC).tolist() == [3, 7, 14, 5, 12, 11, 10, 9]


def test_lfu_by_hand_counts_restart_after_eviction() -> None:
    # l = 1, n = 4, k = 2; (count since insertion, last request) per page
    # t0 1f (1,0); t1 1 (2,1); t2 1 (3,2); t3 0f room (1,3); t4-6 0 hits -> 0:(4,6)
    # t7 2f: min(1:(3,2), 0:(4,6)) -1 -> {0:(4,6), 2:(1,7)}
    # t8 1f: min is 2:(1,7) -2 -> 1 starts again at (1,8), its old count is forgotten
    # t9 3f: min(1:(1,8), 0:(4,6)) -1  (with the old history 1 would have 4 and 0 would go)
    pages = np.array([1, 1, 1, 0, 0, 0, 0, 2, 1, 3], dtype=np.int64)
    res = run(pages, 1, 4, 2, "lfu")
    assert faults_and_victims(res) == ([0, 3, 7, 8, 9], {7: 1, 8: 2, 9: 1})


# l = 3, n = 2 (layer 0: pages 0 1, layer 1: 2 3, layer 2: 4 5), k = 5
# t:     0  1  2  3  4  5  6  7  8
# page:  0  2  4  1  3  5  0  2  4
LAYERED = layered(3, 2, [0, 0, 0, 1, 1, 1, 0, 0, 0])


def test_llru_by_hand() -> None:
    # t0-4 fill: tau 0:0 2:1 4:2 1:3 3:4
    # t5 5f: R = (5 - tau) // 3 = 1 for tau 0, 1, 2 (window tau <= 2), 0 for tau 3, 4;
    #        D = (tau - 5) mod 3: tau0 -> 1, tau1 -> 2, tau2 -> 0  => evict page 2 (tau 1)
    # t6 0 hit (tau 6)
    # t7 2f: R = 1 for tau 2, 3, 4 (pages 4, 1, 3), window tau <= 4;
    #        D = (tau - 7) mod 3: tau2 -> 1, tau3 -> 2, tau4 -> 0  => evict page 1 (tau 3)
    # t8 4 hit
    res = run(LAYERED, 3, 2, 5, "llru")
    assert faults_and_victims(res) == ([0, 1, 2, 3, 4, 5, 7], {5: 2, 7: 1})


def test_lru_on_the_llru_scenario_faults_more() -> None:
    # t5 5f -0 (oldest); t6 0f -2; t7 2f -4; t8 4f -1: every request faults
    res = run(LAYERED, 3, 2, 5, "lru")
    assert faults_and_victims(res) == (list(range(9)), {5: 0, 6: 2, 7: 4, 8: 1})


# l = 2, n = 3 (layer 0: 0 1 2, layer 1: 3 4 5), k = 5 -> shares [3, 2]
# t:     0  1  2  3  4  5  6  7  8  9
# page:  0  3  1  4  2  5  0  3  1  4
ROUNDS = layered(2, 3, [0, 0, 1, 1, 2, 2, 0, 0, 1, 1])


def test_lru_dist_by_hand() -> None:
    # layer 0 (share 3) holds 0 1 2 and never faults again; layer 1 (share 2):
    # t1 3f [3]; t3 4f [3 4]; t5 5f -3 [4 5]; t7 3f -4 [5 3]; t9 4f -5 [3 4]
    res = run(ROUNDS, 2, 3, 5, "lru-dist")
    assert faults_and_victims(res) == ([0, 1, 2, 3, 4, 5, 7, 9], {5: 3, 7: 4, 9: 5})
    assert res.faults_per_layer.tolist() == [3, 5]


def test_opt_dist_by_hand() -> None:
    # layer 1 alone, local time t // 2: 3 4 5 3 4 (N = 5)
    # local 2 (t5) 5f: next 3 -> 3, 4 -> 4: evict 4 -> {3, 5}; local 3 (t7) 3 hit;
    # local 4 (t9) 4f: 3 and 5 never come back, 5 is older -> evict 5
    res = run(ROUNDS, 2, 3, 5, "opt-dist")
    assert faults_and_victims(res) == ([0, 1, 2, 3, 4, 5, 9], {5: 4, 9: 5})
    assert res.faults_per_layer.tolist() == [3, 4]


def test_shared_opt_and_lru_on_rounds() -> None:
    # shared OPT: t5 5f, next uses 0:6 3:7 1:8 4:9, 2 never -> -2, then only hits
    assert faults_and_victims(run(ROUNDS, 2, 3, 5, "opt")) == ([0, 1, 2, 3, 4, 5], {5: 2})
    # shared LRU: a cycle of 6 pages in 5 slots faults on every request
    assert run(ROUNDS, 2, 3, 5, "lru").num_faults == 10


# l = 1, n = 5, k = 3: pages 0 1 2 0 3 4 1 0; seed 0 -> u = .637 .270 .041 .017
MARK = np.array([0, 1, 2, 0, 3, 4, 1, 0], dtype=np.int64)


def test_marking_by_hand_seed_0() -> None:
    # t0-2 fill, all marked; t3 0 hit
    # t4 3f: all marked -> new phase, unmarked = [0 1 2]; floor(.637*3) = 1 -> -1;
    #        unmarked [0 2], resident list [0 2] + 3 -> [0 2 3]
    # t5 4f: floor(.270*2) = 0 -> -0; unmarked [2]; resident [3 2] + 4 -> [3 2 4]
    # t6 1f: floor(.041*1) = 0 -> -2; unmarked []; resident [3 4] + 1 -> [3 4 1]
    # t7 0f: new phase, unmarked = sorted [1 3 4]; floor(.017*3) = 0 -> -1
    res = run(MARK, 1, 5, 3, "marking:seed=0")
    assert faults_and_victims(res) == ([0, 1, 2, 4, 5, 6, 7], {4: 1, 5: 0, 6: 2, 7: 1})
    assert res.policy == "marking:seed=0"


def test_marking_by_hand_seed_1() -> None:
    # u = .512 .950 .144 .949
    # t4: floor(.512*3) = 1 -> -1, unmarked [0 2], resident [0 2 3]
    # t5: floor(.950*2) = 1 -> -2, unmarked [0], resident [0 3 4]
    # t6: -0, unmarked [], resident [4 3 1]
    # t7: new phase [1 3 4], floor(.949*3) = 2 -> -4
    res = run(MARK, 1, 5, 3, "marking", seed=1)
    assert faults_and_victims(res) == ([0, 1, 2, 4, 5, 6, 7], {4: 1, 5: 2, 6: 0, 7: 4})
    assert res.policy == "marking:seed=1"  # the simulator's seed, resolved into the spec


# --------------------------------------------------------------------- naive references
@dataclass
class Slot:
    inserted: int
    last: int
    count: int


def naive(pages: I64, layers: int, n: int, k: int, policy: str) -> tuple[list[int], list[int]]:
    """O(k) scans straight from each policy's definition: (fault mask, victims)."""
    seq = pages.tolist()
    shares = layer_shares(k, layers).tolist() if policy.endswith("-dist") else None
    base = policy.removesuffix("-dist")
    cache: dict[int, Slot] = {}
    mask, victims = [], []
    for t, p in enumerate(seq):
        if p in cache:
            cache[p].last, cache[p].count = t, cache[p].count + 1
            mask.append(0)
            victims.append(-1)
            continue
        group = list(cache) if shares is None else [q for q in cache if q // n == p // n]
        cap = k if shares is None else shares[p // n]
        v = -1
        if len(group) == cap:
            v = max(group, key=lambda q: rank(base, cache[q], q, t, layers, seq))
            del cache[v]
        cache[p] = Slot(t, t, 1)
        mask.append(1)
        victims.append(v)
    return mask, victims


def rank(policy: str, s: Slot, q: int, t: int, layers: int, seq: list[int]) -> tuple[int, ...]:
    """Larger rank = evicted first."""
    if policy == "lru":
        return (-s.last,)
    if policy == "fifo":
        return (-s.inserted,)
    if policy == "lfu":
        return (-s.count, -s.last)
    if policy == "llru":
        return ((t - s.last) // layers, (s.last - t) % layers)
    assert policy == "opt"
    nxt = next((u for u in range(t + 1, len(seq)) if seq[u] == q), None)
    return (1, -s.last) if nxt is None else (0, nxt)


@st.composite
def traces(
    draw: st.DrawFn, max_layers: int = 4, max_experts: int = 4, max_len: int = 60
) -> tuple[I64, int, int, int]:
    layers = draw(st.integers(1, max_layers))
    n = draw(st.integers(1, max_experts))
    experts = draw(st.lists(st.integers(0, n - 1), max_size=max_len))
    k = draw(st.integers(1, layers * n + 1))
    return layered(layers, n, experts), layers, n, k


@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu", "llru", "opt", "lru-dist", "opt-dist"])
@settings(max_examples=60, deadline=None)
@given(case=traces(max_layers=5))
def test_matches_naive_reference(policy: str, case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, k = case
    if policy.endswith("-dist"):
        k = max(k, layers)
    res = run(pages, layers, n, k, policy)
    mask, victims = naive(pages, layers, n, k, policy)
    assert res.fault_mask is not None and res.victims is not None
    assert res.fault_mask.astype(int).tolist() == mask
    assert res.victims.tolist() == victims


@settings(max_examples=60, deadline=None)
@given(case=traces(max_layers=8, max_experts=3, max_len=120))
def test_llru_windowed_scan_matches_naive_with_many_layers(case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, k = case
    res = run(pages, layers, n, k, "llru")
    assert res.victims is not None
    assert res.victims.tolist() == naive(pages, layers, n, k, "llru")[1]


# ------------------------------------------------------------ invariants and properties
@pytest.mark.parametrize("policy", ALL)
@settings(max_examples=20, deadline=None)
@given(case=traces())
def test_invariants_after_every_step(policy: str, case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, k = case
    if make_policy(policy).partitioned:
        k = max(k, layers)
    checked = simulate(
        pages, num_layers=layers, num_experts=n, capacity=k, policy=policy, record=True, check=True
    )
    check_result(pages, checked, num_layers=layers, num_experts=n)
    plain = run(pages, layers, n, k, policy)
    assert plain.victims is not None and checked.victims is not None
    assert plain.victims.tolist() == checked.victims.tolist()
    assert plain.num_faults == int(plain.faults_per_layer.sum())
    assert plain.num_first_use_faults == len(set(pages.tolist()))
    assert plain.num_first_use_faults <= plain.num_faults <= len(pages)


@settings(max_examples=60, deadline=None)
@given(case=traces(max_len=80))
def test_opt_is_a_lower_bound(case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, k = case
    k = max(k, layers)
    faults = {p: run(pages, layers, n, k, p).num_faults for p in ALL}
    assert all(faults["opt"] <= f for f in faults.values()), faults
    assert faults["opt"] <= faults["opt-dist"] <= faults["lru-dist"]


@settings(max_examples=40, deadline=None)
@given(case=traces())
def test_enough_capacity_faults_only_on_first_use(case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, _ = case
    distinct = len(set(pages.tolist()))
    for policy in SHARED:
        assert run(pages, layers, n, max(distinct, 1), policy).num_faults == distinct
    for policy in ALL:
        assert run(pages, layers, n, layers * n, policy).num_faults == distinct


@pytest.mark.parametrize("policy", SHARED)
def test_one_page_faults_every_request_with_two_layers(policy: str) -> None:
    rng = np.random.default_rng(3)
    pages = layered(2, 3, rng.integers(0, 3, 50).tolist())
    assert run(pages, 2, 3, 1, policy).num_faults == 50


def test_one_page_with_one_layer_hits_repeats() -> None:
    pages = np.array([0, 0, 1, 1, 1, 0], dtype=np.int64)  # l = 1: repeats are hits
    assert {run(pages, 1, 2, 1, p).num_faults for p in SHARED} == {3}


def test_marking_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    rng = np.random.default_rng(5)
    pages = layered(2, 6, rng.integers(0, 6, 400).tolist())
    victims = {}
    for seed in (0, 1, 2):
        a, b = (run(pages, 2, 6, 5, f"marking:seed={seed}") for _ in range(2))
        assert a.victims is not None and b.victims is not None
        assert a.victims.tolist() == b.victims.tolist()
        victims[seed] = tuple(a.victims.tolist())
    assert len(set(victims.values())) == 3
    # the spec's seed wins over the simulator's
    assert run(pages, 2, 6, 5, "marking:seed=2", seed=9).victims.tolist() == list(victims[2])  # type: ignore[union-attr]


# ---------------------------------------------------------------- compiled kernels
@needs_numba
@pytest.mark.parametrize("policy", ALL)
@settings(max_examples=30, deadline=None)
@given(case=traces(max_layers=6, max_experts=5, max_len=150))
def test_numba_matches_python(policy: str, case: tuple[I64, int, int, int]) -> None:
    pages, layers, n, k = case
    if make_policy(policy).partitioned:
        k = max(k, layers)
    py = run(pages, layers, n, k, policy, backend="python")
    nb = run(pages, layers, n, k, policy, backend="numba")
    assert nb.backend == "numba" and py.backend == "python"
    assert py.fault_mask is not None and nb.fault_mask is not None
    assert py.victims is not None and nb.victims is not None
    assert py.fault_mask.tolist() == nb.fault_mask.tolist()
    assert py.victims.tolist() == nb.victims.tolist()
    assert py.faults_per_layer.tolist() == nb.faults_per_layer.tolist()


@needs_numba
@pytest.mark.parametrize("policy", ALL)
def test_numba_matches_python_on_a_longer_trace(policy: str) -> None:
    # skewed popularity, a few thousand requests, counters only (nothing recorded)
    rng = np.random.default_rng(11)
    pages = layered(4, 8, (rng.zipf(1.5, 6000).clip(max=8) - 1).tolist())
    kw = {"num_layers": 4, "num_experts": 8, "capacity": 9, "policy": policy}
    py = simulate(pages, backend="python", **kw)  # type: ignore[arg-type]
    nb = simulate(pages, backend="numba", **kw)  # type: ignore[arg-type]
    assert (py.num_faults, py.faults_per_layer.tolist()) == (
        nb.num_faults,
        nb.faults_per_layer.tolist(),
    )


@needs_numba
def test_marking_kernel_resumes_across_uniform_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernels, "UNIFORM_CHUNK", 7)  # many refills
    rng = np.random.default_rng(2)
    pages = layered(3, 4, rng.integers(0, 4, 900).tolist())
    py = run(pages, 3, 4, 5, "marking:seed=4", backend="python")
    nb = run(pages, 3, 4, 5, "marking:seed=4", backend="numba")
    assert py.victims is not None and nb.victims is not None
    assert py.victims.tolist() == nb.victims.tolist()


# ------------------------------------------------------------------ checkers can fail
class _HookLru(ExpertPolicy):
    """LRU written with hooks, as a third-party policy is (the Python loop drives it)."""

    name = "hook-lru"

    def reset(self, ctx: PolicyContext) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_hit(self, page: int, t: int) -> None:
        self._order.move_to_end(page)

    def on_insert(self, page: int, t: int) -> None:
        self._order[page] = None

    def victim(self, page: int, t: int) -> int:
        return self._order.popitem(last=False)[0]

    def tracked(self) -> list[int]:
        return list(self._order)


class _BadVictim(_HookLru):
    def victim(self, page: int, t: int) -> int:
        return page  # the requested page is never resident


class _BadTracking(_HookLru):
    def tracked(self) -> list[int]:
        return super().tracked()[1:]


@pytest.mark.parametrize("backend", ["python", "auto"])
def test_a_policy_written_with_hooks_equals_the_lru_kernel(backend: str) -> None:
    rng = np.random.default_rng(5)
    pages = layered(3, 4, rng.integers(0, 4, 600).tolist())
    kw = {"num_layers": 3, "num_experts": 4, "capacity": 5, "record": True}
    hooks = simulate(pages, policy=_HookLru(), check=True, backend=backend, **kw)  # type: ignore[arg-type]
    kernel = simulate(pages, policy="lru", backend=backend, **kw)  # type: ignore[arg-type]
    assert hooks.backend == "python"
    assert hooks.victims is not None and kernel.victims is not None
    assert hooks.victims.tolist() == kernel.victims.tolist()


def test_python_loop_rejects_an_invalid_victim() -> None:
    with pytest.raises(RuntimeError, match="victim"):
        simulate(CLASSIC, num_layers=1, num_experts=5, capacity=2, policy=_BadVictim())


def test_step_checker_catches_a_policy_that_loses_track() -> None:
    with pytest.raises(AssertionError, match="policy tracks"):
        simulate(
            CLASSIC, num_layers=1, num_experts=5, capacity=2, policy=_BadTracking(), check=True
        )


def test_check_result_catches_tampered_records() -> None:
    res = run(CLASSIC, 1, 5, 3, "lru")
    assert res.victims is not None and res.fault_mask is not None
    bad_victim = res.victims.copy()
    bad_victim[4] = 4  # not resident
    with pytest.raises(AssertionError, match="t=4"):
        check_result(CLASSIC, _replace(res, victims=bad_victim), num_layers=1, num_experts=5)
    early = res.victims.copy()
    early[1] = 0  # evicting with room left
    with pytest.raises(AssertionError, match="had room"):
        check_result(CLASSIC, _replace(res, victims=early), num_layers=1, num_experts=5)
    hit_fault = res.fault_mask.copy()
    hit_fault[3] = True  # t3 is a hit
    with pytest.raises(AssertionError, match="t=3"):
        check_result(CLASSIC, _replace(res, fault_mask=hit_fault), num_layers=1, num_experts=5)


def _replace(res: ExpertResult, **kw: object) -> ExpertResult:
    from dataclasses import replace

    return replace(res, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------- validation and registry
def test_bad_inputs_name_the_value() -> None:
    kw = {"num_layers": 2, "num_experts": 3, "policy": "lru"}
    with pytest.raises(ConfigError, match="capacity"):
        simulate(ROUNDS, capacity=0, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pages: request 1 has page 6, outside"):
        simulate(np.array([0, 6]), capacity=2, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="request 1 has page 1 of layer 0"):
        simulate(np.array([0, 1]), capacity=2, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="num_layers and num_experts"):
        simulate(ROUNDS, capacity=2, policy="lru")
    with pytest.raises(ConfigError, match="seed must be"):
        simulate(ROUNDS, capacity=2, seed=-1, **kw)  # type: ignore[arg-type]
    if _kernels.COMPILED:
        with pytest.raises(ConfigError, match="no kernel"):
            simulate(
                ROUNDS, capacity=2, num_layers=2, num_experts=3, policy=_HookLru(), backend="numba"
            )
    with pytest.raises(ConfigError, match="backend"):
        simulate(ROUNDS, capacity=2, backend="gpu", **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"capacity=1 is below num_layers=2"):
        simulate(ROUNDS, capacity=1, num_layers=2, num_experts=3, policy="opt-dist")


def test_trace_objects_are_accepted_and_checked() -> None:
    @dataclass(frozen=True)
    class Trace:
        pages: I64
        num_layers: int = 2
        num_experts: int = 3

    res = simulate(Trace(ROUNDS), capacity=5, policy="lru")
    assert res.num_faults == 10 and res.num_requests == 10
    with pytest.raises(ConfigError, match="num_layers=3 disagrees"):
        simulate(Trace(ROUNDS), capacity=5, policy="lru", num_layers=3)


def test_registry_and_specs() -> None:
    assert ALL == ["fifo", "lfu", "llru", "lru", "lru-dist", "marking", "opt", "opt-dist"]
    assert DIST == ["lru-dist", "opt-dist"]
    for name, cls in registered().items():
        assert describe(cls)
        pol = make_policy(name)
        assert pol.spec() == name and pol.clone().spec() == name
    assert parameters(registered()["marking"]) == {"seed": None}
    assert make_policy(" marking : seed=3 ").spec() == "marking:seed=3"
    with pytest.raises(ConfigError, match="unknown expert policy 'lru2'"):
        make_policy("lru2")
    with pytest.raises(ConfigError, match="has no parameter 'k'"):
        make_policy("lru:k=3")
    with pytest.raises(ConfigError, match="seed must be a non-negative integer"):
        make_policy("marking:seed=-1")
    with pytest.raises(ConfigError, match="expected key=value"):
        make_policy("marking:seed")


def test_layer_shares_spread_the_remainder_over_the_first_layers() -> None:
    assert layer_shares(10, 4).tolist() == [3, 3, 2, 2]
    assert layer_shares(8, 4).tolist() == [2, 2, 2, 2]
    with pytest.raises(ConfigError, match="num_layers=4"):
        layer_shares(3, 4)


def test_sweep_and_ratio_to_opt() -> None:
    rng = np.random.default_rng(8)
    pages = layered(3, 4, rng.integers(0, 4, 300).tolist())
    rows = sweep_capacities(
        pages, [1, 3, 6], ["lru", "opt", "lru-dist", "marking"], seed=4, num_layers=3, num_experts=4
    )
    got = [(r["capacity"], r["policy"]) for r in rows]
    assert got == [
        (1, "lru"),
        (1, "opt"),
        (1, "marking:seed=4"),
        (3, "lru"),
        (3, "opt"),
        (3, "lru-dist"),
        (3, "marking:seed=4"),
        (6, "lru"),
        (6, "opt"),
        (6, "lru-dist"),
        (6, "marking:seed=4"),
    ]
    for r in rows:
        assert r["opt_faults"] <= r["num_faults"]  # type: ignore[operator]
        assert r["fault_ratio_to_opt"] == r["num_faults"] / r["opt_faults"]  # type: ignore[operator]
        assert r["policy"] != "opt" or r["fault_ratio_to_opt"] == 1.0
    ratios = fault_ratio_to_opt(pages, 6, ["opt", "lru", "marking"], num_layers=3, num_experts=4)
    lru6 = next(r for r in rows if r["capacity"] == 6 and r["policy"] == "lru")
    assert ratios["opt"] == 1.0 and ratios["lru"] == lru6["fault_ratio_to_opt"]
    with pytest.raises(ConfigError, match="capacity=1 is below num_layers=3"):
        sweep_capacities(
            pages, [1], ["lru-dist"], num_layers=3, num_experts=4, skip_infeasible=False
        )


def test_empty_trace() -> None:
    empty = np.zeros(0, dtype=np.int64)
    for policy in ALL:
        res = simulate(empty, num_layers=2, num_experts=2, capacity=2, policy=policy)
        assert (res.num_faults, res.fault_rate) == (0, 0.0)
    assert fault_ratio_to_opt(empty, 2, ["lru"], num_layers=2, num_experts=2) == {"lru": 1.0}


def test_policy_objects_are_reusable() -> None:
    pol: ExpertPolicy = make_policy("opt")
    first = simulate(
        CLASSIC, num_layers=1, num_experts=5, capacity=3, policy=pol, backend="python"
    ).num_faults
    again = simulate(
        CLASSIC, num_layers=1, num_experts=5, capacity=3, policy=pol, backend="python"
    ).num_faults
    assert first == again == 5
