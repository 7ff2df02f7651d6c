"""Helpers several test files share (compare traces; hash-form traces of given block keys;
count overlapping intervals; the tiny models of the hybrid cache tests, described in
test_hybrid.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from prefixlab.cache.view import EntryView
from prefixlab.model.spec import ModelSpec
from prefixlab.policies.base import EvictionPolicy
from prefixlab.workload.trace import Request, Trace


def assert_identical(a: Trace, b: Trace) -> None:
    """Every column equal, floats bit for bit (NaN think times included)."""
    assert len(a) == len(b)
    assert a.arrival_s.tobytes() == b.arrival_s.tobytes()
    assert a.think_s.tobytes() == b.think_s.tobytes()
    for col in ("input_length", "output_length", "turn"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    for col in ("session_id", "task", "prompt_text", "extra_key"):
        assert getattr(a, col) == getattr(b, col), col
    assert (a.input_tokens is None) == (b.input_tokens is None)
    if a.input_tokens is not None and b.input_tokens is not None:
        for x, y in zip(a.input_tokens, b.input_tokens, strict=True):
            assert np.array_equal(x, y)
    assert (a.output_tokens is None) == (b.output_tokens is None)
    if a.output_tokens is not None and b.output_tokens is not None:
        for x, y in zip(a.output_tokens, b.output_tokens, strict=True):
            assert np.array_equal(x, y)


def content_equal(a: Trace, b: Trace) -> bool:
    """Same requests, same order (Request objects compared field by field)."""
    return len(a) == len(b) and list(a) == list(b)


def half_open_peak(starts: list[float], ends: list[float]) -> int:
    """Peak of active intervals [start, end): at a tie an end is processed before a start."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    active = best = 0
    for _, delta in events:
        active += delta
        best = max(best, active)
    return best


#: the hybrid cache tests' tiny models (test_hybrid.py's docstring counts their bytes)
HYB = ModelSpec(
    "tiny-hybrid",
    hidden_size=2,
    num_attention_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=1,
    num_ssm_layers=1,
    ssm_d_inner=1,
    ssm_d_state=2,
    ssm_conv_kernel=2,
)
TF = ModelSpec(
    "tiny-transformer",
    hidden_size=2,
    num_attention_layers=1,
    num_heads=1,
    num_kv_heads=1,
    head_dim=1,
)
KV = 4  # bytes per token, both models
ST = 8  # bytes per checkpoint, HYB


# ---------------------------------------------------------------- a policy driven by hand
#: tokens per block in directly driven views (test_unicache.py, test_workload_aware.py)
BT = 2


def ids(*entries: int) -> npt.NDArray[np.int64]:
    return np.array(entries, dtype=np.int64)


def row(
    t: float,
    task: str | None,
    session: str | None = None,
    n_in: int = 4,
    turn: int = 0,
) -> Request:
    """A request whose tokens nobody else uses (directly driven tests only read its labels,
    arrival and input length)."""
    base = 1000 * (int(t * 10) + 1)
    return Request(
        arrival_s=float(t),
        input_length=n_in,
        output_length=0,
        session_id=session,
        turn=turn,
        task=task,
        input_tokens=list(range(base, base + n_in)),
    )


def tok(
    t: float,
    task: str | None,
    session: str | None,
    inp: Sequence[int],
    out: Sequence[int] | int = 0,
    turn: int = 0,
) -> Request:
    """A token-form request; ``out``: output token ids (keyed blocks) or a bare length."""
    out_tokens = None if isinstance(out, int) else list(out)
    out_len = out if isinstance(out, int) else len(out)
    return Request(
        arrival_s=float(t),
        input_length=len(inp),
        output_length=out_len,
        session_id=session,
        turn=turn,
        task=task,
        input_tokens=list(inp),
        output_tokens=out_tokens,
    )


class Drive:
    """Drives a block-cache policy through its hooks as ``BlockCache`` would: metadata set,
    then the hook; releases tail first; a hit is on_access, then on_pinned if it was free."""

    def __init__(
        self,
        policy: EvictionPolicy,
        rows: list[Request],
        num_entries: int = 24,
        clock: str = "arrival",
    ) -> None:
        self.trace = Trace.from_requests(rows)
        self.policy = policy
        self.view = EntryView(num_entries)
        self.view.size[:] = BT
        policy.bind(self.view)
        if policy.needs_future:
            policy.prepare(self.trace.block_layout(BT))
        if policy.needs_trace:
            policy.prepare_trace(self.trace, clock)

    def at(self, r: int) -> None:
        self.view.request_index = r
        self.view.now = float(self.trace.arrival_s[r])

    def store(
        self,
        r: int,
        entries: Sequence[int],
        depths: Sequence[int] | None = None,
        release: bool = True,
    ) -> None:
        """Request r stores new entries (key 100 + e) at these depths (default 0, 1, ...)."""
        self.at(r)
        e = ids(*entries)
        v = self.view
        v.key[e] = 100 + e
        v.depth[e] = list(range(len(entries))) if depths is None else list(depths)
        v.ref[e] = 1
        self.policy.on_insert(e)
        if release:
            self.release(*reversed(entries))

    def release(self, *entries: int) -> None:
        self.view.ref[list(entries)] -= 1
        self.policy.on_evictable(ids(*entries))

    def hit(self, r: int, *entries: int, release: bool = True) -> None:
        self.at(r)
        e = ids(*entries)
        self.policy.on_access(e)
        free = e[self.view.ref[e] == 0]
        if free.shape[0]:
            self.policy.on_pinned(free)
        self.view.ref[e] += 1
        if release:
            self.release(*reversed(entries))

    def evict(self, n: int) -> list[int]:
        out: list[int] = self.policy.evict(n).tolist()
        return out


def keyed_trace(prompts: list[list[int]], times: Sequence[float] | None = None) -> Trace:
    """Hash-form requests of whole 16-token blocks with these keys, plus one more token,
    one output token each (arriving a second apart unless ``times`` says)."""
    n = len(prompts)
    flat = [k for p in prompts for k in p]
    offs = np.cumsum([0] + [len(p) for p in prompts])
    lengths = np.array([16 * len(p) + 1 for p in prompts], dtype=np.int64)
    arrivals = np.arange(n, dtype=np.float64) if times is None else np.array(times, np.float64)
    return Trace(
        arrival_s=arrivals,
        input_length=lengths,
        output_length=np.ones(n, np.int64),
        session_id=[None] * n,
        turn=np.zeros(n, np.int64),
        task=[None] * n,
        hash_ids=(np.array(flat, dtype=np.uint64), offs.astype(np.int64)),
        hashed_tokens=lengths - 1,
        block_tokens=16,
    )
