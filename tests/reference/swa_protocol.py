"""prefixlab's side of the SGLang SWA comparison: serve requests one at a time through
:class:`prefixlab.cache.swa_radix.SwaRadixCache` with the calls ``sglang_swa.py`` makes
on SGLang's own objects (its docstring states them with file and line):

1. match the input's pages up to ``len(input) - 1`` tokens; lock the hit node;
2. evict for the extend (plus a page when paged) and take its pages in both pools;
3. after prefill: an unfinished request inserts its prompt (out-of-window SWA slots
   freed first); a request with one output token inserts and finishes;
4. each decode step ``k`` (position ``L + k - 1``): from the second step, free the SWA
   slots past the window once ``DECODE_INTERVAL`` tokens have left it; evict for one
   token (a page when paged); a new page when the position starts one;
5. at the end: insert ``L + n - 1`` tokens (the last sampled token has no KV), release.

The waiting-queue prefix refresh (every 32nd scheduling call) is not modelled: the driver
runs with ``--no-waiting-refresh``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from prefixlab.cache.swa_radix import DECODE_INTERVAL, SwaRadixCache


def read_requests(path: Path) -> list[tuple[list[int], list[int]]]:
    """A native token-form trace's requests as (input, output) token lists."""
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "input_tokens" in d:
            out.append((list(d["input_tokens"]), list(d.get("output_tokens") or [])))
    return out


def page_keys(tokens: list[int], page: int, table: dict[tuple[int, ...], int]) -> np.ndarray:
    """Chained page keys: page j is named by page j - 1's key and its own tokens."""
    out, prev = [], -1
    for j in range(len(tokens) // page):
        prev = table.setdefault((prev, *tokens[j * page : (j + 1) * page]), len(table))
        out.append(prev)
    return np.array(out, dtype=np.int64)


def serve(
    reqs: list[tuple[list[int], list[int]]],
    page: int,
    window: int,
    full_tokens: int,
    swa_tokens: int,
    check: bool = False,
) -> dict[str, Any]:
    """The driver's output form: hit, full and SWA tokens evicted per request; a request
    the pools cannot hold ends the run (``failed_request``)."""
    cache = SwaRadixCache(full_tokens // page, swa_tokens // page, page, window)
    table: dict[tuple[int, ...], int] = {}
    out: dict[str, Any] = {"full_tokens": full_tokens, "swa_tokens": swa_tokens}
    hits: list[int] = []
    full_ev: list[int] = []
    swa_ev: list[int] = []
    out.update(hit_tokens=hits, full_evicted=full_ev, swa_evicted=swa_ev)
    for idx, (inp, outp) in enumerate(reqs):
        n, length = max(len(outp), 1), len(inp)
        f0, s0 = cache.full_evicted, cache.swa_evicted
        keys = page_keys(inp + (list(outp) or [0]), page, table)
        m = cache.match(keys[: (length - 1) // page])
        hits.append(m.num_hit_tokens)
        req = cache.admit(m)
        cache.evict_for(length - m.num_hit_tokens + (page if page > 1 else 0))
        ok = cache.allocate(req, -(-length // page) - m.num_hit_blocks)
        if ok and n > 1:
            cache.checkpoint(req, keys, length, finished=False)
            for k in range(1, n):
                pos = length + k - 1
                if k >= 2 and pos - window >= req.freed * page + DECODE_INTERVAL:
                    cache.free_out_of_window(req, pos)
                cache.evict_for(1 if page == 1 else page)
                if pos % page == 0 and not cache.allocate(req, 1):
                    ok = False
                    break
        full_ev.append((cache.full_evicted - f0) * page)
        swa_ev.append((cache.swa_evicted - s0) * page)
        if not ok:
            out["failed_request"] = idx
            return out
        cache.checkpoint(req, keys, length + n - 1, finished=True)
        cache.finish(req)
        if check:
            cache.check()
    return out
