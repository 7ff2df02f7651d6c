"""Compiled expert-cache replays (numba, the ``fast`` extra) for every built-in policy.

Each kernel replays a whole page sequence and makes exactly the decisions of the policy's
Python hooks (tests compare fault masks and victims on random traces). Shared structures:

* a doubly linked list of resident pages, oldest first (``lru``, ``fifo``, ``llru``)::

      head -> p7 <-> p3 <-> p9 <- tail      lru: a hit moves the page to the tail
                                            fifo: only insertions append
                                            llru: scan from the head, at most l pages

* an indexed binary min-heap over resident pages (``opt``, ``lfu``); keys are unique, so
  the order never depends on how ties would be broken::

      opt: key = -(next request time), or -(2N - t) if never requested again
      lfu: key = count * (N + 1) + last request time  (fewest hits, then least recent)

* two swap-remove lists for ``marking`` (resident pages, unmarked pages); the victim is
  unmarked[floor(u * num_unmarked)] with ``u`` the next uniform of the seeded stream.

Kernels take ``fpl`` (faults per layer, filled in), ``mask``/``victims`` (length N when
``record``, else empty) and return the number of faults. They are each built-in policy's
only implementation: compiled with numba when it is installed (:mod:`prefixlab._jit`), and
the same source interpreted otherwise or when asked (``compiled=False``: the simulator's
``python`` backend). Hot loops are written out in place, without small helper functions:
each call passing arrays costs reference-count updates, and the helper version of the
list kernel measured about 5x slower.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from prefixlab._jit import COMPILED, HAVE_NUMBA, jit, python_function
from prefixlab.types import B1, F64, I64

__all__ = [
    "COMPILED",
    "HAVE_NUMBA",
    "KernelRun",
    "run_fifo",
    "run_lfu",
    "run_llru",
    "run_lru",
    "run_marking",
    "run_opt",
    "warm_up",
]

Mask = B1
UNIFORM_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class KernelRun:
    """Faults of one run (kernel or Python loop); mask and victims only when recorded.

    ``victims[t]`` is the page evicted to serve request ``t`` (-1: none).
    """

    num_faults: int
    faults_per_layer: I64
    fault_mask: Mask | None
    victims: I64 | None


# ------------------------------------------------------------------ linked list of pages
@jit()
def _list_kernel(
    pages: I64,
    capacity: int,
    num_layers: int,
    num_pages: int,
    mode: int,
    fpl: I64,
    mask: B1,
    victims: I64,
    record: bool,
) -> int:
    """mode 0 = lru, 1 = fifo, 2 = llru. The list operations are written out in place:
    numba runs this loop several times faster than with small helper calls."""
    prev = np.full(num_pages, -1, np.int64)
    nxt = np.full(num_pages, -1, np.int64)
    tau = np.zeros(num_pages, np.int64)  # last request time of each resident page
    resident = np.zeros(num_pages, np.bool_)
    head = -1  # oldest
    tail = -1  # newest
    size = 0
    faults = 0
    for t in range(pages.shape[0]):
        p = pages[t]
        if resident[p]:
            if mode != 1 and tail != p:  # move p to the tail (p is not the tail: b >= 0)
                a, b = prev[p], nxt[p]
                if a >= 0:
                    nxt[a] = b
                else:
                    head = b
                prev[b] = a
                prev[p] = tail
                nxt[p] = -1
                nxt[tail] = p
                tail = p
            tau[p] = t
            continue
        faults += 1
        fpl[t % num_layers] += 1
        if record:
            mask[t] = True
        if size == capacity:
            v = head
            if mode == 2:
                # LLRU: largest R = (t - tau) // l, then largest D = (tau - t) mod l. The
                # max-R pages are the oldest ones, with tau <= t - R * l (at most l).
                limit = t - ((t - tau[head]) // num_layers) * num_layers
                best_d = (tau[head] - t) % num_layers
                q = nxt[head]
                while q >= 0 and tau[q] <= limit:
                    d = (tau[q] - t) % num_layers
                    if d > best_d:
                        v = q
                        best_d = d
                    q = nxt[q]
            a, b = prev[v], nxt[v]
            if a >= 0:
                nxt[a] = b
            else:
                head = b
            if b >= 0:
                prev[b] = a
            else:
                tail = a
            resident[v] = False
            if record:
                victims[t] = v
        else:
            size += 1
        prev[p] = tail
        nxt[p] = -1
        if tail >= 0:
            nxt[tail] = p
        else:
            head = p
        tail = p
        tau[p] = t
        resident[p] = True
    return faults


# --------------------------------------------------------------------- indexed min-heap
@jit()
def _heap_kernel(
    pages: I64,
    capacity: int,
    num_layers: int,
    num_pages: int,
    mode: int,
    fpl: I64,
    mask: B1,
    victims: I64,
    record: bool,
    okeys: I64,
) -> int:
    """mode 0 = opt (Belady), 1 = lfu.

    Every request puts one (key, page) at some slot i of the heap and restores the heap
    order from there: a hit re-keys the page's slot, a fault with room appends, a fault
    with a full cache overwrites the root (the victim). Keys are unique, so the victim
    (the minimum) does not depend on the heap's shape.
    """
    n = pages.shape[0]
    key = okeys  # opt: -(next request time, or 2N - t if never again), from next_use_keys
    count = np.zeros(num_pages, np.int64)  # lfu: requests since insertion
    hk = np.zeros(capacity, np.int64)
    hp = np.zeros(capacity, np.int64)
    pos = np.full(num_pages, -1, np.int64)
    size = 0
    faults = 0
    for t in range(n):
        p = pages[t]
        count[p] += 1
        k = key[t] if mode == 0 else count[p] * (n + 1) + t
        i = pos[p]
        if i < 0:
            faults += 1
            fpl[t % num_layers] += 1
            if record:
                mask[t] = True
            if size == capacity:
                v = hp[0]
                pos[v] = -1
                count[v] = 0  # an evicted page starts again at 0
                if record:
                    victims[t] = v
                i = 0
            else:
                i = size
                size += 1
        # place (k, p) at slot i: sift up, then down (only one of them moves anything)
        while i > 0:
            parent = (i - 1) >> 1
            if hk[parent] <= k:
                break
            hk[i] = hk[parent]
            hp[i] = hp[parent]
            pos[hp[i]] = i
            i = parent
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and hk[c + 1] < hk[c]:
                c += 1
            if hk[c] >= k:
                break
            hk[i] = hk[c]
            hp[i] = hp[c]
            pos[hp[i]] = i
            i = c
        hk[i] = k
        hp[i] = p
        pos[p] = i
    return faults


def next_use_keys(pages: I64) -> I64:
    """Belady's eviction key of every request, vectorised (one stable sort)::

    key(t) = next request time of pages[t]   if there is one (< N)
           = 2N - t                          otherwise (> N, larger for older t)
    """
    n = int(pages.shape[0])
    keys = 2 * n - np.arange(n, dtype=np.int64)
    if n < 2:
        return keys
    order = np.argsort(pages, kind="stable")  # requests of each page, in time order
    same = pages[order[1:]] == pages[order[:-1]]
    keys[order[:-1][same]] = order[1:][same]
    return keys


# ---------------------------------------------------------------------------- marking
@jit()
def _marking_kernel(
    pages: I64,
    t0: int,
    capacity: int,
    num_layers: int,
    uniforms: F64,
    st: I64,
    res_list: I64,
    res_pos: I64,
    unm_list: I64,
    unm_pos: I64,
    fpl: I64,
    mask: B1,
    victims: I64,
    record: bool,
) -> int:
    """Resumable: returns the request where the uniforms ran out (N when done).

    ``st`` = [resident count, unmarked count, faults]; res_pos[p] >= 0 iff p is resident,
    unm_pos[p] >= 0 iff p is resident and unmarked. Removing x from a list moves the
    list's last item into x's slot (swap-remove), exactly as the Python hooks do.
    """
    size, m, faults = st[0], st[1], st[2]
    ui = 0
    t = t0
    n = pages.shape[0]
    while t < n:
        p = pages[t]
        if res_pos[p] >= 0:
            i = unm_pos[p]
            if i >= 0:  # a hit marks the page
                m -= 1
                last = unm_list[m]
                unm_list[i] = last
                unm_pos[last] = i
                unm_pos[p] = -1
            t += 1
            continue
        if size == capacity:
            if ui == uniforms.shape[0]:
                break
            if m == 0:  # every resident page is marked: a new phase unmarks them all
                srt = np.sort(res_list[:size])
                for j in range(size):
                    unm_list[j] = srt[j]
                    unm_pos[srt[j]] = j
                m = size
            j = min(int(uniforms[ui] * m), m - 1)
            ui += 1
            v = unm_list[j]
            m -= 1
            last = unm_list[m]
            unm_list[j] = last
            unm_pos[last] = j
            unm_pos[v] = -1
            i = res_pos[v]
            size -= 1
            last = res_list[size]
            res_list[i] = last
            res_pos[last] = i
            res_pos[v] = -1
            if record:
                victims[t] = v
        faults += 1
        fpl[t % num_layers] += 1
        if record:
            mask[t] = True
        res_list[size] = p
        res_pos[p] = size
        size += 1
        t += 1
    st[0], st[1], st[2] = size, m, faults
    return t


# -------------------------------------------------------------------------- entry points
def _outputs(n: int, num_layers: int, record: bool) -> tuple[I64, Mask, I64]:
    fpl = np.zeros(num_layers, np.int64)
    mask = np.zeros(n if record else 0, np.bool_)
    victims = np.full(n if record else 0, -1, np.int64)
    return fpl, mask, victims


def _run(
    kernel: Callable[..., int],  # _list_kernel or _heap_kernel (one more argument)
    pages: I64,
    capacity: int,
    num_layers: int,
    num_pages: int,
    mode: int,
    record: bool,
    compiled: bool,
    heap: bool = False,
) -> KernelRun:
    fn = kernel if compiled else python_function(kernel)
    pages = np.ascontiguousarray(pages, dtype=np.int64)
    fpl, mask, victims = _outputs(pages.shape[0], num_layers, record)
    if heap:
        okeys = -next_use_keys(pages) if mode == 0 else np.zeros(0, np.int64)
        faults = fn(pages, capacity, num_layers, num_pages, mode, fpl, mask, victims, record, okeys)
    else:
        faults = fn(pages, capacity, num_layers, num_pages, mode, fpl, mask, victims, record)
    return KernelRun(int(faults), fpl, mask if record else None, victims if record else None)


def run_lru(
    pages: I64, capacity: int, num_layers: int, num_pages: int, record: bool, compiled: bool = True
) -> KernelRun:
    """LRU over one shared cache."""
    return _run(_list_kernel, pages, capacity, num_layers, num_pages, 0, record, compiled)


def run_fifo(
    pages: I64, capacity: int, num_layers: int, num_pages: int, record: bool, compiled: bool = True
) -> KernelRun:
    """FIFO over one shared cache."""
    return _run(_list_kernel, pages, capacity, num_layers, num_pages, 1, record, compiled)


def run_llru(
    pages: I64, capacity: int, num_layers: int, num_pages: int, record: bool, compiled: bool = True
) -> KernelRun:
    """Layered LRU."""
    return _run(_list_kernel, pages, capacity, num_layers, num_pages, 2, record, compiled)


def run_opt(
    pages: I64, capacity: int, num_layers: int, num_pages: int, record: bool, compiled: bool = True
) -> KernelRun:
    """Belady's OPT."""
    return _run(_heap_kernel, pages, capacity, num_layers, num_pages, 0, record, compiled, True)


def run_lfu(
    pages: I64, capacity: int, num_layers: int, num_pages: int, record: bool, compiled: bool = True
) -> KernelRun:
    """In-cache LFU, ties to the least recent."""
    return _run(_heap_kernel, pages, capacity, num_layers, num_pages, 1, record, compiled, True)


def run_marking(
    pages: I64,
    capacity: int,
    num_layers: int,
    num_pages: int,
    record: bool,
    seed: int,
    compiled: bool = True,
) -> KernelRun:
    """Randomised marking with ``np.random.default_rng(seed)``."""
    kernel = _marking_kernel if compiled else python_function(_marking_kernel)
    pages = np.ascontiguousarray(pages, dtype=np.int64)
    n = pages.shape[0]
    fpl, mask, victims = _outputs(n, num_layers, record)
    rng = np.random.default_rng(seed)
    st = np.zeros(3, np.int64)
    res_list = np.zeros(capacity, np.int64)
    unm_list = np.zeros(capacity, np.int64)
    res_pos = np.full(num_pages, -1, np.int64)
    unm_pos = np.full(num_pages, -1, np.int64)
    t = 0
    while True:
        # One uniform per eviction, drawn in chunks: the same stream as one draw at a time.
        uniforms = rng.random(UNIFORM_CHUNK)
        t = int(
            kernel(
                pages,
                t,
                capacity,
                num_layers,
                uniforms,
                st,
                res_list,
                res_pos,
                unm_list,
                unm_pos,
                fpl,
                mask,
                victims,
                record,
            )
        )
        if t >= n:
            break
    return KernelRun(int(st[2]), fpl, mask if record else None, victims if record else None)


def warm_up() -> None:
    """Compile every kernel (or load the cached compilation) outside any timed region."""
    pages = np.array([0, 1, 0, 2], np.int64)
    for run in (run_lru, run_fifo, run_llru, run_opt, run_lfu):
        run(pages, 1, 1, 3, True)
    run_marking(pages, 1, 1, 3, True, 0)
