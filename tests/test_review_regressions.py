"""Regressions for problems an independent review found (each failed before its fix)."""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefixlab.cache.events import Event, Removed, Stored
from prefixlab.cli import app
from prefixlab.errors import ConfigError
from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import Request, Trace, load_trace


def _trace(seqs: list[list[int]]) -> Trace:
    return Trace.from_requests(
        [Request(float(i), len(s), 0, input_tokens=s) for i, s in enumerate(seqs)]
    )


class CachedKeys:
    """Which keys have at least one holder, from Stored / Removed events."""

    def __init__(self) -> None:
        self.holders: Counter[int] = Counter()

    def on_event(self, event: Event) -> None:
        if isinstance(event, Stored):
            self.holders.update(event.keys.tolist())
        elif isinstance(event, Removed):
            self.holders.subtract(event.keys.tolist())

    def cached(self) -> set[int]:
        return {k for k, n in self.holders.items() if n > 0}


def test_opt_ranks_a_duplicate_holder_as_never_used() -> None:
    # [26,49,49,22] recomputes block (26,49)'s key... a second holder of a key must not look
    # "needed soon" after its key's use has passed (OPT fell below vllm here).
    t = _trace([[26, 49, 27], [26, 49], [26, 49, 49, 22], [49, 46, 48, 7],
                [1, 6, 16, 34, 19, 6, 16, 19], [49, 46, 48, 7]])  # fmt: skip
    cfg = ReplayConfig(capacity_blocks=5, block_tokens=2)
    assert replay(t, "opt", cfg, check_every=1).hit_tokens.tolist() == [0, 0, 2, 0, 0, 2]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=9), min_size=2, max_size=9),
    capacity=st.integers(5, 9),
)
def test_opt_never_keeps_a_block_whose_prefix_it_evicted(
    seqs: list[list[int]], capacity: int
) -> None:
    trace = _trace(seqs)
    cfg = ReplayConfig(capacity_blocks=capacity, block_tokens=1)
    layout = trace.block_layout(1)
    if int(layout.num_blocks_held.max()) > capacity:
        return
    parent: dict[int, int] = {}
    for r in range(len(trace)):
        ks = layout.request_keys(r).tolist()
        parent.update({k: p for p, k in itertools.pairwise(ks)})
    tracker = CachedKeys()
    checked: list[int] = []

    def after_request(r: int) -> None:
        cached = tracker.cached()
        orphans = [k for k in cached if k in parent and parent[k] not in cached]
        assert not orphans, f"after request {r}: {orphans} cached without their prefix"
        checked.append(r)

    replay(trace, "opt", cfg, observers=[tracker], on_step=after_request)
    assert len(checked) == len(trace)


def test_inconsistent_library_trace_is_refused_not_crashed() -> None:
    with pytest.raises(ConfigError, match="input_length=1 but it has 64 input tokens"):
        Trace.from_requests([Request(0.0, 1, 0, input_tokens=list(range(64)))])
    with pytest.raises(ConfigError, match="hashed_tokens=640 exceeds"):
        Trace.from_requests(
            [Request(0.0, 16, 0, hash_ids=list(range(40)), hashed_tokens=640)], block_tokens=16
        )
    repeated = Trace.from_requests([Request(0.0, 48, 0, hash_ids=[7, 7, 8])], block_tokens=16)
    with pytest.raises(ConfigError, match="block id 7 appears twice"):
        repeated.block_layout()


def test_native_loader_refuses_repeated_and_huge_ids(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prefixlab_trace": 1, "block_tokens": 16}\n'
        '{"hash_ids": [7, 7, 8], "input_length": 48, "output_length": 0}\n'
    )
    with pytest.raises(Exception, match="id 7 appears twice"):
        load_trace(p)
    p.write_text(f'{{"input_tokens": [1, {1 << 63}], "output_length": 0}}\n')
    with pytest.raises(Exception, match="input_tokens"):
        load_trace(p)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gen:sessions:num_sessions=abc"], "num_sessions must be an integer"),
        (["gen:sessions:seed=-1"], "seed must be >= 0, got -1"),
        (["gen:sessions:mean_turns=0.5"], "mean_turns must be >= 1, got 0.5"),
        (["gen:sessions:gap_sigma=-1"], "gap_sigma must be > 0"),
        (["gen:sessions", "-p", "lecar:seed=1.5"], "seed must be an integer"),
        (["gen:sessions", "-p", "lecar:learning_rate=nan"], "learning_rate must be positive"),
        (["gen:sessions", "-p", "s3fifo:move_to_main_threshold=1.5"], "must be an integer"),
        (["gen:sessions", "--max-free-blocks", "-1"], "max_free_blocks must be >= 0"),
        (["gen:sessions", "--limit", "5"], "applies to trace files"),
        (["gen:sessions", "-p", "lru", "-p", "lru"], "a policy is given twice"),
        (["gen:sessions", "--per-request", "/nonexistent/dir/x.csv"], "does not exist"),
        (["gen:sessions:bad"], "generator spec"),
    ],
)
def test_more_one_line_errors(args: list[str], message: str) -> None:
    argv = ["replay", *args, "--block-tokens", "16", "--capacity-blocks", "2000"]
    if "-p" not in args:
        argv += ["-p", "lru"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert message in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.output


def test_miss_event_tokens_for_a_partial_block() -> None:
    from prefixlab.cache.events import Miss

    misses: list[Miss] = []

    class Log:
        def on_event(self, event: Event) -> None:
            if isinstance(event, Miss):
                misses.append(event)

    t = Trace.from_requests([Request(0.0, 5, 0, input_tokens=[1, 2, 3, 4, 5])])
    cfg = ReplayConfig(
        capacity_blocks=8, block_tokens=4, cache_partial=True, min_recompute_tokens=0
    )
    replay(t, "lru", cfg, observers=[Log()])
    assert (misses[0].num_blocks, misses[0].num_tokens) == (2, 5)
    assert np.sum([m.num_tokens for m in misses]) == 5


def textbook_arc(pages: list[int], c: int) -> list[int]:
    """ARC exactly as in Megiddo & Modha (FAST'03), Fig. 4, one page per request."""
    t1: OrderedDict[int, None] = OrderedDict()
    t2: OrderedDict[int, None] = OrderedDict()
    b1: OrderedDict[int, None] = OrderedDict()
    b2: OrderedDict[int, None] = OrderedDict()
    p = 0.0
    hits: list[int] = []

    def replace(x: int) -> None:
        if t1 and (len(t1) > p or (x in b2 and len(t1) == p)):
            b1[t1.popitem(last=False)[0]] = None
        else:
            b2[t2.popitem(last=False)[0]] = None

    for x in pages:
        if x in t1 or x in t2:  # case I: a hit
            (t1 if x in t1 else t2).pop(x)
            t2[x] = None
            hits.append(1)
            continue
        hits.append(0)
        if x in b1:  # case II
            p = min(c, p + max(len(b2) / len(b1), 1))
            replace(x)
            b1.pop(x)
            t2[x] = None
        elif x in b2:  # case III
            p = max(0, p - max(len(b1) / len(b2), 1))
            replace(x)
            b2.pop(x)
            t2[x] = None
        else:  # case IV
            l1 = len(t1) + len(b1)
            if l1 == c:
                if len(t1) < c:
                    b1.popitem(last=False)
                    replace(x)
                else:
                    t1.popitem(last=False)
            elif l1 < c and l1 + len(t2) + len(b2) >= c:
                if l1 + len(t2) + len(b2) == 2 * c:
                    b2.popitem(last=False)
                replace(x)
            t1[x] = None
    return hits


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(c=st.integers(2, 5), data=st.data())
def test_arc_equals_the_paper_on_page_traces(c: int, data: st.DataObject) -> None:
    # One page per request (1-token blocks, nothing recomputed): the cache is a page cache.
    pages = data.draw(st.lists(st.integers(0, 2 * c), min_size=3, max_size=40))
    trace = Trace.from_requests(
        [Request(float(i), 1, 0, input_tokens=[x]) for i, x in enumerate(pages)]
    )
    cfg = ReplayConfig(capacity_blocks=c, block_tokens=1, min_recompute_tokens=0)
    ours = (replay(trace, "arc", cfg, check_every=1).hit_tokens > 0).astype(int).tolist()
    assert ours == textbook_arc(pages, c)


def test_per_request_extra_key_isolates_tenants(tmp_path: Path) -> None:
    from prefixlab.workload import write_native
    from prefixlab.workload.trace import to_hash_form

    tokens = list(range(40))

    def req(i: int, key: str | None) -> Request:
        return Request(float(i), 40, 0, input_tokens=tokens, extra_key=key)

    trace = Trace.from_requests(
        [req(0, "lora-a"), req(1, "lora-b"), req(2, "lora-a"), req(3, None)]
    )
    cfg = ReplayConfig(capacity_blocks=64, block_tokens=8)
    # Same tokens: only the request with the same adapter reuses them (4 blocks, capped).
    assert replay(trace, "lru", cfg).hit_tokens.tolist() == [0, 0, 32, 0]
    hashed = to_hash_form(trace, 8)
    assert replay(hashed, "lru", ReplayConfig(capacity_blocks=64)).hit_tokens.tolist() == [
        0, 0, 32, 0,
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    write_native(trace, path)
    back = load_trace(path)
    assert back.extra_key == ["lora-a", "lora-b", "lora-a", None]
    assert replay(back, "lru", cfg).hit_tokens.tolist() == [0, 0, 32, 0]
    # Hash form: ids are salted per request too.
    h = Trace.from_requests(
        [Request(float(i), 32, 0, hash_ids=[1, 2], extra_key=k) for i, k in
         enumerate(["t1", "t2", "t1"])],
        block_tokens=16,
    )  # fmt: skip
    assert replay(h, "lru", ReplayConfig(capacity_blocks=8)).hit_tokens.tolist() == [0, 0, 16]


def test_native_requests_must_be_in_arrival_order(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"arrival_s": 5, "input_tokens": [1], "output_length": 0}\n'
        '{"arrival_s": 2, "input_tokens": [1], "output_length": 0}\n'
    )
    with pytest.raises(Exception, match="arrival order") as info:
        load_trace(p)
    assert f"{p}:2" in str(info.value)
