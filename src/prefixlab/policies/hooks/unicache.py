"""UniCache: task-aware multi-queue eviction for heterogeneous LLM workloads.

Every cached block belongs to one of four queues, chosen from the task label of the request
that last stored or reused it (``tasks`` maps labels to queues) and from its phase:

- ``evict`` (evict-first): the prefill blocks of untemplated single-turn tasks and every
  decode block of a single-turn task. Nothing reuses them, so they are drained first,
  largest offset (block position) first.
- ``chat`` and ``agentic`` (session reuse): the blocks of multi-turn sessions. Local
  priority ``s = 1 - CDF_q(t_now - t_last)``: the probability that the session's next turn
  is still to come, with a per-queue log-normal CDF of inter-turn gaps. Its parameters are
  given (``chat_mu``...) or fitted online (``fit=online``, the default) from the gaps of
  the requests seen so far (maximum likelihood on log gaps; the presets until
  ``min_gaps`` gaps are in).
- ``structural`` (structural reuse): templated single-turn tasks, whose shared templates sit
  at the head of the prompt. ``s = 1 - offset / max_offset``: deeper blocks go first. The
  paper's ``max_offset`` is "the maximum offset among all blocks" (Sec. 5.2); ``offset``
  picks the reading: the deepest structural block ever seen (``global``, the default), the
  deepest cached now (``cached``), or the block's own prompt (``request``, not the paper's).
  The score has no time term, in the paper as here.

Stage 2 (global choice): among each queue's lowest-``s`` candidate, evict the one with the
lowest ``G_q = alpha_q * s_q`` (Algorithm 1). The weights follow the hit efficiency of each
queue, updated every ``update_every`` requests by Algorithm 2 (:func:`update_weights`):
``E_q = H_q / (C_q + eps)``, with ``H_q`` the hits on the queue's blocks since the last
update and ``C_q`` the share of the capacity it holds; ``E^_q = (E_q / (mean(E) + eps)) ^
(1 / T)``; ``alpha_q <- clamp(beta alpha_q + (1 - beta) E^_q, L, U)`` with ``[L, U] =
[max(0.001, mu - 2 sigma), min(10, mu + 2 sigma)]`` of the ``E^`` (``alg2=paper``, the
printed order; ``alg2=clip-ehat`` clips ``E^`` before the EMA, this project's earlier
reading). ``H_q`` counts the hits since the last update (``hits=window``: Sec. 5.3's "over a
recent time window") or since the start (``hits=cumulative``: Algorithm 2's "cumulative
hit-token counts"). Queues that hold nothing keep their weight. The paper gives no value for ``T``,
``beta``, ``eps`` or the update period: ``T = 0.2``, ``beta = 0.9`` and every 10 requests
are this project's choice, reported to follow the authors' code (which we could not
reach). The log-normal presets are the paper's fits (Sec. 6.1: chat 4.15 / 0.971, agentic
1.81 / 1.092; ``prefixlab.workload.arrivals.GAP_PRESETS``); the paper fits them offline
on history, which is ``fit=given``.

``stage2=false`` is the ablation: each queue evicts independently, the victims shared among
the queues in proportion to the evictable blocks each holds.

``unicache-opt`` ranks first by the next use seen in the engine's waiting queue: a block
that a waiting request will look up is kept while any other can go, and among those the
one needed last goes first; the rest are ranked by UniCache.

Time: the engine runner's simulated clock; under the replay runner, the arrival time of the
request being processed. The block cache only (offsets are block positions).

The hooks are jit functions over :mod:`prefixlab.policies._arrays` state, called by the
class and by the replay and engine kernels. Each queue ranks its evictable blocks by (rank,
the order they became evictable): the session queues in a sorted list (a pairing heap,
:func:`prefixlab.policies._arrays.slist_insert`), the others in an indexed heap. The
weights, counts, gap statistics and parameters are state slots::

    entry rows   QUEUE HPOS ORDER PREV NEXT CHILD (int; CHILD is row LTAIL), TLAST SPAN
    chat, agentic  a sorted list by (TLAST, ORDER): heads in LHEAD
    evict, struct  an indexed heap: HEAP0 + 2h (entries), + 1 (ties); ranks in KP0 + h
    depth rows   DCOUNT: structural blocks cached per depth (offset=cached)

The weights after each update are written to the per-request ``aux`` rows ``AUX_W0..``
(NaN where no update happened): :attr:`UniCache.weight_history` reads them.
"""

from __future__ import annotations

import math

import numpy as np

from prefixlab._jit import jit
from prefixlab.policies import _arrays
from prefixlab.policies._arrays import (
    ABASE,
    ACCESS,
    EVICTABLE,
    FREE,
    FROWS,
    FS,
    HIT_FREE,
    INSERT,
    IROWS,
    NOW,
    PINNED,
    REMOVE,
    REQ,
    SC,
    SLOT,
    iheap_remove,
    iheap_set,
    set_free,
    slist_insert,
    slist_remove,
)
from prefixlab.types import F64, I64
from prefixlab.workload.arrivals import (
    lognormal_cdf_scalar,
)

HOOK_EVICT = _arrays.EVICT  # the hook (EVICT below is the evict-first queue)

QUEUES = ("evict", "chat", "agentic", "structural")
#: the structural score's ``max_offset``: the deepest structural block ever seen, the deepest
#: cached now, or (not the paper's) the prompt length of the block's own request
OFFSETS = ("global", "cached", "request")
EVICT, CHAT, AGENTIC, STRUCT = range(4)
WEIGHTED = (CHAT, AGENTIC, STRUCT)
#: task label -> queue, for the labels of the bundled generators and loaders
DEFAULT_TASKS = {
    "chat": "chat",
    "agentic": "agentic",
    "agent": "agentic",
    "swe-agent": "agentic",
    "tool-agent": "agentic",
    "untemplated": "evict",
    "programming": "structural",
    "tool-use": "structural",
    "document-qa": "structural",
}
CODE = 6

# int rows: per entry (PREV, NEXT: the session queues' links); per session queue its list's
# head and tail; the evict-first (h = 0) and structural (h = 1) heaps (entries HEAP0 + 2h,
# ties + 1); per depth
QUEUE, HPOS, ORDER, PREV, NEXT, LHEAD, LTAIL = range(IROWS, IROWS + 7)
HEAP0 = IROWS + 7
DCOUNT = HEAP0 + 4
# float rows: per entry; the heaps' ranks
TLAST, SPAN, KP0 = FROWS, FROWS + 1, FROWS + 2
# int scalar slots
HN0 = SLOT  # heap h's size: HN0 + h
EVC0 = SLOT + 2  # queue q's evictable blocks (a set-aside block still counts)
COUNTER, MAXOFF, DTOP, SINCE, SEEN, EVERY, MINGAPS = (SLOT + 6 + i for i in range(7))
GIVEN, STAGE2, OFFSET, PAPER, WINDOW, NENT, BTOK = (SLOT + 13 + i for i in range(7))
# unicache-opt only: its flag and the waiting keys' count (slots); rows by key (WPOS: the
# first waiting request that looks the key up, -1), by slot (WLIST: the keys WPOS holds;
# ASIDE, ARANK, AHEAP: the blocks an eviction sets aside, their ranks, a heap of them)
UCOPT, WCOUNT = SLOT + 20, SLOT + 21
WPOS, WLIST, ASIDE, ARANK, AHEAP = (DCOUNT + 1 + i for i in range(5))
# float scalar slots: per queue held, hits, alpha, credit; gap statistics (n, sum, sum of
# squares) per queue; parameters; the given gap models (mu, sigma) of chat and agentic
HELD0, HITS0, ALPHA0, CREDIT0, GAP0 = 0, 4, 8, 12, 16
TEMP, BETA, EPS, MODEL0 = 28, 29, 30, 31
WORK = 35  # Algorithm 2's 21 slots (7 runs of 3)
# aux rows: arrival, queue, prompt tokens, gap to the session's previous turn; weights out
AUX_Q, AUX_IN, AUX_GAP, AUX_W0 = 1, 2, 3, 4


def parse_tasks(spec: str) -> dict[str, int]:
    """``"chat:chat/agent:agentic/qa:structural/spam:evict"`` -> task -> queue index, on top
    of :data:`DEFAULT_TASKS`."""
    out = {t: QUEUES.index(q) for t, q in DEFAULT_TASKS.items()}
    for item in filter(None, (p.strip() for p in spec.split("/"))):
        task, sep, queue = (part.strip() for part in item.rpartition(":"))
        if not sep or not task or queue not in QUEUES:
            raise ValueError(
                f"tasks: expected TASK:QUEUE items separated by '/', QUEUE one of "
                f"{', '.join(QUEUES)}; got '{item}'"
            )
        out[task] = QUEUES.index(queue)
    return out


# ----------------------------------------------------------------------------- Algorithm 2
_lncdf = jit(inline=True)(lognormal_cdf_scalar)


@jit(inline=True)
def _pow(x: float, y: float) -> float:
    """``x ** y``: the C library's ``pow``, with numpy's exact cases for y = 0, 1, 2, 0.5, -1.

    The same bits compiled and interpreted, on any CPU. (numpy's array power uses SIMD code
    on AVX-512 machines, which differs from ``pow`` in the last bit for about one result in
    twenty: the Python implementation before this one gave weights that depended on the CPU,
    and differ from these in the last bit in a few updates; victims were the same in every
    test and comparison.)"""
    if y == 2.0:
        return x * x
    if y == 1.0:
        return x
    if y == 0.5:
        return math.sqrt(x)
    if y == -1.0:
        return 1.0 / x
    if y == 0.0:
        return 1.0
    return float(x**y)


@jit(nrt=False)
def _alg2(
    w: F64,
    row: int,
    base: int,
    n: int,
    temperature: float,
    beta: float,
    eps: float,
    paper: bool,
) -> None:
    """Algorithm 2 on ``n`` queues laid out in ``w[row, base:]`` as seven runs of n: the
    weights, hits and holdings (inputs), the new weights (output), then scratch (E, E^ and
    the live queues' indices). No allocation: the hooks call it."""
    a, h, c, out = base, base + n, base + 2 * n, base + 3 * n
    e, e_hat, live = base + 4 * n, base + 5 * n, base + 6 * n
    m = 0
    for i in range(n):
        w[row, out + i] = w[row, a + i]
        if w[row, c + i] > 0:
            w[row, e + m] = w[row, h + i] / (w[row, c + i] + eps)
            w[row, live + m] = i
            m += 1
    if m == 0:
        return
    top = w[row, e]
    for i in range(m):
        top = max(top, w[row, e + i])
    if top <= 0.0:
        return  # no hits anywhere in the window: nothing to learn from
    total = 0.0
    for i in range(m):
        total += w[row, e + i]
    mean = total / m
    inv_t = 1.0 / temperature
    for i in range(m):
        x = w[row, e + i] / (mean + eps) if paper else w[row, e + i] / mean + eps
        w[row, e_hat + i] = _pow(x, inv_t)
    total = 0.0
    for i in range(m):
        total += w[row, e_hat + i]
    mu = total / m
    total = 0.0
    for i in range(m):
        total += (w[row, e_hat + i] - mu) * (w[row, e_hat + i] - mu)
    sd = math.sqrt(total / m)
    low, high = max(0.001, mu - 2.0 * sd), min(10.0, mu + 2.0 * sd)
    for i in range(m):
        q = int(w[row, live + i])
        x = w[row, e_hat + i]
        if paper:
            w[row, out + q] = min(max(beta * w[row, a + q] + (1.0 - beta) * x, low), high)
        else:
            w[row, out + q] = beta * w[row, a + q] + (1.0 - beta) * min(max(x, low), high)


def update_weights(
    alpha: F64,
    hits: F64,
    held: F64,
    temperature: float,
    beta: float,
    eps: float,
    order: str = "paper",
) -> F64:
    """One step of Algorithm 2 over the queues that hold blocks (the others keep theirs).
    Sums run left to right (numpy's pairwise sums agree below eight queues).

    ``order="paper"`` is Algorithm 2 as printed: ``E_q = H_q / (C_q + eps)``,
    ``E_bar = mean(E) + eps`` (line 12), ``E^_q = (E_q / E_bar) ^ (1 / T)`` (line 15),
    bounds ``[max(0.001, mu - 2 sigma), min(10, mu + 2 sigma)]`` of the ``E^`` (line 18),
    then ``alpha_q = clamp(beta alpha_q + (1 - beta) E^_q, L, U)`` (lines 21-22): the EMA
    first, the clamp on the weight. ``order="clip-ehat"`` is this project's earlier
    reading: ``E^_q = (E_q / mean(E) + eps) ^ (1 / T)`` clipped to the bounds, then the EMA
    (with three queues no ``E^`` is ever 2 sigma from the mean, so only the constants bind).
    Sigma is the population standard deviation (the paper does not say which). A window
    without a hit anywhere changes nothing (the paper's bounds would cross).
    """
    n = int(np.asarray(alpha).shape[0])
    w = np.zeros((1, 7 * n))
    w[0, : 3 * n] = np.concatenate([np.asarray(v, dtype=np.float64) for v in (alpha, hits, held)])
    _alg2(w, 0, 0, n, float(temperature), float(beta), float(eps), order == "paper")
    out: F64 = w[0, 3 * n : 4 * n].copy()
    return out


@jit(nrt=False)
def _update(ist: I64, fst: F64, aux: F64, at: int) -> None:
    """Algorithm 2 over the weighted queues at request ``at``; the hit window restarts."""
    paper = ist[SC, PAPER] != 0
    for i in range(3):
        q = WEIGHTED[i]
        fst[FS, WORK + i] = fst[FS, ALPHA0 + q]
        fst[FS, WORK + 3 + i] = fst[FS, HITS0 + q]
        # paper: C_q is the share of the capacity the queue holds
        held = fst[FS, HELD0 + q]
        fst[FS, WORK + 6 + i] = held / max(ist[SC, NENT], 1) if paper else held
    _alg2(fst, FS, WORK, 3, fst[FS, TEMP], fst[FS, BETA], fst[FS, EPS], paper)
    for i in range(3):
        fst[FS, ALPHA0 + WEIGHTED[i]] = fst[FS, WORK + 9 + i]
        aux[AUX_W0 + i, at - ist[SC, ABASE]] = fst[FS, WORK + 9 + i]
    if ist[SC, WINDOW]:
        for q in range(4):
            fst[FS, HITS0 + q] = 0.0


@jit(nrt=False)
def _catch_up(ist: I64, fst: F64, aux: F64) -> None:
    """Learn the gaps of requests seen since the last hook, in order, once each; update
    the weights every ``update_every`` requests."""
    r = ist[SC, REQ]
    base = ist[SC, ABASE]
    for i in range(ist[SC, SEEN] + 1, r + 1):
        g = aux[AUX_GAP, i - base]
        q = int(aux[AUX_Q, i - base])
        if q in (CHAT, AGENTIC) and g > 0:
            lg = math.log(g)
            fst[FS, GAP0 + 3 * q] += 1.0
            fst[FS, GAP0 + 3 * q + 1] += lg
            fst[FS, GAP0 + 3 * q + 2] += lg * lg
        ist[SC, SINCE] += 1
        if ist[SC, SINCE] >= ist[SC, EVERY]:
            ist[SC, SINCE] = 0
            _update(ist, fst, aux, i)
    if r > ist[SC, SEEN]:
        ist[SC, SEEN] = r


@jit(nrt=False)
def queue_gap(ist: I64, fst: F64, q: int) -> tuple[float, float]:
    """(mu, sigma) of session queue q's log-normal gap model now."""
    m = MODEL0 + 2 * (q - CHAT)
    n = fst[FS, GAP0 + 3 * q]
    if ist[SC, GIVEN] or n < ist[SC, MINGAPS]:
        return fst[FS, m], fst[FS, m + 1]
    mu = fst[FS, GAP0 + 3 * q + 1] / n
    var = max(fst[FS, GAP0 + 3 * q + 2] / n - mu * mu, 0.0)
    return mu, max(math.sqrt(var), 1e-6)


# ----------------------------------------------------------------------------- scores
@jit(nrt=False)
def _offset_scale(ist: I64, fst: F64, e: int) -> float:
    if ist[SC, OFFSET] == 0:  # global
        return float(ist[SC, MAXOFF])
    if ist[SC, OFFSET] == 2:  # request
        return float(fst[SPAN, e])
    top = ist[SC, DTOP]  # cached: the deepest structural block cached now
    while top > 0 and ist[DCOUNT, top] == 0:
        top -= 1
    ist[SC, DTOP] = top
    return float(max(top, 1))


@jit(nrt=False)
def local_rank(ist: I64, fst: F64, depth: I64, e: int, q: int, now: float) -> float:
    """``s`` of entry e in queue q (lower goes first)."""
    if q == STRUCT:
        return 1.0 - float(depth[e]) / _offset_scale(ist, fst, e)
    if q == EVICT:
        return 0.0
    mu, sigma = queue_gap(ist, fst, q)
    return 1.0 - _lncdf(now - fst[TLAST, e], mu, sigma)


@jit(inline=True)
def _rank(ist: I64, fst: F64, depth: I64, e: int, q: int) -> float:
    # session queues: oldest last access first (s falls with idle time); the others:
    # largest offset first
    if q in (CHAT, AGENTIC):
        return float(fst[TLAST, e])
    if q == STRUCT and ist[SC, OFFSET] == 2:
        return -float(depth[e]) / float(fst[SPAN, e])
    return -float(depth[e])


# ----------------------------------------------------------------------------- queues
# A session queue's evictable blocks are a sorted list by (last access, order). The
# evict-first and structural queues are indexed heaps by (rank, order).
@jit(nrt=False)
def _rank_put(ist: I64, fst: F64, depth: I64, e: int) -> None:
    """Rank e (evictable) in its queue."""
    q = ist[QUEUE, e]
    if q in (CHAT, AGENTIC):
        slist_insert(ist, fst, TLAST, ORDER, PREV, LHEAD, q, e)
        return
    h = 0 if q == EVICT else 1
    rank = _rank(ist, fst, depth, e, q)
    iheap_set(ist, fst, KP0 + h, HEAP0 + 2 * h, HPOS, HN0 + h, e, rank, ist[ORDER, e])


@jit(nrt=False)
def _rank_take(ist: I64, fst: F64, e: int) -> None:
    """Take e out of its queue's ranking."""
    q = ist[QUEUE, e]
    if q in (CHAT, AGENTIC):
        slist_remove(ist, fst, TLAST, ORDER, PREV, LHEAD, q, e)
        return
    h = 0 if q == EVICT else 1
    iheap_remove(ist, fst, KP0 + h, HEAP0 + 2 * h, HPOS, HN0 + h, e)


@jit(nrt=False)
def _push(ist: I64, fst: F64, depth: I64, e: int) -> None:
    ist[SC, EVC0 + ist[QUEUE, e]] += 1
    set_free(ist, e, True)
    _rank_put(ist, fst, depth, e)


@jit(nrt=False)
def _unlist(ist: I64, fst: F64, e: int) -> bool:
    """Take e out of its queue's evictable blocks; True if it was evictable."""
    if not ist[FREE, e]:
        return False
    ist[SC, EVC0 + ist[QUEUE, e]] -= 1
    _rank_take(ist, fst, e)
    set_free(ist, e, False)
    return True


@jit(nrt=False)
def _move(ist: I64, fst: F64, depth: I64, e: int, q: int) -> None:
    """Set e's queue (-1: none), keeping the counts."""
    old = ist[QUEUE, e]
    if old >= 0:
        fst[FS, HELD0 + old] -= 1.0
    if q >= 0:
        fst[FS, HELD0 + q] += 1.0
    ist[QUEUE, e] = q
    if ist[SC, OFFSET] == 1:  # cached
        d = depth[e]
        if old == STRUCT:
            ist[DCOUNT, d] -= 1
        if q == STRUCT:
            ist[DCOUNT, d] += 1
            if d > ist[SC, DTOP]:
                ist[SC, DTOP] = d


@jit(nrt=False)
def _assign(ist: I64, fst: F64, depth: I64, e: int, aux: F64) -> None:
    r = ist[SC, REQ] - ist[SC, ABASE]
    q = int(aux[AUX_Q, r])
    n_in = int(aux[AUX_IN, r])
    bt = ist[SC, BTOK]
    if q in (EVICT, STRUCT) and (depth[e] + 1) * bt > n_in:
        q = EVICT  # single-turn: decode blocks are never reused
    _move(ist, fst, depth, e, q)
    fst[SPAN, e] = max(n_in // bt, 1)
    if q == STRUCT and depth[e] > ist[SC, MAXOFF]:
        ist[SC, MAXOFF] = depth[e]


@jit(nrt=False)
def _drop(ist: I64, fst: F64, depth: I64, e: int) -> None:
    """Entry e leaves the cache (evicted; out of its heap already)."""
    q = ist[QUEUE, e]
    set_free(ist, e, False)
    ist[SC, EVC0 + q] -= 1
    fst[FS, HELD0 + q] -= 1.0
    ist[QUEUE, e] = -1
    if q == STRUCT and ist[SC, OFFSET] == 1:
        ist[DCOUNT, depth[e]] -= 1


@jit(inline=True)
def _head(ist: I64, q: int) -> int:
    if q in (CHAT, AGENTIC):
        return int(ist[LHEAD, q])
    h = 0 if q == EVICT else 1
    return int(ist[HEAP0 + 2 * h, 0]) if ist[SC, HN0 + h] > 0 else -1


@jit(nrt=False)
def _choose(ist: I64, fst: F64, depth: I64) -> int:
    """The next victim (not yet taken), or -1: evict-first, then stage 2 (or, without it,
    each queue's share of the victims in proportion to its evictable blocks)."""
    e = _head(ist, EVICT)
    if e >= 0:
        return e
    if not ist[SC, STAGE2]:
        total = 0
        for q in WEIGHTED:
            if _head(ist, q) >= 0:  # only queues with a candidate left (unicache-opt)
                total += ist[SC, EVC0 + q]
        if total == 0:
            return -1
        pick = -1
        for q in WEIGHTED:
            if _head(ist, q) >= 0:
                fst[FS, CREDIT0 + q] += ist[SC, EVC0 + q] / float(total)
                if pick < 0 or fst[FS, CREDIT0 + q] > fst[FS, CREDIT0 + pick]:
                    pick = q
        fst[FS, CREDIT0 + pick] -= 1.0
        return _head(ist, pick)
    best, best_g = -1, math.inf
    now = fst[FS, NOW]
    for q in WEIGHTED:
        h = _head(ist, q)
        if h < 0:
            continue
        g = fst[FS, ALPHA0 + q] * local_rank(ist, fst, depth, h, q, now)
        if g < best_g:
            best, best_g = h, g
    return best


@jit(inline=True)
def uc_hook(ist: I64, fst: F64, h: int, x: int, depth: I64, aux: F64) -> int:
    """Hook h (named in :mod:`prefixlab.policies._arrays`) on entry x."""
    if h in (INSERT, ACCESS, HIT_FREE) and ist[SC, REQ] > ist[SC, SEEN]:
        _catch_up(ist, fst, aux)  # a new request: learn its gap, maybe update the weights
    if h == INSERT:
        _assign(ist, fst, depth, x, aux)
        fst[TLAST, x] = fst[FS, NOW]
    elif h in (ACCESS, HIT_FREE):  # HIT_FREE: the hit pins it too
        q = ist[QUEUE, x]
        if q >= 0:  # the queue the hit block was in earns it
            fst[FS, HITS0 + q] += 1.0
        free = _unlist(ist, fst, x)
        _assign(ist, fst, depth, x, aux)
        fst[TLAST, x] = max(fst[TLAST, x], fst[FS, NOW])
        if free and h == ACCESS:  # re-ranked in its (new) queue
            _push(ist, fst, depth, x)
    elif h == EVICTABLE:
        ist[ORDER, x] = ist[SC, COUNTER]
        ist[SC, COUNTER] += 1
        _push(ist, fst, depth, x)
    elif h == PINNED:
        _unlist(ist, fst, x)
    elif h == REMOVE:
        _unlist(ist, fst, x)
        _move(ist, fst, depth, x, -1)
    elif h == HOOK_EVICT:
        e = _choose(ist, fst, depth)
        if e >= 0:
            _rank_take(ist, fst, e)
            _drop(ist, fst, depth, e)
        return e
    return 0  # update: a duplicate key promoted: same queue, same age


@jit(inline=True)
def _aside_less(ist: I64, i: int, j: int) -> bool:
    """Set-aside block i goes before j: lower rank, then set aside first."""
    return bool(ist[ARANK, i] < ist[ARANK, j] or (ist[ARANK, i] == ist[ARANK, j] and i < j))


@jit(nrt=False)
def _aside_sift(ist: I64, i: int, m: int) -> None:
    """Sift heap position i down in AHEAP[:m] (a heap of set-aside indices)."""
    x = ist[AHEAP, i]
    while True:
        c = 2 * i + 1
        if c >= m:
            break
        if c + 1 < m and _aside_less(ist, ist[AHEAP, c + 1], ist[AHEAP, c]):
            c += 1
        if not _aside_less(ist, ist[AHEAP, c], x):
            break
        ist[AHEAP, i] = ist[AHEAP, c]
        i = c
    ist[AHEAP, i] = x


@jit(nrt=False)
def uc_waiting_begin(ist: I64) -> None:
    """unicache-opt: a new waiting queue follows (uc_waiting_add, in queue order)."""
    for i in range(ist[SC, WCOUNT]):
        ist[WPOS, ist[WLIST, i]] = -1
    ist[SC, WCOUNT] = 0


@jit(nrt=False)
def uc_waiting_add(ist: I64, k: int, pos: int) -> None:
    """Waiting request ``pos`` (queue order) looks key ``k`` up."""
    if ist[WPOS, k] < 0:
        ist[WPOS, k] = pos
        ist[WLIST, ist[SC, WCOUNT]] = k
        ist[SC, WCOUNT] += 1


@jit(nrt=False)
def uc_evict_opt(ist: I64, fst: F64, depth: I64, key: I64, out: I64, n: int) -> int:
    """unicache-opt: n victims into out (how many): UniCache's, a block whose key a waiting
    request needs (WPOS) set aside while any other can go; then the set-aside blocks, the
    one needed last first (deepest first among equals, then the first set aside); the rest
    go back to their queues. The class and the compiled engine both call it."""
    k = 0
    na = 0
    while k < n:
        e = _choose(ist, fst, depth)
        if e < 0:
            break
        _rank_take(ist, fst, e)
        p = ist[WPOS, key[e]]
        if p >= 0:  # set aside, still evictable
            ist[ASIDE, na] = e
            ist[ARANK, na] = -(p * (1 << 32) + depth[e])
            ist[AHEAP, na] = na
            na += 1
            continue
        _drop(ist, fst, depth, e)
        out[k] = e
        k += 1
    for i in range(na // 2 - 1, -1, -1):
        _aside_sift(ist, i, na)
    m = na
    while m > 0 and k < n:
        e = ist[ASIDE, ist[AHEAP, 0]]
        m -= 1
        ist[AHEAP, 0] = ist[AHEAP, m]
        _aside_sift(ist, 0, m)
        _drop(ist, fst, depth, e)
        out[k] = e
        k += 1
    for i in range(m):
        _rank_put(ist, fst, depth, ist[ASIDE, ist[AHEAP, i]])
    return k


# ----------------------------------------------------------------------------- policies
def weight_rows(cols: F64, base: int) -> list[tuple[int, list[float]]]:
    """(request index, weights) of each update written in ``cols`` (requests base, ...)."""
    if cols.shape[0] <= AUX_W0:
        return []
    w = cols[AUX_W0 : AUX_W0 + len(WEIGHTED)]
    return [(base + int(at), w[:, at].tolist()) for at in np.flatnonzero(~np.isnan(w[0]))]
