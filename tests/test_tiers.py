"""KV tiers below GPU memory (prefixlab.cache.tier, prefixlab.runner.engine.tiers): load times
by hand from bytes and bandwidth, the link's queue, overlap with prefill, write-through and
write-back, a store shared by a fleet, the tier pool against a naive LRU model, an
unbounded tier against an unbounded cache, and errors that name the bad value."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.cache.tier import Tier
from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import make_eviction_policy
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.tiers import TierConfig, TierStack, make_tier
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from tests.helpers import keyed_trace

TIMING = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.01")
#: llama-3.1-8b: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes, 16 tokens a block
BLOCK_BYTES = 32 * 8 * 128 * 2 * 2 * 16
MODEL = "llama-3.1-8b"


def _config(*tiers: TierConfig, capacity: int = 4, overlap: bool = False) -> EngineConfig:
    return EngineConfig(
        capacity_blocks=capacity,
        block_tokens=16,
        model=MODEL,
        tiers=tiers,
        load_overlap=overlap,
    )


def _wait(result: object) -> list[float]:
    return (result.first_token_s - result.arrival_s).tolist()  # type: ignore[attr-defined]


# The GPU holds 4 blocks: request 1 evicts request 0's three, so request 2 (request 0's
# prompt again) finds them only in the CPU tier.
EVICTED = keyed_trace([[1, 2, 3], [4, 5, 6], [1, 2, 3]], [0.0, 10.0, 20.0])


@pytest.mark.parametrize("overlap", [False, True])
def test_every_hit_from_the_cpu_tier_pays_its_load_by_hand(overlap: bool) -> None:
    cpu = TierConfig("cpu", 100, bandwidth_gbps=2.0, latency_s=0.003)
    res = simulate(EVICTED, "lru", _config(cpu, overlap=overlap), TIMING, check_every=1)
    load = 3 * BLOCK_BYTES / 2e9 + 0.003  # 3 blocks of 2 MiB at 2 GB/s, plus the latency
    assert load == pytest.approx(0.0061457, abs=1e-7)
    prefill_one = TIMING.step_s([(1, 48, 0)], [])  # the last token, after 48 loaded
    cold = TIMING.step_s([(49, 0, 0)], [])
    wait = max(load - prefill_one, 0.0) if overlap else load
    assert _wait(res) == pytest.approx([cold, cold, wait + prefill_one], abs=1e-12)
    m = res.metrics
    assert m["cpu_token_hit_ratio"] == pytest.approx(48 / 147)
    assert m["gpu_token_hit_ratio"] == 0.0
    assert m["token_hit_ratio"] == pytest.approx(48 / 147)  # a lower tier's hit is a hit
    assert m["cpu_bytes_loaded"] == 3 * BLOCK_BYTES
    assert m["cpu_bytes_stored"] == 6 * BLOCK_BYTES  # write-through: blocks 1-6, once each
    assert m["mean_load_wait_s"] == pytest.approx(wait / 3)
    without = simulate(EVICTED, "lru", _config(), TIMING)
    assert _wait(without) == pytest.approx([cold] * 3)


def test_vllm_lru_tier_in_the_engine() -> None:
    """vLLM's CPU tier (``vllm-lru``) serves request 2 from the CPU as the block tier does."""
    cpu = TierConfig("cpu", 100, policy="vllm-lru", bandwidth_gbps=2.0, latency_s=0.003)
    res = simulate(EVICTED, "lru", _config(cpu), TIMING, check_every=1)
    assert res.metrics["cpu_token_hit_ratio"] == pytest.approx(48 / 147)
    assert res.metrics["cpu_bytes_stored"] == 6 * BLOCK_BYTES
    load = 3 * BLOCK_BYTES / 2e9 + 0.003
    assert _wait(res)[2] == pytest.approx(load + TIMING.step_s([(1, 48, 0)], []), abs=1e-12)


def test_loads_queue_on_the_link() -> None:
    """Two requests loading at one instant: the second transfer starts when the first ends."""
    trace = keyed_trace([[1, 2], [3, 4], [5, 6, 7, 8], [1, 2], [3, 4]], [0, 1, 2, 10, 10])
    cpu = TierConfig("cpu", 100, bandwidth_gbps=1.0, latency_s=0.001)
    res = simulate(trace, "lru", _config(cpu, capacity=6), TIMING, check_every=1)
    one = 2 * BLOCK_BYTES / 1e9 + 0.001
    waits = res.first_token_s[3:] - res.arrival_s[3:]
    # each prefills its last token when its own load ends: the second's ends one later
    step = TIMING.step_s([(1, 32, 0)], [])
    assert waits.tolist() == pytest.approx([one + step, 2 * one + step], abs=1e-12)
    assert res.metrics["cpu_bytes_loaded"] == 4 * BLOCK_BYTES


def test_a_block_is_readable_only_once_its_write_lands() -> None:
    """A slow link (1 MB/s): request 0's three blocks are written when its prefill caches
    them and land 3 x 2 MiB / 1 MB/s later. Request 2 (request 0's prompt), evicted from
    the GPU by request 1, finds them in the CPU tier: arriving before they land, its load
    waits for them (vLLM's HIT_PENDING, the request deferred); after, it loads at once."""
    cpu = TierConfig("cpu", 100, bandwidth_gbps=0.001, latency_s=0.0)
    copy = 3 * BLOCK_BYTES / 1e6
    assert copy == pytest.approx(6.291456)
    cold = TIMING.step_s([(49, 0, 0)], [])
    landed = cold + copy  # request 0's prefill ends at `cold`: its blocks are cached then
    last = TIMING.step_s([(1, 48, 0)], [])  # the last token, after 48 loaded
    for early, wait, waits in ((0.5, 0.5 + copy + last, 1), (-0.5, copy + last, 0)):
        trace = keyed_trace([[1, 2, 3], [4, 5, 6], [1, 2, 3]], [0.0, 1.0, landed - early])
        res = simulate(trace, "lru", _config(cpu), TIMING, check_every=1)
        assert res.first_token_s[0] == pytest.approx(cold, abs=1e-12)
        assert _wait(res)[2] == pytest.approx(wait, abs=1e-9), early
        assert res.metrics["cpu_token_hit_ratio"] == pytest.approx(48 / 147)
        assert res.metrics["cpu_in_flight_waits"] == waits


def test_writes_queue_on_their_own_direction_of_the_link() -> None:
    """Two stores on one link: the second lands when the first has and its own copy is
    done; a load on the other direction waits only for the blocks it reads to land."""
    stack = TierStack([TierConfig("cpu", 100, bandwidth_gbps=1.0)], [_lru_tier(100)], 10**9, 4)
    keys = np.array([1, 2, 3], dtype=np.int64)
    stack.offer(0, keys, (0, 2), (0, np.zeros(0, np.int64)), 0.0)  # 2 GB: lands at 2 s
    stack.offer(1, keys, (2, 3), (0, np.zeros(0, np.int64)), 0.5)  # 1 GB more: at 3 s
    assert stack.tiers[0].pending == {1: 2.0, 2: 2.0, 3: 3.0}
    stack.now = 1.0
    assert stack.peek(keys).tolist() == [0, 0, 0]  # in flight, yet found
    # blocks 1 and 2 land at 2 s, then 2 GB back at 1 GB/s; block 3 would wait until 3 s
    assert stack.load(2, keys[:2], np.zeros(2, np.int64), 1.0, (0, 0)) == 4.0
    assert stack.in_flight_waits == [1]
    assert stack.load(3, keys[:1], np.zeros(1, np.int64), 5.0, (0, 0)) == 6.0
    assert stack.in_flight_waits == [1]


def test_a_load_waiting_for_a_write_leaves_the_link_to_others() -> None:
    """Block 9 lands at 1 s, blocks 1-3 at 4 s (1 GB blocks, 1 GB/s). At 2 s request A
    needs block 1: it is deferred to 4 s and loads until 5 s. Request B, loading block 9
    at 2 s, takes the idle link at once (done at 3 s), not after A. With the overlap, A's
    own prefill (longer than its load) hides the load but never the wait for the landing."""
    cfg = TierConfig("cpu", 100, bandwidth_gbps=1.0)
    power = make_timing("power:preset=llama-3.1-8b-h100")
    rest_a, rest_b = (100_000, 0), (1, 0)
    assert power.step_s([(*rest_a, 0)], []) > 1.0
    for timing in (None, power):
        stack = TierStack([cfg], [_lru_tier(100)], 10**9, 4, timing)
        stack.offer(0, np.array([9], np.int64), (0, 1), (0, np.zeros(0, np.int64)), 0.0)
        stack.offer(1, np.array([1, 2, 3], np.int64), (0, 3), (0, np.zeros(0, np.int64)), 1.0)
        assert stack.tiers[0].pending == {9: 1.0, 1: 4.0, 2: 4.0, 3: 4.0}
        stack.now = 2.0
        one = np.zeros(1, np.int64)
        a = stack.load(0, np.array([1], np.int64), one, 2.0, rest_a)
        b = stack.load(1, np.array([9], np.int64), one, 2.0, rest_b)
        hidden_b = 0.0 if timing is None else power.step_s([(*rest_b, 0)], [])
        assert (a, b) == (
            pytest.approx(5.0 if timing is None else 4.0),
            pytest.approx(3.0 - hidden_b),
        )
        assert stack.link_busy[0] == [(2.0, 3.0), (4.0, 5.0)]


def _lru_tier(blocks: int) -> Tier:
    return Tier("cpu", blocks, make_eviction_policy("lru", "block"), 16, block_tokens=16)


def test_write_back_keeps_only_what_the_gpu_evicts() -> None:
    cpu = TierConfig("cpu", 100, write="back", bandwidth_gbps=2.0, latency_s=0.0)
    res = simulate(EVICTED, "lru", _config(cpu), TIMING, check_every=1)
    # request 0's blocks when request 1 evicts them, request 1's when request 2 does
    assert res.metrics["cpu_bytes_stored"] == 6 * BLOCK_BYTES
    assert res.metrics["cpu_token_hit_ratio"] == pytest.approx(48 / 147)
    # nothing evicted, nothing written back
    roomy = simulate(EVICTED, "lru", _config(cpu, capacity=64), TIMING)
    assert roomy.metrics["cpu_bytes_stored"] == 0
    assert roomy.metrics["gpu_token_hit_ratio"] == pytest.approx(48 / 147)


def test_a_tier_evicts_by_its_own_policy_and_demotes_into_the_store() -> None:
    """A 3-block CPU tier writing back into the store: request 1's blocks push request 0's
    out of the CPU, into the store, where request 2 finds them."""
    cpu = TierConfig("cpu", 3, write="back")
    store = TierConfig("store", 50, write="back", bandwidth_gbps=1.0, latency_s=0.0)
    trace = keyed_trace([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 2, 3]], [0.0, 10.0, 20.0, 30.0])
    res = simulate(trace, "lru", _config(cpu, store), TIMING, check_every=1)
    m = res.metrics
    assert m["cpu_evictions"] == 6  # request 0's blocks, then request 1's
    assert m["store_bytes_stored"] == 6 * BLOCK_BYTES
    assert m["store_token_hit_ratio"] == pytest.approx(48 / (4 * 49))
    assert m["cpu_token_hit_ratio"] == 0.0
    load = 3 * BLOCK_BYTES / 1e9
    assert _wait(res)[3] == pytest.approx(load + TIMING.step_s([(1, 48, 0)], []), abs=1e-12)


def test_the_store_is_shared_by_the_fleet() -> None:
    """Round-robin sends the two copies of a prompt to two replicas: the second finds the
    first's blocks in the store, over its own link."""
    trace = keyed_trace([[1, 2, 3], [1, 2, 3]], [0.0, 10.0])
    store = TierConfig("store", 50, bandwidth_gbps=1.0, latency_s=0.002)
    cfg = _config(store, capacity=64)
    res = simulate_fleet(trace, "lru", cfg, FleetConfig(2, "round-robin"), TIMING, check_every=1)
    assert res.replica.tolist() == [0, 1]
    m = res.engine.metrics
    assert m["store_token_hit_ratio"] == pytest.approx(48 / 98)
    assert m["gpu_token_hit_ratio"] == 0.0
    load = 3 * BLOCK_BYTES / 1e9 + 0.002
    assert _wait(res.engine)[1] == pytest.approx(load + TIMING.step_s([(1, 48, 0)], []))
    alone = simulate_fleet(trace, "lru", _config(capacity=64), FleetConfig(2), TIMING)
    assert alone.engine.metrics["token_hit_ratio"] == 0.0


def test_unused_tiers_change_no_time() -> None:
    """A GPU that never evicts: the tiers are written but never read, and every time is the
    engine's without them."""
    trace = keyed_trace([[1, 2], [1, 2, 3], [9], [1, 2, 3, 4]], [0.0, 0.5, 0.5, 3.0])
    cpu = TierConfig("cpu", 10)
    with_tiers = simulate(trace, "lru", _config(cpu, TierConfig("store", 10), capacity=64), TIMING)
    plain = simulate(trace, "lru", _config(capacity=64), TIMING)
    for name in ("scheduled_s", "first_token_s", "finish_s", "hit_tokens"):
        assert np.array_equal(getattr(with_tiers, name), getattr(plain, name)), name
    assert with_tiers.metrics["cpu_bytes_loaded"] == 0
    assert with_tiers.metrics["cpu_bytes_stored"] == 5 * BLOCK_BYTES  # keys 1, 2, 3, 9, 4


# --------------------------------------------------------------------- naive references
def _naive_lru(ops: list[tuple[str, list[int]]], capacity: int) -> list[list[int]]:
    """A tier as an ordered dict, least recent first; a run of keys (stored or read)
    becomes recent in order, its first key the least recent."""
    od: OrderedDict[int, None] = OrderedDict()
    seen = []
    for op, keys in ops:
        if op == "take":
            run = []
            for k in keys:
                if k not in od:
                    break
                run.append(k)
            seen.append(run)
            keys = run
        else:
            new = [k for k in dict.fromkeys(keys) if k not in od][:capacity]
            while len(od) + len(new) > capacity:
                od.popitem(last=False)
            keys = new
            seen.append(new)
        for k in keys:
            od[k] = None
            od.move_to_end(k)
    seen.append(sorted(od))
    return seen


_RUNS = st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["store", "take"]), _RUNS), max_size=40))
def test_an_lru_tier_is_a_naive_lru(ops: list[tuple[str, list[int]]]) -> None:
    tier = Tier("cpu", 5, make_eviction_policy("lru", "block"), 16, block_tokens=16)
    got = []
    for t, (op, keys) in enumerate(ops):
        arr = np.array(keys, dtype=np.int64)
        if op == "take":
            n = tier.peek(arr)
            tier.take(arr[:n], float(t), 0)
            got.append(keys[:n])
        else:
            before = tier.cache.cached_keys()
            tier.store(arr, float(t), 0)
            got.append([k for k in dict.fromkeys(keys) if k not in before][:5])
        tier.check()
    got.append(sorted(tier.cache.cached_keys()))
    assert got == _naive_lru(ops, 5)


def _tree_prompts(draw: st.DrawFn) -> list[list[int]]:
    """Prompts that share prefixes as chained keys do: each is a prefix of an earlier one
    (or nothing) plus fresh keys."""
    prompts: list[list[int]] = []
    fresh = 0
    for _ in range(draw(st.integers(2, 14))):
        base: list[int] = []
        extra = draw(st.integers(1, 4))
        if prompts:  # at most 5 blocks: a request fits the 6-block GPU
            parent = prompts[draw(st.integers(0, len(prompts) - 1))]
            base = parent[: draw(st.integers(0, min(len(parent), 5 - extra)))]
        prompts.append(base + list(range(fresh, fresh + extra)))
        fresh += extra
    return prompts


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(["through", "back"]))
def test_an_unbounded_tier_hits_what_an_unbounded_cache_would(
    data: st.DataObject, write: str
) -> None:
    """A tiny GPU over an unbounded CPU tier, requests one at a time: with write-through
    each request hits the longest prefix of its blocks any earlier request computed, as an
    unbounded cache would. With write-back it hits no more than that (a block the GPU
    still holds behind an evicted parent is in neither place a lookup reaches)."""
    prompts = data.draw(st.composite(lambda draw: _tree_prompts(draw))())
    trace = keyed_trace(prompts, [10.0 * i for i in range(len(prompts))])
    cpu = TierConfig("cpu", 1000, write=write)
    res = simulate(trace, "lru", _config(cpu, capacity=6), TIMING, check_every=1)
    seen: set[int] = set()
    for r, p in enumerate(prompts):
        run = 0
        while run < len(p) and p[run] in seen:
            run += 1
        if write == "through":
            assert int(res.hit_tokens[r]) == 16 * run, r
        else:
            assert int(res.hit_tokens[r]) <= 16 * run, r
        seen.update(p)


def test_each_block_loads_from_the_highest_tier_that_holds_it() -> None:
    """The CPU pool holds block 1, the store blocks 1-3: the run is 1 (CPU), 2 and 3
    (store), each over its own link, the store's queued behind an earlier load."""
    layout = keyed_trace([[1, 2, 3, 4]], [0.0]).block_layout(16, None, False, 1)
    cpu, store = TierConfig("cpu", 8, bandwidth_gbps=4.0), TierConfig("store", 8, latency_s=0.01)
    tiers = [make_tier(cpu, layout), make_tier(store, layout)]
    keys = layout.keys[:4]
    tiers[0].store(keys[:1], 0.0, 0)
    tiers[1].store(keys[:3], 0.0, 0)
    stack = TierStack([cpu, store], tiers, BLOCK_BYTES, 1)
    src = stack.peek(keys)
    assert src.tolist() == [0, 1, 1]
    stack.link_busy[1] = [(0.0, 5.0)]  # the store's link is busy until 5 s
    ready = stack.load(0, keys[:3], src, 1.0, (17, 48))
    assert ready == pytest.approx(5.0 + 2 * BLOCK_BYTES / 12.5e9 + 0.01)
    assert stack.bytes_loaded == [BLOCK_BYTES, 2 * BLOCK_BYTES]
    assert stack.link_busy[0] == [(1.0, pytest.approx(1.0 + BLOCK_BYTES / 4e9))]
    # write-through: block 2 and 3 came from below the CPU pool, which keeps them now
    stack.offer(0, keys, (0, 4), (0, src), 6.0)
    assert tiers[0].cache.cached_keys() == set(keys.tolist())
    assert tiers[1].cache.cached_keys() == set(keys.tolist())


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ((TierConfig("store", 4), TierConfig("cpu", 4)), "top down"),
        ((TierConfig("disk", 4),), "the tiers are cpu, store"),
        ((TierConfig("cpu", 0),), "capacity_blocks must be >= 1"),
        ((TierConfig("cpu", 4, write="around"),), "write must be one of through, back"),
        ((TierConfig("cpu", 4, bandwidth_gbps=0.0),), "bandwidth_gbps must be positive"),
        ((TierConfig("cpu", 4, latency_s=-1.0),), "latency_s must be >= 0"),
        ((TierConfig("cpu", 4, policy="opt"),), "choose an online policy"),
        ((TierConfig("cpu", 4, policy="nope"),), "nope"),
        ((TierConfig("cpu", 4, admission="seen:n=0"),), "n"),
        ((TierConfig("cpu", 4, policy="vllm-lru:speed=2"),), "not 'speed'"),
        ((TierConfig("cpu", 4, policy="vllm-lru:store_threshold=0"),), "integer >= 1"),
        ((TierConfig("cpu", 4, policy="vllm-lru", admission="seen"),), "own store_threshold"),
    ],
)
def test_bad_tiers_are_named(tiers: tuple[TierConfig, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate(EVICTED, "lru", _config(*tiers), TIMING)


def test_tiers_need_a_model_and_blocks() -> None:
    cpu = (TierConfig("cpu", 4),)
    with pytest.raises(ConfigError, match="tiers need a model"):
        simulate(EVICTED, "lru", EngineConfig(capacity_blocks=4, tiers=cpu), TIMING)
    hybrid = EngineConfig(
        capacity_blocks=1, structure="hybrid", capacity_bytes=10**9, model=MODEL, tiers=cpu
    )
    with pytest.raises(ConfigError, match="block or radix structure"):
        hybrid.validate()


def test_command_line_tiers(tmp_path: Path) -> None:
    from prefixlab.workload.loaders.write import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(EVICTED, path)
    base = ["simulate", str(path), "-p", "lru", "--capacity-blocks", "4", "--model", MODEL]
    base += ["--timing", "power:preset=llama-3.1-8b-h100+tpot:s=0.01", "--json", "--quiet"]
    tier = "cpu:size=1GB,policy=s3fifo,policy.small_ratio=0.2,write=back,gbps=2,latency_s=0"
    out = CliRunner().invoke(app, [*base, "--tier", tier, "--load-overlap"])
    assert out.exit_code == 0, out.output
    import json

    row = json.loads(out.output)[0]
    assert row["cpu_token_hit_ratio"] == pytest.approx(48 / 147)
    assert row["cpu_bytes_stored"] == 6 * BLOCK_BYTES
    for bad, message in [
        ("cpu:blocks=4,size=1GB", "one of them"),
        ("cpu:size=lots", "not a size"),
        ("cpu:blocks=4,speed=3", "unknown key 'speed'"),
    ]:
        out = CliRunner().invoke(app, [*base, "--tier", bad])
        assert out.exit_code == 2 and message in out.output, out.output
