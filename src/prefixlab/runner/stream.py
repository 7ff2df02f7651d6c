"""Streamed replay: a trace file read in chunks, memory bounded by the cache, not the trace.

The replay runner holds the whole trace and its block layout, about 1 KB per request. A
streamed replay reads the file a chunk at a time (``CHUNK_LOADERS``: Mooncake's JSONL
through pyarrow's streaming JSON reader), lays out each chunk's block keys, and runs the
block kernel of :mod:`prefixlab.runner._fast` on it from the state the previous chunk left,
for every policy in the same pass. Given raw 64-bit keys, the kernel maps each to a small
slot number through an open-addressing table of the keys in use: a key enters the table
when a request misses or caches it; for a per-block policy it leaves when its last holder
is evicted (so the table never holds more than the capacity), for ARC, S3-FIFO and LeCaR
once no block holds it and no ghost list names it (:func:`~prefixlab.runner._fast.
sweep_slots`, between chunks, when free slots run short). So per-key state follows the
capacity and the ghost lists, not the trace, and per-request results are summed as they
come: peak memory does not grow with the trace (tested, and measured in
``benchmarks/load_replay.py``).

Same results as the whole-trace replay, bit for bit (tested): the kernel is the same code,
and a policy that can be streamed reads nothing a slot number would change (no sort key
or ghost list orders keys by id). Streamed: the block structure, with

- the online policies (vllm, lru, fifo, sieve, sglang-lru, hashtable, lfu, mru, arc,
  s3fifo, lecar, any keyed policy of one's own);
- offline OPT (or a keyed policy ranking by ``next_use``): the chunks are spilled to a temp
  folder as they are read, a backward pass over them writes every key position's next use
  beside each (:func:`prefixlab.policies.opt.next_uses_back`, the whole replay's pass too:
  a table of each key's earliest later lookup, one entry per distinct key looked up), and
  the replay reads them back in order, each chunk with its next-use column; a duplicate
  holder that an eviction promotes is ranked by its key's next use as the kernel noted it
  (:func:`prefixlab.runner._fast.note_next_uses`), where the whole replay searches the
  trace's occurrence lists;
- the policies that read the trace's own columns (``ArrayPolicy.streams``). Each gets its
  chunk's ``aux`` columns as the chunk is read (``chunk_columns``; its hooks read request
  r at column r - I[SC, ABASE]), with what links chunks carried in the policy: UniCache's
  gap to a session's previous turn (a table of each session's last arrival, about 100
  bytes per session), WA's categories, LPC's conversation numbers. UniCache learns the
  gaps of requests its hooks have not seen yet, so a chunk keeps those columns for the
  next (``carried_from``). Two of them need the whole trace first (``stream_prepare``,
  on the spilled chunks): WA fits its categories on the first ``profile`` share of the
  requests, in a forward pass (one table entry per distinct key of the window), and
  lpc-oracle labels each request by whether its conversation goes on, in a backward pass
  (a set of the conversations met).

The radix structure streams too, for every built-in policy but LPC with a trained
predictor: the compiled tree (:class:`prefixlab.runner._fast_radix.RadixPrepared`) keeps
its own copy of the keys it holds, so a chunk's keys can go once it is replayed. ARC,
S3-FIFO and LeCaR know a key by its slot, as on the block structure: the tree maps raw
keys to slots, and frees (between chunks, when free slots run short) those no node starts
with and no ghost list names, nor ARC's pending T2 mark (a missed key keeps it until a
node starting with it is inserted, as the whole replay's key ids keep it). OPT (or a keyed
policy ranking by ``next_use``) ranks a node by its first key's next use: the same
next-use pass as on the block structure, and the tree notes each key's next use, by
slot, as every request that holds the key gives it (see
:func:`prefixlab.runner._fast_radix.new_tree` for why that is the next use after the
current request whenever a node is ranked, whatever parents a trace gives an id).

Not streamed (the whole trace is loaded): LPC with a trained predictor (it embeds each
prompt with its conversation's earlier turns, and its batched embeddings and MLP pass
differ in their last bits from batch to batch, so chunks would not give the whole load's
results); the hybrid structure (:mod:`prefixlab.runner.hybrid`: token-form traces, whose
token arrays the tree's edges point into); files the chunk reader does not accept (then
the whole-file loader sorts them or names the bad line). Per-request results are handed out
chunk by chunk (``on_rows``), so ``prefixlab replay --per-request`` streams too: it writes
each chunk's rows as they come.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

import numpy as np

from prefixlab._keytable import with_room
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.metrics.replay import hit_summary
from prefixlab.policies._arrays import ABASE, GSEQ0, K0, K1, SC, ChunkPasses, grow_state
from prefixlab.policies._keyed import KeyedPolicy
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import EvictionPolicy
from prefixlab.policies.block_admission import is_default
from prefixlab.policies.opt import next_uses_back
from prefixlab.runner import _fast
from prefixlab.runner._fast_radix import ARRAY as R_ARRAY
from prefixlab.runner._fast_radix import FIFO as R_FIFO
from prefixlab.runner._fast_radix import KEYED as R_KEYED
from prefixlab.runner._fast_radix import LRU as R_LRU
from prefixlab.runner._fast_radix import SIEVE as R_SIEVE
from prefixlab.runner._fast_radix import RadixPrepared, radix_code
from prefixlab.runner.replay import (
    ReplayConfig,
    ReplayResult,
    capacity_error,
    capped_requests,
    without_lookups,
)
from prefixlab.types import F64, I64
from prefixlab.workload.loaders._columnar import first_repeat_row
from prefixlab.workload.loaders.base import NotStreamable
from prefixlab.workload.trace import BlockLayout, Trace

__all__ = ["NotStreamable", "StreamSummary", "replay_stream", "streamable"]


def streamable(pol: EvictionPolicy, config: ReplayConfig) -> bool:
    """Whether a streamed replay runs ``pol`` under ``config`` (see the module's docstring).
    A keyed policy reads the future only through its sort key's ``next_use`` column,
    which the stream computes in a pass of its own (:func:`wants_next_use`)."""
    if not is_default(config.admission):
        return False  # the kernel caches every block
    reads = _streams(pol)
    if config.structure == "radix":  # the tree's own keys, slots, next uses
        code = radix_code(pol)
        online = code in (R_LRU, R_FIFO, R_SIEVE, R_KEYED) and not pol.needs_future
        return (
            _fast.HAVE_NUMBA
            and (
                (online and not pol.needs_trace)
                or (code == R_KEYED and wants_next_use(pol) and not pol.needs_trace)
                or (code == R_ARRAY and (reads != "" or not pol.needs_trace))
            )
            and pol.reserved_bytes <= 0
        )
    return (
        _fast.HAVE_NUMBA
        and config.structure == "block"
        and _fast.kernel_code(pol) >= 0
        and (not pol.needs_future or isinstance(pol, KeyedPolicy) or reads == "two-pass")
        and (not pol.needs_trace or reads != "")
        and pol.reserved_bytes <= 0
    )


def _streams(pol: EvictionPolicy) -> str:
    """How a streamed replay serves a policy that reads the trace (``ArrayPolicy.streams``;
    "" for one that does not)."""
    return pol.streams if pol.needs_trace and isinstance(pol, ArrayPolicy) else ""


def wants_next_use(pol: EvictionPolicy) -> bool:
    """Whether ``pol`` ranks by next use (OPT): the stream then reads the trace twice."""
    return isinstance(pol, KeyedPolicy) and any(c == "next_use" for c, _ in pol.sort_key)


def two_pass(pol: EvictionPolicy) -> bool:
    """Whether the stream reads the whole trace before replaying ``pol`` (next uses; a
    policy's ``stream_prepare``)."""
    return wants_next_use(pol) or _streams(pol) == "two-pass"


# ----------------------------------------------------------------------------- replay
@dataclass(slots=True)
class StreamSummary:
    """What a streamed replay saw of its trace."""

    name: str = ""
    num_requests: int = 0
    num_input_tokens: int = 0
    num_capped: int = 0
    block_tokens: int = 0


@dataclass(slots=True)
class _Run:
    """One policy's replay in progress: the kernel's state and its totals so far."""

    prep: _fast.Prepared | RadixPrepared
    elapsed_s: float = 0.0
    hit_tokens: int = 0
    hit_blocks: int = 0
    lookup_blocks: int = 0
    requests_hit: int = 0
    held_blocks: int = 0
    evictions: int = 0
    out: I64 = field(default_factory=lambda: np.zeros(2, np.int64))
    #: the last chunk's hit tokens per request (what ``on_rows`` is given)
    chunk_hits: I64 = field(default_factory=lambda: np.zeros(0, np.int64))


#: ``on_rows(policy, first_request, hit_tokens, input_tokens)``: one chunk's per-request
#: results for the policy at that index
RowSink = Callable[[int, int, I64, I64], None]


def replay_stream(
    chunks: Iterable[tuple[Trace, int]],
    policies: list[EvictionPolicy],
    config: ReplayConfig,
    on_chunk: Callable[[int, int], None] | None = None,
    parallel: bool = True,
    on_rows: RowSink | None = None,
) -> tuple[list[ReplayResult], StreamSummary]:
    """Replay a trace given as consecutive chunks (each with the bytes read so far) through
    each policy, one pass; returns their results, in order, and what was read.

    Every policy must be :func:`streamable`. ``on_chunk(requests, bytes)`` is called after
    each chunk (progress). ``parallel``: several policies replay each chunk on a thread
    each, up to the number of cores (the same results: their states are separate).
    Results hold no per-request detail (``hit_tokens`` is empty): ``on_rows(i, r0, hits,
    inputs)`` receives each chunk's instead, for policy i, from request r0 on, in order
    (the CLI writes them to files as they come). Raises NotStreamable from the chunk
    reader (nothing is returned then; rows already given belong to a run that failed)."""
    config.validate()
    for pol in policies:
        if not streamable(pol, config):
            raise ValueError(f"policy '{pol.spec()}' cannot be streamed")
    _fast.warm_up()
    seen = StreamSummary()
    readers = [i for i, pol in enumerate(policies) if _streams(pol)]
    pool = _policy_pool(len(policies), parallel)
    read = read_ahead(_laid_out(chunks, policies, config, readers))
    items, future = _passes(read, policies, on_chunk)
    try:
        progress = on_chunk if future is None else None  # two passes: as they spill
        runs = _replay_items(items, policies, config, seen, pool, progress, on_rows)
    except CapacityError:
        # Read on (no replay): a later chunk the reader does not accept means the file must
        # be loaded whole, whose error (a bad line; a request index after sorting) wins.
        for _ in items:
            pass
        raise
    finally:
        items.close()
        read.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if future is not None:
            future.cleanup()
    if not runs:  # nothing was read
        bt = config.block_tokens or 1
        runs = [_start(pol, config, bt) for pol in policies]
    return [_finish(run, config, seen) for run in runs], seen


def _laid_out(
    chunks: Iterable[tuple[Trace, int]],
    policies: list[EvictionPolicy],
    config: ReplayConfig,
    readers: list[int],
) -> Iterator[tuple[_Facts, int, BlockLayout]]:
    """Each chunk's facts, bytes read so far and block layout, checked as the whole load
    checks them (``readers``: the policies that read the trace's columns)."""
    r0 = 0
    last = -np.inf
    for chunk, nbytes in chunks:
        if readers and len(chunk):  # they take a session's turns in the file's order
            arr = np.asarray(chunk.arrival_s, dtype=np.float64)
            if arr[0] < last or (np.diff(arr) < 0).any():
                raise NotStreamable("arrivals out of order (a policy reads sessions)")
            last = float(arr[-1])
        layout = chunk.block_layout(
            config.block_tokens,
            config.extra_key,
            config.cache_partial,
            config.min_recompute_tokens,
            intern=False,
        )
        bad = first_repeat_row(layout.raw_keys, layout.key_offsets)
        if bad >= 0:  # what interning checks on the whole trace (a key names a prefix)
            raise ConfigError(f"request {r0 + bad}: a block key appears twice in one sequence")
        facts = _Facts(
            chunk.name,
            chunk.input_length.astype(np.int64, copy=False),
            chunk.output_length.astype(np.int64, copy=False),
            capped_requests(chunk, layout.block_tokens, config.min_recompute_tokens),
            {i: _array(policies[i]).chunk_columns(chunk, r0) for i in readers},
        )
        r0 += len(chunk)
        yield facts, nbytes, layout if config.prefix_caching else without_lookups(layout)


def _policy_pool(num_policies: int, parallel: bool) -> ThreadPoolExecutor | None:
    """A thread per policy, up to the cores this process may use (None: one by one)."""
    affinity = getattr(os, "sched_getaffinity", None)  # the cores this process may use
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    workers = min(num_policies, cores) if parallel else 1
    return ThreadPoolExecutor(workers, "prefixlab-policy") if workers > 1 else None


def _passes(
    read: Iterator[tuple[_Facts, int, BlockLayout]],
    policies: list[EvictionPolicy],
    on_chunk: Callable[[int, int], None] | None,
) -> tuple[Generator[_Item, None, None], tempfile.TemporaryDirectory[str] | None]:
    """The chunks as the replay takes them, and the folder they are spilled to when some
    policy needs the whole trace first (:func:`_two_pass`; None: read once)."""
    if any(two_pass(pol) for pol in policies):
        future = tempfile.TemporaryDirectory(prefix="prefixlab-two-pass-")
        return _two_pass(read, policies, Path(future.name), on_chunk), future
    return ((facts, nbytes, layout, None) for facts, nbytes, layout in read), None


def _replay_items(
    items: Iterator[_Item],
    policies: list[EvictionPolicy],
    config: ReplayConfig,
    seen: StreamSummary,
    pool: ThreadPoolExecutor | None,
    on_chunk: Callable[[int, int], None] | None,
    on_rows: RowSink | None,
) -> list[_Run]:
    """Every chunk through every policy (their runs start at the first chunk); the runs
    (none when nothing was read)."""
    runs: list[_Run] = []
    for chunk, nbytes, layout, nu in items:
        if not runs:
            runs = [_start(pol, config, layout.block_tokens) for pol in policies]
        for run in runs:
            if nu is not None and wants_next_use(run.prep.policy):
                run.prep.nu_pos = nu
        r0 = seen.num_requests
        _step(runs, chunk, layout, seen, config, pool)
        if on_rows is not None:
            inputs = chunk.input_length.astype(np.int64, copy=False)
            for i, run in enumerate(runs):
                on_rows(i, r0, run.chunk_hits, inputs)
        if on_chunk is not None:
            on_chunk(seen.num_requests, nbytes)
    return runs


@dataclass(slots=True)
class _Facts:
    """What the runner reads of a chunk besides its layout (all a spilled chunk keeps)."""

    name: str
    input_length: I64
    output_length: I64
    num_capped: int
    #: policy index -> the chunk's ``aux`` columns (the policies that read the trace)
    columns: dict[int, F64] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_length.shape[0])


#: what a streamed replay hands the policies: a chunk's facts, the bytes read so far, its
#: layout, and the next use of every key position (None: no policy ranks by it)
_Item = tuple[_Facts, int, BlockLayout, F64 | None]


def _step(
    runs: list[_Run],
    chunk: _Facts,
    layout: BlockLayout,
    seen: StreamSummary,
    config: ReplayConfig,
    pool: ThreadPoolExecutor | None,
) -> None:
    """One chunk through every policy (on the pool's threads when there is one: each
    policy's state is its own and the kernel runs without the GIL), then its totals."""
    n = len(chunk)
    keys = layout.raw_keys.view(np.int64)
    r0 = seen.num_requests
    if pool is None:
        for i, run in enumerate(runs):
            _run_chunk(run, i, chunk, keys, layout, r0, config)
            if run.out[1] >= 0:
                break
    else:
        jobs = [
            pool.submit(_run_chunk, run, i, chunk, keys, layout, r0, config)
            for i, run in enumerate(runs)
        ]
        for done in jobs:
            done.result()
    for run in runs:  # the first policy in order that could not fit, as one by one
        if run.out[1] >= 0:
            r = int(run.out[1]) - r0
            held, inp = int(layout.num_blocks_held[r]), int(chunk.input_length[r])
            raise capacity_error(
                int(run.out[1]),
                held,
                inp,
                int(chunk.output_length[r]),
                config.capacity_blocks,
                layout.block_tokens,
            )
    seen.name = chunk.name
    seen.block_tokens = layout.block_tokens
    seen.num_requests += n
    seen.num_input_tokens += int(chunk.input_length.sum())
    seen.num_capped += chunk.num_capped


def _run_chunk(
    run: _Run,
    i: int,
    chunk: _Facts,
    keys: I64,
    layout: BlockLayout,
    r0: int,
    config: ReplayConfig,
) -> None:
    """The chunk (requests r0, r0 + 1, ...; ``keys``: its raw keys) through policy i's
    run, after its columns and enough room for the chunk's keys and hit counts."""
    prep = run.prep
    if i in chunk.columns:
        _take_columns(prep, chunk.columns[i], r0)
    if isinstance(prep, _fast.Prepared):  # the block kernel's slots and lists
        nlists = int(prep.state[12].max()) + len(chunk) + 1  # lfu: hit counts it can reach
        prep.state = _fast.widen_state(prep.state, nlists)
        if prep.code == _fast.ARRAY:
            _make_slots(prep, int(keys.shape[0]))
    elif prep.T[16].shape[0] > 1:  # a raw-key tree's slots
        if prep.code == R_ARRAY:
            prep.make_slots(int(keys.shape[0]), _GHOST_ROWS, _CLEAR_ROWS, _KEEP_ROWS)
        else:  # next uses: the policy keeps nothing by key
            prep.make_slots(int(keys.shape[0]), _NO_ROWS, _NO_ROWS, _NO_ROWS)
    _chunk(run, keys, layout, r0, config)


def _array(pol: EvictionPolicy) -> ArrayPolicy:
    assert isinstance(pol, ArrayPolicy)
    return pol


def _take_columns(prep: _fast.Prepared | RadixPrepared, cols: F64, r0: int) -> None:
    """The policy's ``aux`` for the chunk from request r0: its columns, after those of
    earlier requests its hooks may still read (``ArrayPolicy.carried_from``)."""
    pol = _array(prep.policy)
    old, base = prep.aux, int(prep.ist[SC, ABASE])
    keep = max(min(pol.carried_from(), r0), base)
    if keep < r0 and old.shape[1]:
        cols = np.concatenate([old[:, keep - base :], cols], axis=1)
    else:
        keep = r0
    if old.shape[1]:
        pol.columns_done(old[:, : keep - base], base)
    prep.aux = pol.aux = cols
    prep.ist[SC, ABASE] = keep


def _start(pol: EvictionPolicy, config: ReplayConfig, block_tokens: int) -> _Run:
    capacity = config.capacity_blocks
    if config.structure == "radix":
        ghosts = radix_code(pol) == R_ARRAY and not _streams(pol)  # state by key: slots
        by_key = ghosts or wants_next_use(pol)  # (next uses: a note per key)
        slots = 2 * capacity + FIRST_SPARE_SLOTS if by_key else 0
        return _Run(RadixPrepared(pol, capacity, 1, block_tokens, slots, wants_next_use(pol)))
    array = _fast.kernel_code(pol) == _fast.ARRAY
    slots = 2 * capacity + FIRST_SPARE_SLOTS if array else capacity
    prep = _fast.Prepared(pol, capacity, block_tokens, slots, 2, raw_keys=True)
    # no occurrence lists (a policy prepared on a whole trace would bring its own): the
    # kernel then takes next uses from the column and its notes (_fast.note_next_uses)
    prep.occ_start, prep.occ_req = np.zeros(1, np.int64), np.zeros(0, np.int64)
    prep.nu_pos = np.zeros(0, np.float64)
    return _Run(prep)


# ----------------------------------------------------------------------------- next uses
_LAYOUT_FIELDS = (
    "raw_keys",
    "key_offsets",
    "num_lookup_blocks",
    "lookup_end_tokens",
    "num_blocks_held",
)


def _two_pass(
    items: Iterator[tuple[_Facts, int, BlockLayout]],
    policies: list[EvictionPolicy],
    folder: Path,
    on_chunk: Callable[[int, int], None] | None,
) -> Generator[tuple[_Facts, int, BlockLayout, F64 | None], None, None]:
    """The chunks again, after passes over the whole trace: each with the next use of
    every key position (the first later request that looks its key up; inf: none) when a
    policy ranks by it, as :func:`prefixlab.policies.opt.next_use_at` gives the whole
    trace's, and after each two-pass policy's ``stream_prepare``. The chunks are read
    (progress reported as they are) and spilled to ``folder`` (their layouts, the facts the
    runner reads, the policies' columns); the next uses come from a walk from the last
    chunk to the first with a table of each key's earliest lookup so far, written beside
    each chunk; the policies walk the spilled chunks as they need; then the chunks are
    handed out in order. Memory: one chunk, and the table (one cell pair per distinct key
    looked up, at most half full); disk: about 16 bytes per key position and 40 per
    request, and the policies' columns."""
    count, requests, starts = _spill(items, folder, on_chunk)
    if any(wants_next_use(pol) for pol in policies):
        _write_next_uses(folder, count, starts)
    for p, pol in enumerate(policies):
        if _streams(pol) == "two-pass":
            _array(pol).stream_prepare(_chunk_passes(folder, p, count, starts), requests)
    nexts = any(wants_next_use(pol) for pol in policies)
    for i in range(count):
        facts, layout = _load(folder, i)
        for p, pol in enumerate(policies):
            if _streams(pol):
                facts.columns[p] = np.load(folder / f"{i}.aux{p}.npy")
        yield facts, 0, layout, np.load(folder / f"{i}.nu.npy") if nexts else None


def _spill(
    items: Iterator[tuple[_Facts, int, BlockLayout]],
    folder: Path,
    on_chunk: Callable[[int, int], None] | None,
) -> tuple[int, int, list[int]]:
    """Write each chunk to ``folder`` (its layout, facts and the policies' columns) as it
    is read, reporting progress; the number of chunks, of requests, and each chunk's first
    request."""
    count = requests = 0
    starts = []  # each chunk's first request
    for facts, nbytes, layout in items:
        starts.append(requests)
        np.savez(
            folder / f"{count}.npz",
            input_length=facts.input_length,
            output_length=facts.output_length,
            meta=np.array([facts.num_capped, layout.block_tokens], np.int64),
            **{f: getattr(layout, f) for f in _LAYOUT_FIELDS},
        )
        for p, cols in facts.columns.items():
            np.save(folder / f"{count}.aux{p}.npy", cols)
        (folder / f"{count}.name").write_text(facts.name)
        count += 1
        requests += len(facts)
        if on_chunk is not None:
            on_chunk(requests, nbytes)
    return count, requests, starts


def _load(folder: Path, i: int) -> tuple[_Facts, BlockLayout]:
    """Spilled chunk i: its facts (without the policies' columns) and layout."""
    with np.load(folder / f"{i}.npz") as z:
        num_capped, block_tokens = (int(v) for v in z["meta"])
        facts = _Facts(
            (folder / f"{i}.name").read_text(),
            z["input_length"],
            z["output_length"],
            num_capped,
        )
        arrays = {f: z[f] for f in _LAYOUT_FIELDS}
    layout = BlockLayout(
        block_tokens=block_tokens, keys=np.zeros(0, np.int64), num_distinct_keys=0, **arrays
    )
    return facts, layout


def _write_next_uses(folder: Path, count: int, starts: list[int]) -> None:
    """Beside each spilled chunk, the next use of every key position: a walk from the last
    chunk to the first with a table of each key's earliest lookup so far."""
    table = np.full((16, 2), -1, np.int64)  # key -> earliest lookup so far (from the end)
    used = 0
    for i in range(count - 1, -1, -1):
        with np.load(folder / f"{i}.npz") as z:
            keys = z["raw_keys"].view(np.int64)
            table = with_room(table, used + int(z["num_lookup_blocks"].sum()))
            nu, added = next_uses_back(
                keys, z["key_offsets"], z["num_lookup_blocks"], starts[i], table
            )
            used += added
        np.save(folder / f"{i}.nu.npy", nu)


def _chunk_passes(folder: Path, p: int, count: int, starts: list[int]) -> ChunkPasses:
    """Policy p's ``passes`` for ``stream_prepare``: the spilled chunks (first request,
    layout, the policy's columns, saved again after each, which it may have written),
    first to last or last to first."""

    def passes(forward: bool) -> Iterator[tuple[int, BlockLayout, F64]]:
        for i in range(count) if forward else range(count - 1, -1, -1):
            cols = np.load(folder / f"{i}.aux{p}.npy")
            try:
                yield starts[i], _load(folder, i)[1], cols
            finally:  # the policy may have written them
                np.save(folder / f"{i}.aux{p}.npy", cols)

    return passes


#: an array-state policy starts with twice its capacity in slots plus these (its ghost
#: lists name up to about its capacity in keys; a chunk's new keys take the rest)
FIRST_SPARE_SLOTS = 1024
#: an array-state policy's rows by key: its ghost lists (-1: absent), and the rows of its
#: own that a freed slot's next key must find zeroed (ARC's pending T2 and announcement)
_GHOST_ROWS = np.array([GSEQ0, GSEQ0 + 1], np.int64)
_CLEAR_ROWS = np.array([K0, K1], np.int64)
#: on the radix structure, a slot stays while ARC's pending T2 mark is set: a missed key
#: that is not its new leaf's first keeps it until a node starting with it is inserted
#: (the whole replay's key ids keep it so too)
_KEEP_ROWS = np.array([K0], np.int64)
_NO_ROWS = np.zeros(0, np.int64)


def _make_slots(prep: _fast.Prepared, num_keys: int) -> None:
    """At least ``num_keys`` free slots for the next chunk (each of its keys may take one):
    first free the slots no block and no ghost list uses, then add slots if still short."""
    free = int(prep.state[23][4])
    if free >= num_keys:
        return
    free = _fast.sweep_slots(prep.state, prep.ist, _GHOST_ROWS, _CLEAR_ROWS)
    if free >= num_keys:
        return
    slots = int(prep.state[25].shape[0])
    grown = max(slots + num_keys - free, slots + slots // 2)
    prep.state = _fast.widen_slots(prep.state, grown)
    prep.ist, prep.fst = grow_state((prep.ist, prep.fst), prep.capacity, grown)


def _chunk(run: _Run, keys: I64, layout: BlockLayout, r0: int, config: ReplayConfig) -> None:
    n = int(layout.key_offsets.shape[0]) - 1
    hit_tokens = np.zeros(n, np.int64)
    hit_blocks = np.zeros(n, np.int64)
    start = time.perf_counter()
    run.prep.run(
        keys,
        layout.key_offsets,
        layout.num_lookup_blocks,
        layout.lookup_end_tokens,
        layout.num_blocks_held,
        r0,
        config.max_free_blocks,
        hit_tokens,
        hit_blocks,
        run.out,
    )
    run.elapsed_s += time.perf_counter() - start
    run.chunk_hits = hit_tokens
    run.hit_tokens += int(hit_tokens.sum())
    run.hit_blocks += int(hit_blocks.sum())
    run.lookup_blocks += int(layout.num_lookup_blocks.sum())
    run.requests_hit += int(np.count_nonzero(hit_blocks))
    run.held_blocks += int(layout.num_blocks_held.sum())
    run.evictions = int(run.out[0])


def _finish(run: _Run, config: ReplayConfig, seen: StreamSummary) -> ReplayResult:
    prep = run.prep
    if isinstance(prep.policy, ArrayPolicy) and prep.aux.shape[1]:  # the last columns
        prep.policy.columns_done(prep.aux, int(prep.ist[SC, ABASE]))
        prep.aux = prep.policy.aux = prep.aux[:, :0]
    metrics = hit_summary(
        num_requests=seen.num_requests,
        num_input_tokens=seen.num_input_tokens,
        num_hit_tokens=run.hit_tokens,
        num_requests_hit=run.requests_hit,
        num_lookup_blocks=run.lookup_blocks,
        num_hit_blocks=run.hit_blocks,
        num_evictions=run.evictions,
    )
    metrics["num_reserved_blocks"] = 0
    empty = np.zeros(0, np.int64)
    return ReplayResult(
        policy=run.prep.policy.spec(),
        capacity_blocks=config.capacity_blocks,
        structure=config.structure,
        metrics=metrics,
        elapsed_s=run.elapsed_s,
        num_blocks_processed=run.held_blocks,
        hit_tokens=empty,
        input_tokens=empty,
    )


_END = object()
T = TypeVar("T")


def read_ahead(items: Iterator[T], depth: int = 2) -> Generator[T, None, None]:
    """``items``, produced on a thread up to ``depth`` ahead of the consumer, in order; an
    exception the producer raises is raised here, where it would have been. The parser
    (pyarrow) and the kernel (compiled without the GIL) then run on two cores at once."""
    box: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object, exc: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                box.put((item, exc), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_END, exc)

    worker = threading.Thread(target=produce, name="prefixlab-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item, exc = box.get()
            if item is _END:
                if exc is not None:
                    raise exc
                return
            yield cast(T, item)  # not _END: an item of ``items``
    finally:
        stop.set()
        worker.join()


def peek(chunks: Iterator[tuple[Trace, int]]) -> tuple[Trace, Iterator[tuple[Trace, int]]] | None:
    """The first chunk, and an iterator over all of them (None: the stream is empty)."""
    first = next(chunks, None)
    if first is None:
        return None

    def again() -> Iterator[tuple[Trace, int]]:
        yield first
        yield from chunks

    return first[0], again()
