"""The fleet runner (prefixlab.runner.fleet) and the routers (prefixlab.routers): one replica
is the engine runner; session routing keeps a session's history; random routing dilutes
it as replicas are added; least-loaded routing equals a discrete-event model of
join-the-shortest-queue on the same arrivals; routers' rules by hand."""

from __future__ import annotations

import dataclasses
import heapq
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.model.timing import make_timing
from prefixlab.policies.base import make_policy
from prefixlab.routers import Fleet, Loads, make_router, registered
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.tiers import tier_of
from prefixlab.runner.fleet import FleetConfig, FleetResult, simulate_fleet
from prefixlab.runner.fleet_routed import routed_applies
from prefixlab.runner.fleet_split import split_applies
from prefixlab.workload.generators import GENERATORS, generate_sessions
from prefixlab.workload.trace import Trace
from tests.helpers import keyed_trace

TIMING = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.01")


def _sessions(n: int = 60, seed: int = 3) -> Trace:
    return generate_sessions(num_sessions=n, seed=seed, session_rate_per_s=2.0)


@pytest.mark.parametrize(
    ("structure", "closed_loop", "policy"),
    [("block", False, "lru"), ("radix", False, "lru"), ("block", True, "s3fifo")],
)
def test_one_replica_is_the_engine_runner(structure: str, closed_loop: bool, policy: str) -> None:
    trace = _sessions()
    cfg = EngineConfig(
        capacity_blocks=1200, block_tokens=16, structure=structure, closed_loop=closed_loop
    )
    engine = simulate(trace, policy, cfg, TIMING)  # the compiled engine
    fleet = simulate_fleet(trace, policy, cfg, FleetConfig(1, "random"), TIMING, check_every=7)
    a, b = engine.as_dict(), fleet.engine.as_dict()
    a.pop("elapsed_s"), b.pop("elapsed_s")
    assert a == b
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "hit_tokens"):
        assert np.array_equal(getattr(engine, name), getattr(fleet.engine, name)), name
    assert fleet.replica.tolist() == [0] * len(trace)


def _history_blocks(trace: Trace) -> list[tuple[int, int]]:
    """(request, blocks of its prompt that its session's previous turn left cached: the
    leading keys it shares with that turn's input and output) for every later turn."""
    layout = trace.block_layout(16)
    prev: dict[str, int] = {}
    out = []
    for r in np.lexsort((trace.turn, trace.arrival_s)).tolist():
        sid = trace.session_id[r]
        assert sid is not None
        if sid in prev:
            mine = layout.request_keys(r)[: int(layout.num_lookup_blocks[r])].tolist()
            theirs = layout.request_keys(prev[sid]).tolist()
            k = 0
            while k < min(len(mine), len(theirs)) and mine[k] == theirs[k]:
                k += 1
            out.append((r, k))
        prev[sid] = r
    return out


def test_session_routing_keeps_every_session_history() -> None:
    """A cache far larger than any session, turns arriving after their predecessor ends:
    under ``session`` every later turn hits at least its whole history; under
    ``round-robin`` some do not."""
    trace = _sessions(40)
    cfg = EngineConfig(capacity_blocks=20_000, block_tokens=16, closed_loop=True)
    history = _history_blocks(trace)
    assert sum(k for _, k in history) > 0
    for router, keeps in (("session", True), ("round-robin", False)):
        res = simulate_fleet(trace, "lru", cfg, FleetConfig(4, router), TIMING)
        hit_blocks = res.engine.hit_tokens // 16
        kept = [hit_blocks[r] >= k for r, k in history]
        assert all(kept) == keeps, router
        if router == "session":  # and a session never leaves its replica
            for sid in set(trace.session_id):
                rows = [i for i, s in enumerate(trace.session_id) if s == sid]
                assert len(set(res.replica[rows].tolist())) == 1


def test_random_routing_dilutes_reuse_as_replicas_grow() -> None:
    trace = _sessions(120)
    ratios = []
    for n in (1, 2, 4, 8):
        cfg = EngineConfig(capacity_blocks=20_000, block_tokens=16)
        res = simulate_fleet(trace, "lru", cfg, FleetConfig(n, "random:seed=1"), TIMING)
        ratios.append(res.engine.metrics["token_hit_ratio"])
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < ratios[0] - 0.05, ratios


def _fixed_prompts(n: int, rate: float, seed: int) -> Trace:
    """Poisson arrivals of 100-token prompts with one output token, no shared prefix."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    ids = np.arange(n * 6, dtype=np.uint64)
    return Trace(
        arrival_s=arrivals,
        input_length=np.full(n, 100),
        output_length=np.ones(n, np.int64),
        session_id=[None] * n,
        turn=np.zeros(n, np.int64),
        task=[None] * n,
        hash_ids=(ids, np.arange(0, n * 6 + 1, 6, dtype=np.int64)),
        hashed_tokens=np.full(n, 100),
        block_tokens=16,
    )


def _shortest_queue(arrivals: list[float], servers: int, service: float) -> list[float]:
    """Discrete-event join-the-shortest-queue: each arrival joins the server with the
    fewest requests in system (ties: the lowest index), FIFO, deterministic service;
    returns each request's wait before service."""
    in_system = [0] * servers
    free_at = [0.0] * servers
    ends: list[tuple[float, int]] = []  # (departure, server)
    waits = []
    for t in arrivals:
        while ends and ends[0][0] <= t:  # departures at t come first (step ends first)
            _, s = heapq.heappop(ends)
            in_system[s] -= 1
        s = min(range(servers), key=lambda i: (in_system[i], i))
        start = max(t, free_at[s])
        free_at[s] = start + service
        in_system[s] += 1
        heapq.heappush(ends, (free_at[s], s))
        waits.append(start - t)
    return waits


def _one_queue(arrivals: list[float], servers: int, service: float) -> list[float]:
    """Discrete-event M/D/N: one FIFO queue for all servers; each request's wait."""
    free = [0.0] * servers
    waits = []
    for t in arrivals:
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + service)
        waits.append(start - t)
    return waits


@pytest.mark.parametrize("servers", [2, 4])
def test_least_loaded_is_join_the_shortest_queue(servers: int) -> None:
    """N replicas, one request at a time each (max_num_seqs=1), 1 s of service: the fleet's
    waits equal the model's, request by request, at 90% load. The M/D/N queue (one queue
    for all servers) waits less on average: a router commits a request to one replica's
    queue (measured: 1.6% more with 2 replicas, 14% with 4)."""
    timing = make_timing("power:a=0.01,b=1,c=1")  # 100 tokens -> 1 s
    trace = _fixed_prompts(3000, 0.9 * servers, seed=servers)
    cfg = EngineConfig(capacity_blocks=64, max_num_seqs=1)
    res = simulate_fleet(trace, "lru", cfg, FleetConfig(servers, "least-loaded"), timing)
    waits = res.engine.scheduled_s - res.engine.arrival_s
    assert np.allclose(res.engine.first_token_s - res.engine.scheduled_s, 1.0)
    want = _shortest_queue(trace.arrival_s.tolist(), servers, 1.0)
    assert np.allclose(waits, want, atol=1e-9)
    shared = float(np.mean(_one_queue(trace.arrival_s.tolist(), servers, 1.0)))
    assert shared <= float(waits.mean()) <= 1.2 * shared


def _fleet(n: int, trace: Trace | None = None) -> Fleet:
    tr = trace if trace is not None else _sessions(5)
    return Fleet(n, tr, tr.block_layout(16), Loads.empty(n))


def test_routers_by_hand() -> None:
    rr = make_router("round-robin")
    rr.bind(_fleet(3))
    assert [rr.route(r, 0.0) for r in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    ll = make_router("least-loaded")
    fleet = _fleet(3)
    ll.bind(fleet)
    fleet.loads.outstanding[:] = [2, 1, 1]
    assert ll.route(0, 0.0) == 1  # the fewest, ties to the lowest index
    by_tokens = make_router("least-loaded:by=tokens")
    by_tokens.bind(fleet)
    fleet.loads.prefill_tokens[:] = [10, 300, 20]
    assert by_tokens.route(0, 0.0) == 0
    sess = make_router("session")
    sess.bind(_fleet(4))
    again = make_router("session")
    again.bind(_fleet(4))
    trace = sess.fleet.trace
    assert [sess.route(r, 0.0) for r in range(len(trace))] == [
        again.route(r, 0.0) for r in range(len(trace))
    ]
    by_session: dict[str | None, set[int]] = {}
    for r, sid in enumerate(trace.session_id):
        by_session.setdefault(sid, set()).add(sess.route(r, 0.0))
    assert all(len(v) == 1 for v in by_session.values())


def test_power_of_two_takes_the_less_loaded_of_its_pair() -> None:
    fleet = _fleet(4)
    p2 = make_router("power-of-two:seed=2")
    p2.bind(fleet)
    fleet.loads.outstanding[:] = [3, 0, 5, 1]
    rng = np.random.default_rng(2)
    for _ in range(40):
        pair = np.sort(rng.choice(4, size=2, replace=False))
        best = int(pair[np.argmin(fleet.loads.outstanding[pair])])
        assert p2.route(0, 0.0) == best


def test_errors_name_the_bad_part() -> None:
    assert {"round-robin", "random", "session", "least-loaded", "power-of-two"} <= set(registered())
    with pytest.raises(ConfigError, match="unknown router 'nearest'; known:"):
        make_router("nearest")
    with pytest.raises(ConfigError, match="has no parameter 'sed'; it takes: seed"):
        make_router("random:sed=1")
    with pytest.raises(ConfigError, match="by must be one of requests, tokens"):
        make_router("least-loaded:by=bytes")
    with pytest.raises(ConfigError, match="replicas must be an integer >= 1, got 0"):
        FleetConfig(0).validate()
    cfg = EngineConfig(capacity_blocks=400, block_tokens=16)
    with pytest.raises(ConfigError, match="knows the future of the whole trace"):
        simulate_fleet(_sessions(5), "opt", cfg, FleetConfig(2), TIMING)


def test_command_line_runs_a_fleet(tmp_path: Path) -> None:
    from prefixlab.workload.loaders.write import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(_sessions(20), path)
    args = ["simulate", str(path), "-p", "lru", "--block-tokens", "16"]
    args += ["--capacity-blocks", "20000", "--timing", "power:preset=llama-3.1-8b-h100+tpot:s=0.01"]
    out = CliRunner().invoke(app, [*args, "--replicas", "3", "--router", "session", "--json"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.output)
    assert row["router"] == "session:seed=0" and row["replicas"] == 3
    per = row["per_replica"]
    assert [p["replica"] for p in per] == [0, 1, 2]
    assert sum(p["num_requests"] for p in per) == row["num_requests"]
    assert max(p["num_requests"] for p in per) / row["num_requests"] == row["max_replica_share"]
    one = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)[0]
    assert row["num_requests"] == one["num_requests"]
    assert row["token_hit_ratio"] <= one["token_hit_ratio"]  # sessions share system prompts
    text = CliRunner().invoke(app, [*args, "--replicas", "3", "--router", "session"]).output
    assert "lru: 3 replicas behind session:seed=0; requests: " in text
    bad = CliRunner().invoke(app, [*args, "--replicas", "2", "--router", "nearest"])
    assert bad.exit_code == 2 and "unknown router 'nearest'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_cache_aware_by_hand() -> None:
    """SGLang router's rule: the longest prefix match above cache_threshold, else the
    smallest tree; the least loaded when loads are imbalanced; LRU eviction of the trees."""
    trace = keyed_trace([[1, 2, 3], [1, 2, 4], [5, 6], [1, 2, 3], [7, 8, 9, 10]])
    fleet = _fleet(2, trace)
    ca = make_router("cache-aware:balance_abs_threshold=1")
    ca.bind(fleet)

    def send(r: int, now: float) -> int:
        i = ca.route(r, now)
        ca.routed(r, i, now)
        return i

    assert send(0, 0.0) == 0  # nothing matches; both trees empty: the lowest index
    assert send(1, 1.0) == 0  # 2 of 3 blocks match on replica 0: 0.67 > 0.5
    assert send(2, 2.0) == 1  # no match: replica 1's tree (0 keys) is smaller than 0's (4)
    fleet.loads.outstanding[:] = [3, 1]  # 3 - 1 > 1 and 3 > 1 * 1.0001: imbalanced
    assert send(3, 3.0) == 1  # the least loaded, although replica 0 holds its whole prompt
    fleet.loads.outstanding[:] = [2, 1]  # 2 - 1 = 1: balanced again
    assert send(3, 4.0) == 0
    small = make_router("cache-aware:max_tree_size=2,eviction_interval=10")
    small.bind(_fleet(1, trace))
    first, third = (small.fleet.prompt_keys(r).tolist() for r in (0, 2))
    small.routed(0, 0, 0.0)  # hash ids 1, 2, 3 at t=0
    small.routed(2, 0, 5.0)  # hash ids 5, 6 at t=5
    small.route(1, 9.0)  # before the first cycle (at t=10): nothing evicted
    assert sorted(small.trees[0]) == sorted(first + third)
    small.route(1, 10.0)
    assert sorted(small.trees[0]) == sorted(third)  # the least recently used go


def test_kv_aware_by_hand() -> None:
    """Dynamo's cost: overlap_score_weight x prefill blocks + decode blocks, from the
    replicas' KV events as seen ``event_delay`` seconds late."""
    trace = keyed_trace([[1, 2, 3], [1, 2, 3], [5, 6], [1, 2, 3]])
    fleet = _fleet(2, trace)
    kv = make_router("kv-aware:event_delay=5")
    kv.bind(fleet)
    keys = fleet.prompt_keys(0)
    kv.kv_event(1, keys, True, 0.0)  # replica 1 stored request 0's three blocks at t=0
    # Not seen yet at t=3: equal costs (3 + 1/16 prefill blocks, 4 decode blocks each).
    assert kv.costs(1, 3.0).tolist() == [49 / 16 + 4, 49 / 16 + 4]
    assert kv.route(1, 3.0) == 0
    # Seen at t=5: replica 1 has 3 blocks of it, 1 token left to prefill.
    assert kv.costs(1, 5.0).tolist() == [49 / 16 + 4, 1 / 16 + 4]
    assert kv.route(1, 5.0) == 1
    kv.routed(1, 1, 5.0)  # it now counts on replica 1: 1 token to prefill, 3 active blocks
    assert kv.costs(2, 6.0).tolist() == [33 / 16 + 3, 1 / 16 + 33 / 16 + 3 + 3]
    kv.answered(1, 1, 7.0)
    kv.finished(1, 1, 8.0)
    assert kv.costs(2, 8.0).tolist() == [33 / 16 + 3, 33 / 16 + 3]
    kv.kv_event(1, keys[2:], False, 8.0)  # block 3 dropped: overlap 2 once seen
    assert kv.costs(3, 13.0).tolist() == [49 / 16 + 4, 17 / 16 + 4]
    # Weight 0: the prompt's cache is ignored, load decides.
    flat = make_router("kv-aware:overlap_score_weight=0")
    flat.bind(_fleet(2, trace))
    flat.kv_event(1, keys, True, 0.0)
    flat.routed(2, 1, 0.0)
    assert flat.route(0, 1.0) == 0


def test_prompt_aware_routers_reuse_more_than_round_robin() -> None:
    trace = _sessions(80)
    cfg = EngineConfig(capacity_blocks=3000, block_tokens=16)
    ratio = {}
    for router in ("round-robin", "cache-aware", "kv-aware"):
        res = simulate_fleet(trace, "lru", cfg, FleetConfig(4, router), TIMING)
        ratio[router] = res.engine.metrics["token_hit_ratio"]
    assert ratio["cache-aware"] > ratio["round-robin"] and ratio["kv-aware"] > ratio["round-robin"]


# ------------------------------------------------------------------ routed ahead, compiled
SPLIT_CASES = [
    ("round-robin", "block", "lru", {}),
    ("round-robin", "radix", "lru", {}),
    ("random:seed=2", "block", "s3fifo", {}),
    ("random:seed=2", "block", "opt-online", {}),
    ("session", "block", "arc", {"closed_loop": True}),
    ("session", "radix", "lru", {"gated": True}),
    ("session", "block", "unicache", {}),
]


def _same_fleets(a: FleetResult, b: FleetResult) -> None:
    da, db = a.as_dict(), b.as_dict()
    da.pop("elapsed_s"), db.pop("elapsed_s")
    assert da == db
    for name in ("arrival_s", "scheduled_s", "first_token_s", "finish_s", "hit_tokens"):
        assert np.array_equal(getattr(a.engine, name), getattr(b.engine, name)), name
    assert np.array_equal(a.engine.num_preemptions, b.engine.num_preemptions)
    assert np.array_equal(a.replica, b.replica)


ROUTED_CASES = [
    ("least-loaded", "block", "lru", {}),
    ("least-loaded:by=tokens", "radix", "lru", {}),
    ("power-of-two:seed=1", "block", "s3fifo", {"closed_loop": True}),
    ("power-of-two:seed=4", "radix", "sglang-lru", {"gated": True}),
    ("cache-aware", "block", "arc", {}),
    # a tree bound and a cycle short enough to evict, a threshold low enough to follow it
    ("cache-aware:max_tree_size=40,eviction_interval=2,cache_threshold=0.2", "radix", "lru", {}),
    ("cache-aware:balance_abs_threshold=2", "block", "opt-online", {"closed_loop": True}),
    ("least-loaded", "block", "unicache", {}),
    ("round-robin", "block", "lru", {"closed_loop": True}),  # the order waits on answers
    ("random:seed=3", "radix", "lru", {"gated": True}),
    ("kv-aware", "block", "lru", {}),
    ("kv-aware:overlap_score_weight=2", "block", "s3fifo", {"closed_loop": True}),
    ("kv-aware:overlap_score_weight=0.5", "block", "vllm", {"gated": True}),
]


@pytest.mark.parametrize(
    ("router", "structure", "policy", "loop", "ahead"),
    [(*c, True) for c in SPLIT_CASES] + [(*c, False) for c in ROUTED_CASES],
)
def test_fleets_compiled_are_the_reference_fleet(
    router: str, structure: str, policy: str, loop: dict[str, bool], ahead: bool
) -> None:
    """A router that reads nothing of the replicas routes ahead and each replica runs apart
    on the compiled engine (``ahead``); least-loaded, power-of-two and cache-aware (and
    round-robin and random in a closed loop) run on the fleet kernel, all replicas on one
    clock. Either way every request's times, hits and replica, every figure and every
    replica's row are the reference loop's (a pool small enough to evict and preempt)."""
    trace = generate_sessions(num_sessions=60, seed=3, session_rate_per_s=4.0)
    cfg = EngineConfig(capacity_blocks=600, block_tokens=16, structure=structure, **loop)
    fleet = FleetConfig(3, router)
    layout = trace.block_layout(16)
    pol, bound = make_policy(policy, structure), make_router(router)
    bound.bind(Fleet(3, trace, layout, Loads.empty(3)))
    assert split_applies(trace, pol, cfg, layout, bound, TIMING) is ahead
    assert ahead or routed_applies(trace, pol, cfg, layout, bound, TIMING, 3)
    fast = simulate_fleet(trace, policy, cfg, fleet, TIMING)
    ref = simulate_fleet(trace, policy, cfg, fleet, TIMING, fast=False)
    _same_fleets(fast, ref)
    assert ref.engine.metrics["num_evictions"] > 0
    assert len(set(fast.replica.tolist())) == 3


def test_hybrid_fleets_compiled_are_the_reference_fleet() -> None:
    trace = GENERATORS["mix"].fn(trace=3, num_requests=120)
    cfg = EngineConfig(
        capacity_blocks=1,
        structure="hybrid",
        capacity_bytes=3 * 10**9,
        model="marconi-hybrid-7b",
    )
    for router in ("random", "least-loaded"):  # routed ahead; on the fleet kernel
        for n, policy in ((2, "marconi:alpha=1"), (1, "marconi")):  # tuned: its alphas too
            fleet = FleetConfig(n, router)
            fast = simulate_fleet(trace, policy, cfg, fleet, TIMING)
            _same_fleets(fast, simulate_fleet(trace, policy, cfg, fleet, TIMING, fast=False))
            assert n == 1 or len(set(fast.replica.tolist())) == 2
        assert "alpha_history" in fast.engine.metrics


@pytest.mark.parametrize(
    ("router", "loop", "tiers"),
    [
        ("least-loaded", {}, ()),  # reads the loads
        ("kv-aware", {}, ()),  # reads KV events (at once: the replicas' key tables)
        ("kv-aware:event_delay=0.5", {}, ()),  # late: events kept, the reference loop's
        ("kv-aware:router_temperature=0.1", {}, ()),  # draws by the costs: the same
        ("round-robin", {"closed_loop": True}, ()),  # the order waits on the answers
        ("session", {}, ("cpu:blocks=500",)),  # tiers: the reference loop's
    ],
)
def test_routers_that_read_the_replicas_route_as_the_run_goes(
    router: str, loop: dict[str, bool], tiers: tuple[str, ...]
) -> None:
    trace = _sessions(10)
    cfg = EngineConfig(
        capacity_blocks=600,
        block_tokens=16,
        tiers=tuple(tier_of(t, None, 16) for t in tiers),
        **loop,
    )
    layout = trace.block_layout(16)
    bound = make_router(router)
    bound.bind(Fleet(2, trace, layout, Loads.empty(2)))
    pol = make_policy("lru", "block")
    assert not split_applies(trace, pol, cfg, layout, bound, TIMING)
    # the loads, a closed loop's order and KV events seen at once on the fleet kernel
    compiled = router in ("least-loaded", "round-robin", "kv-aware")
    assert routed_applies(trace, pol, cfg, layout, bound, TIMING, 2) is compiled
    if router == "kv-aware":  # from the block structure's key table only
        radix = dataclasses.replace(cfg, structure="radix")
        lru = make_policy("lru", "radix")
        assert not routed_applies(trace, lru, radix, layout, bound, TIMING, 2)


def test_routed_ahead_refuses_the_earliest_request_too_big_as_the_reference() -> None:
    """Requests too big for the pool on two replicas: the error names the one that
    arrived first, as the reference loop (one clock for all) raises it."""
    trace = _sessions(30)
    big = sorted(range(len(trace)), key=lambda r: -int(trace.input_length[r]))[:6]
    cap = -(-int(min(trace.input_length[big] + trace.output_length[big])) // 16) - 1
    cfg = EngineConfig(capacity_blocks=cap, block_tokens=16)
    # and two at one instant (requests 2 and 3, on replicas 2 and 0): the first scheduled
    tied = keyed_trace([[1], [2], [3, 4, 5, 6], [7, 8, 9, 10]], [0.0, 0.0, 1.0, 1.0])
    for tr, c in ((trace, cfg), (tied, EngineConfig(capacity_blocks=3, block_tokens=16))):
        messages = []
        for fast in (True, False):
            with pytest.raises(CapacityError) as exc:
                simulate_fleet(tr, "lru", c, FleetConfig(3, "round-robin"), TIMING, fast=fast)
            messages.append(str(exc.value))
        assert messages[0] == messages[1]
    assert messages[0].startswith("request 2 ")


def test_cache_aware_compiled_evicts_its_trees_as_the_router() -> None:
    """The compiled cache-aware router's trees, after a run with evictions due, hold the
    keys the Python router's hold (their eviction order: least recent, deepest first,
    then insertion)."""
    from prefixlab.routers._compiled import evict_due, route_one, routed_one
    from prefixlab.runner.fleet_routed import _router_args

    trace = generate_sessions(num_sessions=30, seed=5, session_rate_per_s=4.0)
    layout = trace.block_layout(16)
    spec = "cache-aware:max_tree_size=25,eviction_interval=1.5,cache_threshold=0.3"
    py, cc = make_router(spec), make_router(spec)
    for r in (py, cc):
        r.bind(Fleet(3, trace, layout, Loads.empty(3)))
    code, par, pairs, trees, nxt, _ = _router_args(cc, len(trace), [])
    loads = np.zeros(3, np.int64)
    evicted = 0
    for r in np.argsort(trace.arrival_s, kind="stable").tolist():
        now = float(trace.arrival_s[r])
        keys = py.fleet.prompt_keys(r)
        a = py.route(r, now)
        sizes = [len(t) for t in trees]
        evict_due(code, par, trees, nxt, now)
        evicted += sum(sizes) - sum(len(t) for t in trees)
        b = route_one(code, par, 0, now, loads, loads, pairs, trees, keys, 0, keys.shape[0])
        assert a == b
        py.routed(r, a, now)
        routed_one(code, trees, b, keys, 0, keys.shape[0], now)
        assert [list(t) for t in py.trees] == [list(t) for t in trees]  # type: ignore[attr-defined]
    assert evicted > 0


@pytest.mark.parametrize("router", ["least-loaded", "power-of-two:seed=2", "cache-aware"])
def test_fleet_kernel_orders_ties_as_the_reference(router: str) -> None:
    """Whole-second arrivals and whole-second steps: step ends, arrivals and step starts
    fall on the same instants, on several replicas at once; the fleet kernel still gives
    the reference loop's every time and replica (step ends first, in the order the steps
    started; then arrivals in order; then idle replicas by index)."""
    timing = make_timing("power:a=0.01,b=1,c=1+tpot:s=1")  # 100 tokens -> 1 s; decode 1 s
    trace = _fixed_prompts(400, 1.5, seed=1)
    trace.arrival_s[:] = np.floor(trace.arrival_s)
    trace.output_length[:] = 2
    cfg = EngineConfig(capacity_blocks=64, max_num_seqs=2)
    fleet = FleetConfig(3, router)
    fast = simulate_fleet(trace, "lru", cfg, fleet, timing)
    _same_fleets(fast, simulate_fleet(trace, "lru", cfg, fleet, timing, fast=False))
    ends = fast.engine.finish_s
    assert len(set(ends.tolist())) < 0.6 * len(trace)  # ties, many
    assert np.isin(ends, trace.arrival_s).sum() > 50  # and at arrival instants


def test_fleet_kernel_refuses_only_replicas_whose_rows_per_key_do_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no room for rows per key of the trace, the fleet kernel still runs the
    policies that keep none (their block structures map keys through a table sized by
    capacity; the radix tree and the hybrid cache are sized by capacity), and leaves an
    array-state policy (a row per key in each replica) to the reference loop."""
    import prefixlab.runner.fleet_routed as routed

    trace = _sessions(10)
    layout = trace.block_layout(16)
    bound = make_router("least-loaded")
    bound.bind(Fleet(2, trace, layout, Loads.empty(2)))
    hybrid = EngineConfig(
        capacity_blocks=1, structure="hybrid", capacity_bytes=3 * 10**9, model="marconi-hybrid-7b"
    )
    cases = [
        ("lru", EngineConfig(capacity_blocks=600, block_tokens=16), True),
        ("arc", EngineConfig(capacity_blocks=600, block_tokens=16), False),
        ("lru", EngineConfig(capacity_blocks=600, block_tokens=16, structure="radix"), True),
        ("s3fifo", EngineConfig(capacity_blocks=600, block_tokens=16, structure="radix"), False),
        ("marconi:alpha=1", hybrid, True),
    ]
    for spec, cfg, fits in cases:
        pol = make_policy(spec, cfg.structure)
        assert routed_applies(trace, pol, cfg, layout, bound, TIMING, 2)
        monkeypatch.setattr(routed, "KEY_ROWS_BUDGET", 0)
        assert routed_applies(trace, pol, cfg, layout, bound, TIMING, 2) is fits, spec
        monkeypatch.undo()
