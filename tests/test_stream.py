"""Streamed replay (``runner.stream``): a trace read in chunks gives exactly the whole-trace
replay's results, with state that follows the cache, not the trace.

Three layers: the block kernel on raw 64-bit keys (hand-computed victims, the table's
invariant, and a property test against the same kernel on dense ids), ``replay_stream`` on
traces cut into chunks against ``replay``, and ``prefixlab replay`` streaming a Mooncake
file against ``--no-stream`` (fallbacks, errors, memory).
"""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab._jit import COMPILED
from prefixlab.cli.main import app
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.policies import make_policy
from prefixlab.policies._arrays import ABASE, SC
from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.lpc import LPCOracle
from prefixlab.policies.unicache import UniCache
from prefixlab.policies.workload_aware import WorkloadAware
from prefixlab.runner import _fast, replay, stream
from prefixlab.runner.replay import ReplayConfig
from prefixlab.runner.stream import read_ahead, replay_stream, streamable
from prefixlab.workload import Request, Trace
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.loaders._columnar import iter_mooncake_chunks
from prefixlab.workload.loaders.base import LoadOptions, NotStreamable
from tests.test_fast import TRACES  # chat, agentic, and one heavy in duplicate holders

pytestmark = pytest.mark.skipif(not _fast.HAVE_NUMBA, reason="numba (the 'fast' extra) absent")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake"
STREAMED = [
    "vllm",
    "lru",
    "fifo",
    "sieve",
    "sglang-lru",
    "hashtable",
    "lfu",
    "mru",
    "arc",
    "s3fifo",
    "lecar",
    "s3fifo:small_ratio=0.3,move_to_main_threshold=2",
    "lecar:seed=3",
    "opt",
]
#: streamed on the radix structure too
RADIX_STREAMED = [
    "lru",
    "fifo",
    "sieve",
    "lfu",
    "mru",
    "sglang-lru",
    "hashtable",
    "lpc-oracle",
    "arc",
    "s3fifo",
    "lecar",
    "s3fifo:small_ratio=0.3,move_to_main_threshold=2",
    "lecar:seed=3",
    "opt",
]
#: policies that read the trace's own columns (task labels, sessions, arrivals): streamed
#: with each chunk's columns (UniCache) or after a pass over the whole trace (WA's
#: profiling window, LPC's oracle labels)
READERS = [
    "wa",
    "wa-atc25",
    "wa-atc25:window_s=5,max_turn=2,min_samples=5",
    "unicache",
    "unicache:stage2=false,offset=request,alg2=clip-ehat,hits=cumulative,update_every=3",
    "unicache:offset=cached,fit=given",
    "lpc-oracle",
]
runner = CliRunner()


class OldestShallowFirst(KeyedPolicy):
    """A third-party keyed policy (its sort key alone): the kernel's heap, streamed."""

    name = "test-oldest-shallow"
    sort_key = (("created", 1), ("depth", 1))


# ----------------------------------------------------------------------------- the kernel
def _run_kernel(
    keys: np.ndarray,
    offs: np.ndarray,
    nl: np.ndarray,
    held: np.ndarray,
    capacity: int,
    code: int,
    raw: bool,
    splits: tuple[int, ...] = (),
) -> tuple[np.ndarray, int, tuple[Any, ...]]:
    """Hit blocks per request and evictions; ``splits``: call the kernel once per piece."""
    n = offs.shape[0] - 1
    if raw:
        state = _fast.kernel_state(capacity, 1, code, n + 1, raw_keys=True)
    else:
        state = _fast.kernel_state(capacity, int(keys.max(initial=0)) + 1, code, n + 1)
    hit_blocks = np.zeros(n, np.int64)
    out = np.zeros(2, np.int64)
    ph = (np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    cols, signs = np.full(3, -1, np.int64), np.ones(3, np.float64)
    if code == _fast.KEYED:
        cols, signs = np.array([3, 2, -1]), np.array([1.0, 1.0, 1.0])  # created, depth
    dummy = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.float64)
    bounds = [0, *splits, n]
    for a, b in itertools.pairwise(bounds):
        sub = offs[a : b + 1]
        ht = np.zeros(b - a, np.int64)
        hb = np.zeros(b - a, np.int64)
        _fast.block_kernel(
            state,
            np.ascontiguousarray(keys[sub[0] : sub[-1]]),
            sub - sub[0],
            nl[a:b],
            nl[a:b] * 4,
            held[a:b],
            a,
            capacity,
            4,
            code,
            -1,
            cols,
            signs,
            *ph,
            *dummy,
            -1,
            np.random.default_rng(0),
            np.zeros((1, 0)),
            ht,
            hb,
            out,
        )
        assert out[1] == -1
        hit_blocks[a:b] = hb
    return hit_blocks, int(out[0]), state


def _table_holds_cached_keys(state: tuple[Any, ...]) -> None:
    """Invariant: the table maps exactly the keys some block holds, each to its slot."""
    bkey, chains, ktab, skey, sfree, sc = (
        state[4],
        state[5],
        state[24],
        state[25],
        state[26],
        state[23],
    )
    used = ktab[ktab[:, 1] >= 0]
    held_slots = {int(k) for k in bkey if k >= 0}
    assert {int(s) for s in used[:, 1]} == held_slots
    for key, slot in used:
        assert skey[slot] == key and chains[0, slot] >= 0
    free = {int(s) for s in sfree[: sc[4]]}
    assert free.isdisjoint(held_slots) and len(free) + len(held_slots) == bkey.shape[0]


def test_raw_keys_by_hand() -> None:
    """Two blocks, lru. r0 [A B] misses both; r1 [A C] hits A, evicts B (A was touched);
    r2 [B] misses and evicts A (C is newer); r3 [C] hits. A and B share their low 63 bits
    (A >= 2**63 is negative as int64), C its low 40."""
    a, b, c = np.uint64(2**63 + 5), np.uint64(5), np.uint64(2**40 + 5)
    keys = np.array([a, b, a, c, b, c], np.uint64).view(np.int64)
    offs = np.array([0, 2, 4, 5, 6])
    nl = np.array([2, 2, 1, 1])
    held = nl.copy()
    hits, evictions, state = _run_kernel(keys, offs, nl, held, 2, _fast.LRU, raw=True)
    assert hits.tolist() == [0, 1, 0, 1]
    assert evictions == 2
    _table_holds_cached_keys(state)
    cached = {int(state[25][k]) for k in state[4] if k >= 0}
    assert cached == {int(np.int64(b.astype(np.int64))), int(c)}


def _dense(keys: np.ndarray) -> np.ndarray:
    return np.unique(keys, return_inverse=True)[1].astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(0, 11), min_size=0, max_size=6, unique=True),
        min_size=1,
        max_size=40,
    ),
    st.integers(6, 12),
    st.sampled_from(
        [
            _fast.VLLM,
            _fast.LRU,
            _fast.FIFO,
            _fast.SIEVE,
            _fast.LFU_LISTS,
            _fast.MRU_STACK,
            _fast.KEYED,
        ]
    ),
    st.integers(0, 40),
)
def test_raw_keys_equal_dense_ids(
    requests: list[list[int]], capacity: int, code: int, split: int
) -> None:
    """Property: on any request stream, raw 64-bit keys (colliding in their low bits, in
    chunks) give the dense-id kernel's hits and evictions, and the table keeps its
    invariant."""
    pool = (np.arange(12, dtype=np.uint64) << np.uint64(52)) | np.uint64(7)  # same low bits
    lens = np.array([len(r) for r in requests])
    offs = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    flat = np.array([k for r in requests for k in r], np.int64)
    raw = pool[flat].view(np.int64) if flat.size else np.zeros(0, np.int64)
    nl = lens.astype(np.int64)
    held = np.maximum(nl, 1)
    n = len(requests)
    splits = (split,) if 0 < split < n else ()
    want = _run_kernel(_dense(raw) if raw.size else raw, offs, nl, held, capacity, code, False)
    got = _run_kernel(raw, offs, nl, held, capacity, code, True, splits)
    assert got[0].tolist() == want[0].tolist()
    assert got[1] == want[1]
    _table_holds_cached_keys(got[2])


# ----------------------------------------------------------------------------- replay_stream
def _chunks(trace: Trace, size: int) -> Iterator[tuple[Trace, int]]:
    for a in range(0, len(trace), size):
        yield trace.take(np.arange(a, min(a + size, len(trace)))), a


CONFIGS = {
    "tight": {"scale": 1.05},
    "roomy": {"scale": 2.5},
    "bounded": {"scale": 2.5, "max_free_blocks": 4},
    "partial": {"scale": 1.5, "cache_partial": True, "min_recompute_tokens": 0},
    "no-prefix-caching": {"scale": 1.5, "prefix_caching": False},
}


@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("conf", sorted(CONFIGS))
@pytest.mark.parametrize(
    "policy", [*STREAMED, *READERS, "custom", "custom-next-use", "nearest-use"]
)
def test_stream_equals_whole_replay(name: str, conf: str, policy: str) -> None:
    trace, bt = TRACES[name]
    kw = dict(CONFIGS[conf])
    scale = float(kw.pop("scale"))
    held = trace.block_layout(bt).num_blocks_held
    cfg = ReplayConfig(capacity_blocks=int(held.max() * scale) + 1, block_tokens=bt, **kw)

    def make() -> Any:
        if policy == "nearest-use":
            return NearestUseFirst()
        if policy.startswith("custom"):
            return NextUseFirst() if policy == "custom-next-use" else OldestShallowFirst()
        return make_policy(policy)

    want = replay(trace, make(), cfg)
    got, seen = replay_stream(_chunks(trace, 37), [make()], cfg)
    assert got[0].metrics == want.metrics
    assert got[0].num_blocks_processed == want.num_blocks_processed
    assert seen.num_requests == len(trace)
    assert seen.num_input_tokens == int(trace.input_length.sum())


def _watch(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    calls: dict[str, int],
    check: Callable[..., None] | None = None,
) -> None:
    """Count the calls of module.name, and ``check(result, *args)`` after each."""
    real = getattr(module, name)

    def watched(*args: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        out = real(*args)
        if check is not None:
            check(out, *args)
        return out

    monkeypatch.setattr(module, name, watched)


def _swept_stream_equals_whole(
    name: str, policy: str, structure: str, calls: dict[str, int]
) -> None:
    """With no spare slots, over chunks of 23: the whole replay's hits per request, and
    both the sweep and the slot growth ran."""
    trace, bt = TRACES[name]
    held = trace.block_layout(bt).num_blocks_held
    cfg = ReplayConfig(
        capacity_blocks=int(held.max() * 1.5) + 1, block_tokens=bt, structure=structure
    )
    rows: list[np.ndarray] = []
    got, _ = replay_stream(
        _chunks(trace, 23),
        [make_policy(policy, structure)],
        cfg,
        on_rows=lambda i, r0, hits, inputs: rows.append(hits.copy()),
    )
    want = replay(trace, make_policy(policy, structure), cfg)
    assert got[0].metrics == want.metrics
    assert np.array_equal(np.concatenate(rows), want.hit_tokens)
    assert len(calls) == 2 and min(calls.values()) > 0, calls


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "lecar"])
@pytest.mark.parametrize("name", sorted(TRACES))
def test_ghost_slots_are_swept_and_added_as_the_stream_needs(
    monkeypatch: pytest.MonkeyPatch, policy: str, name: str
) -> None:
    """With no spare slots, an array-state policy's slots run short chunk after chunk: the
    sweep frees exactly the keys no block holds and no ghost list names (checked after each
    sweep), slots are added when that is not enough, and the results stay the whole
    replay's."""

    def check(free: int, state: Any, ist: Any, ghost_rows: Any, clear_rows: Any) -> None:
        ktab, skey, sfree = state[24], state[25], state[26]
        used = ktab[ktab[:, 1] >= 0]
        for key, slot in used:
            assert skey[slot] == key
            live = state[5][0, slot] >= 0 or any(ist[g, slot] >= 0 for g in ghost_rows)
            assert live, slot
        assert set(sfree[:free].tolist()).isdisjoint(used[:, 1].tolist())
        assert free + used.shape[0] == skey.shape[0]

    calls: dict[str, int] = {}
    monkeypatch.setattr(stream, "FIRST_SPARE_SLOTS", 0)
    _watch(monkeypatch, _fast, "sweep_slots", calls, check)
    _watch(monkeypatch, _fast, "widen_slots", calls)
    _swept_stream_equals_whole(name, policy, "block", calls)


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "lecar"])
@pytest.mark.parametrize("name", sorted(TRACES))
def test_radix_key_slots_are_swept_and_added_as_the_stream_needs(
    monkeypatch: pytest.MonkeyPatch, policy: str, name: str
) -> None:
    """The radix tree's slots, with none spare: the sweep frees exactly the keys no node
    starts with, no ghost list names and no pending ARC mark holds (checked after each
    sweep), slots are added when that is not enough, and the hits per request stay the
    whole replay's."""
    from prefixlab.runner import _fast_radix as R

    def check(free: int, T: Any, P: Any, ist: Any, ghost_rows: Any, clear: Any, keep: Any) -> None:
        ktab, skey, sfree, parent, nkey = T[15], T[16], T[17], T[0], P[16]
        used = ktab[ktab[:, 1] >= 0]
        starts = set(nkey[parent >= 0].tolist())
        for key, slot in used:
            assert skey[slot] == key
            live = (
                slot in starts
                or any(ist[g, slot] >= 0 for g in ghost_rows)
                or any(ist[k, slot] != 0 for k in keep)
            )
            assert live, slot
        for node in np.flatnonzero(parent >= 0):  # a node's slot is its first key's
            assert skey[nkey[node]] == T[14][T[1][node]]
        assert set(sfree[:free].tolist()).isdisjoint(used[:, 1].tolist())
        assert free + used.shape[0] == skey.shape[0] == T[13][R.NSLOTS] + used.shape[0]

    calls: dict[str, int] = {}
    monkeypatch.setattr(stream, "FIRST_SPARE_SLOTS", 0)
    _watch(monkeypatch, R, "sweep", calls, check)
    _watch(monkeypatch, R, "add_slots", calls)
    _swept_stream_equals_whole(name, policy, "radix", calls)


@pytest.mark.parametrize("parallel", [True, False])
def test_several_policies_in_one_pass_equal_one_each(parallel: bool) -> None:
    """On threads (one per policy and chunk) or one after another: each policy's results."""
    trace, bt = TRACES["dups"]
    cfg = ReplayConfig(capacity_blocks=30, block_tokens=bt)
    pols = [make_policy(p) for p in STREAMED]
    together, _ = replay_stream(_chunks(trace, 50), pols, cfg, parallel=parallel)
    for pol, res in zip(STREAMED, together, strict=True):
        assert res.policy == make_policy(pol).spec()
        assert res.metrics == replay(trace, pol, cfg).metrics


def test_parallel_policies_report_the_first_that_cannot_fit() -> None:
    """Every policy fails on the same request; the error names the first policy's, as one
    by one would."""
    trace, bt = TRACES["chat"]
    cfg = ReplayConfig(capacity_blocks=3, block_tokens=bt)
    errors = []
    for parallel in (True, False):
        with pytest.raises(CapacityError) as err:
            pols = [make_policy(p) for p in ("arc", "lru", "lecar")]
            replay_stream(_chunks(trace, 7), pols, cfg, parallel=parallel)
        errors.append(str(err.value))
    assert errors[0] == errors[1]


class NextUseFirst(KeyedPolicy):
    """A third-party keyed policy reading the future (next use, then the oldest): streamed
    with the next-use pass, as OPT is."""

    name = "test-next-use"
    sort_key = (("next_use", -1), ("created", 1))


class NearestUseFirst(KeyedPolicy):
    """Evicts the block needed soonest (a perverse rule, but one that evicts a key's first
    holder before its duplicate holders, which are never used: each promotion re-ranks an
    evictable duplicate by the key's next use, what the stream's notes must give)."""

    name = "test-nearest-use"
    sort_key = (("next_use", 1), ("depth", -1))


def test_a_repeated_key_is_an_error_and_an_empty_stream_a_zero_result() -> None:
    cfg = ReplayConfig(capacity_blocks=30)
    try:
        bad = Trace.from_requests(
            [
                Request(0.0, 32, 1, hash_ids=[1, 2], hashed_tokens=32),
                Request(1.0, 48, 1, hash_ids=[3, 4, 3], hashed_tokens=48),
            ],  # id 3 twice
            block_tokens=16,
        )
    except ConfigError:  # pragma: no cover - the builder may refuse it first
        pytest.skip("the trace builder refuses a repeated id")
    with pytest.raises(ConfigError, match="request 1: a block key appears twice"):
        replay_stream(_chunks(bad, 1), [make_policy("lru")], cfg)
    with pytest.raises(ConfigError, match="appears twice"):
        replay(bad, "lru", cfg)  # the whole replay refuses it too
    got, seen = replay_stream(iter([]), [make_policy("lru"), make_policy("arc")], cfg)
    assert [r.policy for r in got] == ["lru", "arc"]
    assert all(r.metrics["num_requests"] == 0 for r in got) and seen.num_requests == 0


def test_what_cannot_be_streamed() -> None:
    block = ReplayConfig(capacity_blocks=10)
    for spec in ("lru", "arc", "s3fifo", "lecar", "opt", *READERS):
        assert streamable(make_policy(spec), block), spec
    assert streamable(OldestShallowFirst(), block) and streamable(NextUseFirst(), block)
    radix = ReplayConfig(10, structure="radix")
    for spec in RADIX_STREAMED:
        assert streamable(make_policy(spec, "radix"), radix), spec
    assert streamable(OldestShallowFirst(), radix) and streamable(NextUseFirst(), radix)
    # LPC's predictor reads each request's text and its conversation's earlier turns
    assert not streamable(make_policy("lpc:model=m,predictor_bytes=0"), block)
    with pytest.raises(ValueError, match="cannot be streamed"):
        replay_stream(iter([]), [make_policy("lpc:model=m,predictor_bytes=0")], block)


@pytest.mark.parametrize("capacity", [230, 600])
@pytest.mark.parametrize("spec", READERS)
def test_trace_readers_stream_on_the_task_mix(
    monkeypatch: pytest.MonkeyPatch, spec: str, capacity: int
) -> None:
    """Every queue and category in play (chat, agentic, templated and untemplated tasks,
    sessions), chunks of 1, 37 and 100 requests, no spare slots (so the state is swept
    and widened between chunks): per request, the whole replay's hits."""
    monkeypatch.setattr(stream, "FIRST_SPARE_SLOTS", 0)
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=64)
    whole = make_policy(spec)
    want = replay(trace, whole, cfg)
    assert want.metrics["num_evictions"] > 1000
    for size in (1, 37, 100):
        rows: list[np.ndarray] = []

        def keep(i: int, r0: int, hits: np.ndarray, inputs: np.ndarray, rows: Any = rows) -> None:
            rows.append(hits.copy())

        pol = make_policy(spec)
        got, _ = replay_stream(_chunks(trace, size), [pol], cfg, on_rows=keep)
        assert got[0].metrics == want.metrics, size
        assert np.array_equal(np.concatenate(rows), want.hit_tokens), size
        if isinstance(pol, UniCache):  # each update's weights, at its request
            assert pol.weight_history == whole.weight_history, size
            assert len(pol.weight_history) == 300 // pol.update_every


@pytest.mark.parametrize("spec", ["unicache", "lpc-oracle"])
def test_readers_do_not_stream_a_file_whose_arrivals_go_back(spec: str) -> None:
    """The whole replay takes a session's turns in order of arrival, the stream in the
    file's: a file whose arrivals go back (a format that need not sort) is not streamed
    for a policy that reads sessions (the caller loads it whole), for the others it is;
    and an empty stream is a zero result."""
    reqs = [
        Request(t, 32, 1, session_id=s, hash_ids=[i, i + 1], hashed_tokens=32)
        for i, (t, s) in enumerate([(0.0, "a"), (10.0, "b"), (5.0, "b"), (20.0, "a")])
    ]
    trace = Trace.from_requests(reqs, block_tokens=16)
    cfg = ReplayConfig(capacity_blocks=20, block_tokens=16)
    with pytest.raises(NotStreamable, match="arrivals out of order"):
        replay_stream(_chunks(trace, 2), [make_policy(spec)], cfg)
    got, _ = replay_stream(_chunks(trace, 2), [make_policy("lru")], cfg)
    assert got[0].metrics == replay(trace, "lru", cfg).metrics
    got, seen = replay_stream(iter([]), [make_policy(spec), make_policy("wa")], cfg)
    assert seen.num_requests == 0 and all(r.metrics["num_requests"] == 0 for r in got)


def _streamed_columns(pol: ArrayPolicy, trace: Trace, bt: int, size: int) -> np.ndarray:
    """The policy's columns as a streamed replay gives them, chunk by chunk, after its pass
    over the whole trace (``stream_prepare``), concatenated."""
    chunks = [
        (r0, c.block_layout(bt, intern=False), pol.chunk_columns(c, r0))
        for c, r0 in _chunks(trace, size)
    ]
    if pol.streams == "two-pass":
        pol.stream_prepare(lambda forward: iter(chunks if forward else chunks[::-1]), len(trace))
    return np.concatenate([cols for _, _, cols in chunks], axis=1)


@pytest.mark.parametrize(
    "spec",
    [
        "wa",
        "wa-atc25:max_turn=2,profile=0.5",
        "unicache",
        "unicache:tasks=chat:agentic",
        "lpc-oracle",
    ],
)
def test_stream_columns_equal_the_whole_traces(spec: str) -> None:
    """What a trace-reading policy reads per request (arrival, category or queue, prompt
    length, the gap to the session's previous turn, its conversation and oracle label)
    and what WA fits on its profiling window: the same, to the bit, whether the trace
    comes whole or in chunks of any size."""
    trace = GENERATORS["mix"].fn(trace=2, num_requests=300)
    whole = make_policy(spec)
    assert isinstance(whole, ArrayPolicy)
    whole.prepare(trace.block_layout(64))
    whole.prepare_trace(trace, "arrival")
    rows = 4 if isinstance(whole, UniCache) else whole.aux.shape[0]  # then the weights'
    for size in (1, 7, 300):
        pol = make_policy(spec)
        assert isinstance(pol, ArrayPolicy)
        got = _streamed_columns(pol, trace, 64, size)
        assert np.array_equal(got[:rows], whole.aux[:rows], equal_nan=True), size
        if isinstance(pol, WorkloadAware):
            assert pol.names == whole.names and len(pol.names) > 2
            for a, b in zip(pol._fit, whole._fit, strict=True):
                assert a.tobytes() == b.tobytes(), size
    if isinstance(whole, LPCOracle):  # some conversations go on, some end
        assert 0 < whole.aux[1].sum() < len(trace)


def test_unicache_keeps_the_columns_its_hooks_still_read() -> None:
    """UniCache learns the gaps of requests up to the current one when a hook first sees
    it: a chunk whose last requests were not learnt yet keeps their columns for the next
    chunk, whose hooks read request r at column r - I[SC, ABASE]."""
    from prefixlab.policies.unicache import SEEN

    run = stream._start(make_policy("unicache"), ReplayConfig(capacity_blocks=30), 16)
    pol = run.prep.policy
    assert isinstance(pol, UniCache)
    first, second = np.arange(70.0).reshape(7, 10), np.arange(70.0, 140.0).reshape(7, 10)
    assert isinstance(run.prep, _fast.Prepared)
    stream._take_columns(run.prep, first, 0)
    assert run.prep.aux is first and run.prep.ist[SC, ABASE] == 0
    pol.state[0][SC, SEEN] = 7  # requests 8 and 9 not learnt yet
    run.prep.ist = pol.state[0]
    stream._take_columns(run.prep, second, 10)
    assert run.prep.ist[SC, ABASE] == 8 and pol.aux is run.prep.aux
    assert np.array_equal(run.prep.aux, np.concatenate([first[:, 8:], second], axis=1))
    pol.state[0][SC, SEEN] = 19  # all learnt: nothing kept
    stream._take_columns(run.prep, first, 20)
    assert run.prep.ist[SC, ABASE] == 20 and run.prep.aux is first


@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("scale", [1.05, 2.5])
@pytest.mark.parametrize("policy", [*RADIX_STREAMED, "custom"])
def test_radix_stream_equals_whole_replay(name: str, scale: float, policy: str) -> None:
    """The radix tree keeps its own copy of the keys it holds, so a chunk's keys can go
    once it is replayed: per request, the whole replay's hits, in chunks of any size."""
    trace, bt = TRACES[name]
    held = trace.block_layout(bt).num_blocks_held
    cfg = ReplayConfig(
        capacity_blocks=int(held.max() * scale) + 1, block_tokens=bt, structure="radix"
    )

    def make() -> Any:
        return OldestShallowFirst() if policy == "custom" else make_policy(policy, "radix")

    want = replay(trace, make(), cfg)
    assert want.metrics["num_evictions"] > 0
    for size in (1, 37):
        rows: list[np.ndarray] = []

        def keep(i: int, r0: int, hits: np.ndarray, inputs: np.ndarray, rows: Any = rows) -> None:
            rows.append(hits.copy())

        got, _ = replay_stream(_chunks(trace, size), [make()], cfg, on_rows=keep)
        assert got[0].metrics == want.metrics, size
        assert np.array_equal(np.concatenate(rows), want.hit_tokens), size


def _hash_rows_trace(rows: list[list[int]], bt: int = 4) -> Trace:
    return Trace.from_requests(
        [
            Request(
                arrival_s=float(i),
                input_length=bt * len(r),
                output_length=0,
                hash_ids=r,
                hashed_tokens=bt * len(r),
            )
            for i, r in enumerate(rows)
        ],
        block_tokens=bt,
    )


@pytest.mark.parametrize("policy", ["opt", "arc", "s3fifo", "lecar", "custom-next-use"])
def test_radix_stream_equals_whole_replay_with_ids_reused_under_other_parents(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """A hash id under two parents (which loading accepts today): a key's next use is
    noted by key, as the whole replay looks it up, not by its place in the tree (a review
    found request 6 hit 0 tokens streamed against 4 whole when OPT noted by place); then
    random traces over a few ids, chunked anywhere, with no spare slots."""

    monkeypatch.setattr(stream, "FIRST_SPARE_SLOTS", 0)

    def make() -> Any:
        return NextUseFirst() if policy == "custom-next-use" else make_policy(policy, "radix")

    def check(trace: Trace, cfg: ReplayConfig, sizes: tuple[int, ...]) -> None:
        want = replay(trace, make(), cfg)
        for size in sizes:
            rows: list[np.ndarray] = []

            def keep(
                i: int, r0: int, hits: np.ndarray, inputs: np.ndarray, rows: list[np.ndarray] = rows
            ) -> None:
                rows.append(hits.copy())

            replay_stream(_chunks(trace, size), [make()], cfg, on_rows=keep)
            assert np.array_equal(np.concatenate(rows), want.hit_tokens), (size, rows)

    cfg = ReplayConfig(capacity_blocks=5, block_tokens=4, structure="radix", min_recompute_tokens=0)
    check(
        _hash_rows_trace([[1, 2, 5], [1], [1, 2], [3, 2], [9], [9, 8], [3], [1, 2]]), cfg, (1, 3, 6)
    )
    rng = np.random.default_rng(11)
    for _ in range(20):
        rows = [rng.permutation(12)[: rng.integers(1, 6)].tolist() for _ in range(60)]
        check(_hash_rows_trace(rows), cfg, (1, 7))


def _pool_invariant(T: tuple[Any, ...]) -> None:
    """Every live node's keys lie in the pool's current half, below its top, in ranges of
    their own, the first one the node's key in the child table."""
    from prefixlab.runner import _fast_radix as R

    parent, estart, elen, st, pool = T[0], T[1], T[2], T[13], T[14]
    half = pool.shape[0] // 2
    lo = st[R.PEND] - half
    live = [n for n in range(1, parent.shape[0]) if parent[n] >= 0]
    spans = sorted((int(estart[n]), int(estart[n] + elen[n])) for n in live)
    for (_, b), (c, _) in itertools.pairwise(spans):
        assert b <= c
    assert all(lo <= a and b <= st[R.PTOP] for a, b in spans)
    assert sum(b - a for a, b in spans) == st[R.TREE]


@pytest.mark.parametrize("policy", ["lru", "sieve", "lfu"])
def test_the_radix_key_pool_copies_its_live_edges_and_stays_bounded(policy: str) -> None:
    """A small tree over a long trace: its pool fills and is copied to the other half many
    times (checked after every chunk), and the hits stay the generic radix cache's."""
    from prefixlab.runner._fast_radix import RadixPrepared

    trace, bt = TRACES["chat"]
    layout = trace.block_layout(bt)
    capacity = int(layout.num_blocks_held.max()) + 2
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=bt, structure="radix")
    prep = RadixPrepared(make_policy(policy, "radix"), capacity, layout.num_distinct_keys, bt)
    assert prep.T[14].shape[0] == 4 * capacity + 4
    hits = np.zeros(len(trace), np.int64)
    out = np.zeros(2, np.int64)
    offs = layout.key_offsets
    for a in range(0, len(trace), 50):
        b = min(a + 50, len(trace))
        prep.run(
            layout.keys[offs[a] : offs[b]],
            offs[a : b + 1] - offs[a],
            layout.num_lookup_blocks[a:b],
            layout.lookup_end_tokens[a:b],
            layout.num_blocks_held[a:b],
            a,
            None,
            hits[a:b],
            np.zeros(b - a, np.int64),
            out,
        )
        _pool_invariant(prep.T)
    inserted = int(out[0]) + int(prep.T[13][0])  # evicted pages + pages in the tree
    assert inserted > 10 * prep.T[14].shape[0]  # the pool was copied over many times
    want = replay(trace, make_policy(policy, "radix"), cfg, fast=False)
    assert np.array_equal(hits, want.hit_tokens)


def test_stream_capacity_error_names_the_request_as_the_whole_replay_does() -> None:
    trace, bt = TRACES["chat"]
    cfg = ReplayConfig(capacity_blocks=3, block_tokens=bt)
    with pytest.raises(CapacityError) as whole:
        replay(trace, "lru", cfg)
    with pytest.raises(CapacityError) as streamed:
        replay_stream(_chunks(trace, 7), [make_policy("lru")], cfg)
    assert str(streamed.value) == str(whole.value)


def test_read_ahead_keeps_order_raises_where_the_producer_did_and_stops() -> None:
    assert list(read_ahead(iter(range(100)), depth=3)) == list(range(100))

    def bad() -> Iterator[int]:
        yield 1
        raise NotStreamable("line 2")

    got = []
    with pytest.raises(NotStreamable, match="line 2"):
        for x in read_ahead(bad()):
            got.append(x)
    assert got == [1]
    before = threading.active_count()
    it = read_ahead(iter(range(10**9)))
    assert next(it) == 0
    it.close()  # the consumer stops early: the producer thread ends too
    assert threading.active_count() == before


# ----------------------------------------------------------------------------- files and CLI
def _mooncake(path: Path, n: int, seed: int = 0, big_ids: bool = False) -> Path:
    """Sessions whose contexts grow (as benchmarks/load_replay.py writes them)."""
    rng = np.random.default_rng(seed)
    prefix: dict[int, list[int]] = {}
    nxt = 2**63 + 11 if big_ids else 0
    with path.open("w") as fh:
        for i in range(n):
            s = int(rng.integers(0, max(n // 8, 1)))
            grow = int(rng.integers(1, 4))
            ids = prefix.get(s, []) + list(range(nxt, nxt + grow))
            nxt += grow
            prefix[s] = ids[:12]
            row = {
                "timestamp": i * 10,
                "input_length": len(ids) * 512 - int(rng.integers(0, 400)),
                "output_length": int(rng.integers(1, 600)),
                "hash_ids": ids,
            }
            fh.write(json.dumps(row) + "\n")
    return path


needs_compiled = pytest.mark.skipif(not COMPILED, reason="the chunk reader needs numba")


@needs_compiled
@pytest.mark.parametrize("big_ids", [False, True])
@pytest.mark.parametrize(
    "load", [{}, {"limit": 700}, {"start_s": 2.0, "end_s": 9.5}, {"limit": 300, "start_s": 1.0}]
)
def test_chunks_of_a_file_replay_as_the_whole_file(
    tmp_path: Path, big_ids: bool, load: dict[str, Any]
) -> None:
    path = _mooncake(tmp_path / "t.jsonl", 1500, big_ids=big_ids)
    whole = load_trace(path, "mooncake", **load)
    chunks = list(iter_mooncake_chunks(path, 512, LoadOptions(**load), chunk_bytes=4096))
    assert len(chunks) > 3
    assert sum(len(c) for c, _ in chunks) == len(whole)
    assert [c for _, c in chunks] == sorted(c for _, c in chunks)  # bytes read grow
    cfg = ReplayConfig(capacity_blocks=60)
    got, _ = replay_stream(iter(chunks), [make_policy("lru"), make_policy("lfu")], cfg)
    for res, pol in zip(got, ("lru", "lfu"), strict=True):
        assert res.metrics == replay(whole, pol, cfg).metrics


@needs_compiled
def test_the_bundled_trace_streams_as_it_loads() -> None:
    path = SHARED / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip("shared data absent")
    whole = load_trace(path, "mooncake")
    cfg = ReplayConfig(capacity_blocks=3000)
    chunks = iter_mooncake_chunks(path, 512, LoadOptions(), chunk_bytes=1 << 16)
    got, seen = replay_stream(chunks, [make_policy(p) for p in STREAMED], cfg)
    assert seen.num_requests == len(whole) == 12031
    for res, pol in zip(got, STREAMED, strict=True):
        assert res.metrics == replay(whole, pol, cfg).metrics, pol


def _cli(*args: str) -> Any:
    return runner.invoke(app, ["replay", "-f", "mooncake", "--json", *args])


@needs_compiled
@pytest.mark.parametrize("policies", [["lru", "sieve"], ["lru", "opt"], ["arc"]])
def test_cli_streams_or_falls_back_with_the_same_answer(
    tmp_path: Path, policies: list[str]
) -> None:
    path = str(_mooncake(tmp_path / "t.jsonl", 800))
    args = [a for p in policies for a in ("-p", p)] + ["--capacity-blocks", "50", path]
    streamed, whole = _cli(*args), _cli(*args, "--no-stream")
    assert streamed.exit_code == whole.exit_code == 0, streamed.output
    drop = ("elapsed_s", "blocks_per_s")
    rows = [{k: v for k, v in r.items() if k not in drop} for r in json.loads(streamed.stdout)]
    want = [{k: v for k, v in r.items() if k not in drop} for r in json.loads(whole.stdout)]
    assert rows == want


@needs_compiled
def test_unsorted_file_is_not_streamed_but_sorted_whole(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", 400)
    lines = path.read_text().splitlines()
    lines[300], lines[10] = lines[10], lines[300]  # far apart: different chunks
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(NotStreamable, match="order"):
        list(iter_mooncake_chunks(path, 512, LoadOptions(), chunk_bytes=4096))
    res = _cli("-p", "lru", "--capacity-blocks", "50", str(path))
    assert res.exit_code == 0
    want = replay(load_trace(path, "mooncake"), "lru", ReplayConfig(50))
    assert json.loads(res.stdout)[0]["num_hit_tokens"] == want.metrics["num_hit_tokens"]


@needs_compiled
@pytest.mark.parametrize("late", ["unsorted", "bad line"])
def test_a_capacity_error_does_not_hide_a_late_reason_to_load_whole(
    tmp_path: Path, late: str
) -> None:
    """A request too big for the cache early in the file, and late in it a line the chunk
    reader does not accept: the answer is the whole load's (a sorted request index, or the
    bad line), not the stream's."""
    path = _mooncake(tmp_path / "t.jsonl", 3000)
    lines = path.read_text().splitlines()
    row = json.loads(lines[50])
    row["hash_ids"] = list(range(10**9, 10**9 + 30))
    row["input_length"] = 30 * 512
    lines[50] = json.dumps(row)
    if late == "unsorted":
        lines[2500] = lines[2500].replace('"timestamp": 25000', '"timestamp": 5')
    else:
        lines[2500] = lines[2500].replace('"output_length"', '"output_length": "x", "o"')
    path.write_text("\n".join(lines) + "\n")
    args = ("-p", "lru", "--capacity-blocks", "20", str(path))
    streamed, whole = _cli(*args), _cli(*args, "--no-stream")
    assert streamed.exit_code == whole.exit_code == 2
    assert streamed.output == whole.output
    assert ("request 51 needs" if late == "unsorted" else "t.jsonl:2501:") in streamed.output


@needs_compiled
def test_a_bad_line_late_in_the_file_is_named(tmp_path: Path) -> None:
    path = _mooncake(tmp_path / "t.jsonl", 3000)
    lines = path.read_text().splitlines()
    lines[2500] = lines[2500].replace('"output_length"', '"output_length": "x", "o"')
    path.write_text("\n".join(lines) + "\n")
    res = _cli("-p", "lru", "--capacity-blocks", "50", str(path))
    assert res.exit_code == 2
    assert "t.jsonl:2501:" in res.output and "output_length" in res.output


@needs_compiled
def test_stream_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    """numpy buffers are traced: the peak over a 16x longer trace stays within 15%, where
    the whole-trace replay's grows with the trace. A 20,000-block cache and 16 KB chunks,
    so that the cache's state, not the chunks in flight between the reading thread and the
    replay (one to four, as the threads are scheduled), sets the peak."""
    small = _mooncake(tmp_path / "s.jsonl", 3000, seed=1)
    large = _mooncake(tmp_path / "l.jsonl", 48000, seed=1)
    cfg = ReplayConfig(capacity_blocks=20_000)

    def peak(path: Path, stream: bool) -> int:
        tracemalloc.start()
        try:
            if stream:
                chunks = iter_mooncake_chunks(path, 512, LoadOptions(), chunk_bytes=1 << 14)
                replay_stream(chunks, [make_policy("lru")], cfg)
            else:
                replay(load_trace(path, "mooncake"), "lru", cfg)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak(small, True)  # compile / load outside the measurement
    s, big = peak(small, True), peak(large, True)
    assert big < 1.15 * s, (s, big)
    assert peak(large, False) > 3 * peak(small, False)


DOCS_EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "workloads" / "examples"


@needs_compiled
@pytest.mark.parametrize(
    ("name", "fmt", "extra"),
    [
        ("native.jsonl", "native", ["--block-tokens", "16"]),
        ("trace.parquet", "native", ["--block-tokens", "16"]),
        ("hash.jsonl", "native", []),
        ("moon.jsonl", "mooncake", ["--sample", "0.5"]),
        ("bailian_sample.jsonl", "bailian", []),
        # sessions one after another with synthesised times: sorted whole, not streamed
        ("sharegpt_sample.json", "sharegpt", ["--block-tokens", "16"]),
    ],
)
def test_every_format_streams_through_its_loader_as_it_loads_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, fmt: str, extra: list[str]
) -> None:
    """Formats without a chunked reader stream through their own loader, a few requests per
    chunk here: the same answers as loading them whole. A format whose requests must be
    sorted first is loaded whole as soon as an arrival goes back."""
    from prefixlab.workload.loaders import base
    from prefixlab.workload.loaders.native import write_native
    from prefixlab.workload.loaders.parquet import write_parquet
    from prefixlab.workload.trace import to_hash_form

    monkeypatch.setattr(base, "CHUNK_REQUESTS", 7)
    trace, _ = TRACES["chat"]
    path = tmp_path / name
    if name == "native.jsonl":
        write_native(trace, path)
    elif name == "trace.parquet":
        write_parquet(trace, path)
    elif name == "hash.jsonl":
        write_native(to_hash_form(trace, 16), path)
    elif name == "moon.jsonl":
        _mooncake(path, 300)
    else:
        path = DOCS_EXAMPLES / name
    calls = []
    real = stream.replay_stream
    monkeypatch.setattr(
        "prefixlab.cli.replay.replay_stream", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    readers = ["-p", "wa-atc25", "-p", "unicache", "-p", "lpc-oracle"]  # sessions, tasks, times
    args = [
        "replay",
        "-f",
        fmt,
        "--json",
        "-p",
        "lru",
        "-p",
        "arc",
        *readers,
        "--capacity-blocks",
        "2000",
        *extra,
        str(path),
    ]
    streamed = runner.invoke(app, args)
    whole = runner.invoke(app, [*args, "--no-stream"])
    assert streamed.exit_code == whole.exit_code == 0, streamed.output
    if fmt != "sharegpt":
        assert calls == [1], "it did not stream"
    drop = ("elapsed_s", "blocks_per_s")
    got = [{k: v for k, v in r.items() if k not in drop} for r in json.loads(streamed.stdout)]
    want = [{k: v for k, v in r.items() if k not in drop} for r in json.loads(whole.stdout)]
    assert got == want


@needs_compiled
@pytest.mark.parametrize("policies", [["lru"], ["lru", "arc", "s3fifo:small_ratio=0.2"]])
def test_per_request_files_stream_chunk_by_chunk_as_the_whole_load_writes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policies: list[str]
) -> None:
    """``--per-request`` no longer forces a whole load: each chunk's rows are appended as
    it is replayed (7 requests a chunk here), and the files equal, byte for byte, the
    ones the whole-trace replay writes; no temp file is left beside them."""
    from prefixlab.workload.loaders import base

    monkeypatch.setattr(base, "CHUNK_REQUESTS", 7)
    trace, _ = TRACES["chat"]
    path = tmp_path / "t.jsonl"
    from prefixlab.workload.loaders.native import write_native

    write_native(trace, path)
    calls: list[int] = []
    real = stream.replay_stream
    monkeypatch.setattr(
        "prefixlab.cli.replay.replay_stream", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    (tmp_path / "s").mkdir()
    (tmp_path / "w").mkdir()
    args = [a for p in policies for a in ("-p", p)] + [
        "--capacity-blocks",
        "2000",
        "--block-tokens",
        "16",
        str(path),
    ]
    s = runner.invoke(app, ["replay", "--per-request", str(tmp_path / "s" / "r.csv"), *args])
    w = runner.invoke(
        app, ["replay", "--per-request", str(tmp_path / "w" / "r.csv"), *args, "--no-stream"]
    )
    assert s.exit_code == w.exit_code == 0, s.output
    assert calls == [1], "it did not stream"
    got = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert got == sorted(p.name for p in (tmp_path / "w").iterdir())
    assert len(got) == len(policies) and not any(n.startswith(".") for n in got)
    for name in got:
        text = (tmp_path / "s" / name).read_bytes()
        assert text == (tmp_path / "w" / name).read_bytes()
        assert text.count(b"\n") == len(trace) + 1  # the header and one row per request


@needs_compiled
def test_a_stream_that_fails_late_leaves_no_per_request_file(tmp_path: Path) -> None:
    """A bad line late in the file: the streamed run's rows so far are dropped with their
    temp file, and the whole load names the line; nothing is written."""
    path = _mooncake(tmp_path / "t.jsonl", 3000)
    lines = path.read_text().splitlines()
    lines[2500] = lines[2500].replace('"output_length"', '"output_length": "x", "o"')
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    res = _cli(
        "-p", "lru", "--capacity-blocks", "50", "--per-request", str(out / "r.csv"), str(path)
    )
    assert res.exit_code == 2 and "t.jsonl:2501:" in res.output
    assert list(out.iterdir()) == []


@needs_compiled
def test_stream_rows_cover_every_request_once_in_order() -> None:
    """``on_rows`` gets each chunk's rows, in order, for each policy: together they are the
    whole replay's per-request hits."""
    trace, _ = TRACES["agentic"]
    config = ReplayConfig(capacity_blocks=1500, block_tokens=16)
    got: dict[int, list[tuple[int, list[int], list[int]]]] = {0: [], 1: []}
    pols = [make_policy("lru"), make_policy("lecar")]
    pieces = [
        (trace.take(np.arange(i, min(i + 9, len(trace)))), 0) for i in range(0, len(trace), 9)
    ]
    replay_stream(
        iter(pieces),
        pols,
        config,
        on_rows=lambda i, r0, h, n: got[i].append((r0, h.tolist(), n.tolist())),
    )
    for i, name in enumerate(["lru", "lecar"]):
        want = replay(trace, name, config)
        assert [r0 for r0, _, _ in got[i]] == list(range(0, len(trace), 9))
        assert [x for _, h, _ in got[i] for x in h] == want.hit_tokens.tolist()
        assert [x for _, _, n in got[i] for x in n] == want.input_tokens.tolist()


@settings(max_examples=150, deadline=None)
@example(  # a promoted duplicate's rank needs the note of the lookup that missed it
    [
        ([9, 0, 1, 2], 0),
        ([0], 0),
        ([0], 0),
        ([0], 0),
        ([0, 1, 2], 0),
        ([3, 2, 0], 0),
        ([0], 0),
        ([0, 9, 1], 0),
    ],
    5,
    1,
    "nearest-use",
)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True), st.integers(0, 40)
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 6),
    st.integers(1, 8),
    st.sampled_from(["opt", "custom-next-use", "nearest-use"]),
)
def test_streamed_next_use_equals_whole_replay_on_any_stream(
    rows: list[tuple[list[int], int]], spare: int, chunk: int, policy: str
) -> None:
    """Property: OPT (and a third-party policy ranking by next use) streamed, with next
    uses from the stream's own pass and its notes for promoted duplicate holders, gives
    the whole replay's hits and evictions on any stream of hash-form requests (ids from a
    small alphabet, so that lookups stop early and duplicate holders abound), cut into
    chunks of any size, at any capacity from the largest request up."""
    reqs = [
        Request(float(i), 16 * len(ids) - 1, out + 1, hash_ids=ids, hashed_tokens=16 * len(ids))
        for i, (ids, out) in enumerate(rows)
    ]
    trace = Trace.from_requests(reqs, block_tokens=16)
    held = trace.block_layout(16).num_blocks_held
    cfg = ReplayConfig(capacity_blocks=int(held.max()) + spare, block_tokens=16)

    def make() -> Any:
        if policy == "nearest-use":
            return NearestUseFirst()
        return NextUseFirst() if policy == "custom-next-use" else make_policy(policy)

    want = replay(trace, make(), cfg)
    got, _ = replay_stream(_chunks(trace, chunk), [make()], cfg)
    assert got[0].metrics == want.metrics


def test_the_next_use_pass_gives_the_whole_traces_next_uses() -> None:
    """The stream's backward pass over spilled chunks (a table of each key's earliest
    lookup so far) writes, chunk by chunk, what ``next_use_at`` computes on the whole
    layout."""
    from prefixlab.policies.opt import next_use_at

    trace, bt = TRACES["dups"]
    want = next_use_at(trace.block_layout(bt))
    for size in (1, 5, 37, len(trace)):
        got = []
        pieces = (
            (chunk.name, nbytes, chunk.block_layout(bt, intern=False))
            for chunk, nbytes in _chunks(trace, size)
        )
        facts = (
            (
                stream._Facts(
                    name,
                    np.zeros(int(lay.key_offsets.shape[0]) - 1, np.int64),
                    np.zeros(0, np.int64),
                    0,
                ),
                0,
                lay,
            )
            for name, _, lay in pieces
        )
        with tempfile.TemporaryDirectory() as tmp:
            for _, _, lay, nu in stream._two_pass(
                iter(facts), [make_policy("opt")], Path(tmp), None
            ):
                assert nu is not None and nu.shape[0] == lay.raw_keys.shape[0]
                got.append(nu)
        assert np.array_equal(np.concatenate(got), want), size


@needs_compiled
def test_a_per_request_target_that_is_a_folder_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A target path that names a folder: a clear error before the replay, no temp file
    and no partial set of files left (streamed or not)."""
    path = _mooncake(tmp_path / "t.jsonl", 200)
    for extra in ([], ["--no-stream"]):
        out = tmp_path / ("o" + "".join(extra))
        (out / "r.arc.csv").mkdir(parents=True)
        res = _cli(
            "-p",
            "lru",
            "-p",
            "arc",
            "--capacity-blocks",
            "300",
            "--per-request",
            str(out / "r.csv"),
            str(path),
            *extra,
        )
        assert res.exit_code == 2 and "is a folder, not a file" in res.output
        assert sorted(p.name for p in out.iterdir()) == ["r.arc.csv"]


def test_per_request_files_that_fail_to_rename_leave_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails at the end (a full disk, a folder created meanwhile): the temp
    files still there are removed and the error goes up."""
    import os as _os

    from prefixlab.metrics.per_request import PerRequestFiles

    files = PerRequestFiles(tmp_path / "r.csv", ["lru", "arc"])
    files.rows(0, 0, np.array([1, 2]), np.array([3, 4]))
    files.rows(1, 0, np.array([0, 0]), np.array([3, 4]))
    real = _os.replace
    calls: list[str] = []

    def flaky(a: Any, b: Any) -> None:
        calls.append(str(b))
        if len(calls) == 2:
            raise OSError("disk full")
        real(a, b)

    monkeypatch.setattr("prefixlab.metrics.per_request.os.replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        files.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.lru.csv"]
    assert (tmp_path / "r.lru.csv").read_text().splitlines()[1:] == ["0,1,3", "1,2,4"]
