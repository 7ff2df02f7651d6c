"""Replay a trace through SGLang's real RadixCache, request by request (prefixlab's contract).

Run it with a Python that has SGLang installed (0.5.23 was used; ``../shared/REFERENCES.md``
says how it installs on a CPU-only machine), never prefixlab's own environment:

    python sglang_radix.py TRACE.jsonl PAGE_SIZE CAPACITY_PAGES[,CAPACITY_PAGES...] [--unified]

``--unified`` runs ``UnifiedRadixCache`` with its FULL component alone (what 0.5.23 builds
by default, for models without sliding windows too) in place of ``RadixCache``.

TRACE.jsonl: one request per line with ``input_tokens`` and ``output_tokens`` (a prefixlab
native header line is skipped). Prints one JSON line per capacity: ``{"capacity_pages": C,
"hit_tokens": [...]}``.

Per request, with SGLang's own objects (``RadixCache``, ``RadixKey`` and its page alignment
and ``limit`` cap, the real KV-slot allocators on CPU, ``evict_from_tree_cache``):

1. match the input capped at ``len(input) - 1`` tokens (the scheduler's
   ``_compute_max_prefix_len``), page-aligned by ``match_prefix``;
2. lock the matched node;
3. evict the shortfall of the slots for tokens ``[hit, len(input + output))``, in whole
   pages, as the scheduler's allocation does;
4. allocate them and insert input + output (``insert`` keeps whole pages only), then free
   the slots the tree did not take (tokens it already held, the trailing partial page);
5. unlock.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from array import array

warnings.filterwarnings("ignore")
os.environ.setdefault("SGLANG_LOG_LEVEL", "error")


def replay(
    reqs: list[tuple[list[int], list[int]]], page: int, capacity_pages: int, unified: bool = False
) -> list[int]:
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import evict_from_tree_cache
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    slots = capacity_pages * page
    if page == 1:
        alloc = TokenToKVPoolAllocator(slots, torch.int64, "cpu", None, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(slots, page, torch.int64, "cpu", None, need_sort=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc,
        page_size=page,
        eviction_policy="lru",
    )
    if unified:  # what 0.5.23 builds by default: the unified tree, its FULL component only
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        params.tree_components = (ComponentType.FULL,)
        tree = UnifiedRadixCache(params)
    else:
        tree = RadixCache(params)
    hits = []
    for inp, out in reqs:
        key = RadixKey(array("q", inp), limit=max(len(inp) - 1, 0))
        m = tree.match_prefix(MatchPrefixParams(key=key))
        hit, node = m.device_prefix_len, m.last_device_node
        hits.append(int(hit))
        lock = tree.lock(node)
        full = inp + out
        need = -(-(len(full) - hit) // page) * page
        if need > 0:
            evict_from_tree_cache(tree, need)
        got = min(need, alloc.available_size() // page * page)
        new = alloc.alloc(got) if got > 0 else torch.empty(0, dtype=torch.int64)
        prefix = tree.path_device_indices(node)[:hit].to(torch.int64)
        values = torch.cat([prefix, new.to(torch.int64)])
        stored = (min(len(full), hit + got) // page) * page
        kept = hit
        if stored > 0:
            res = tree.insert(
                InsertParams(
                    key=RadixKey(array("q", full[:stored])),
                    value=values[:stored],
                    prev_prefix_len=hit,
                )
            )
            kept = res.prefix_len
            if kept > hit:  # already in the tree: the request's copies are duplicates
                alloc.free(values[hit:kept])
        if hit + got > max(stored, hit):  # the trailing partial page
            alloc.free(values[max(stored, hit) : hit + got])
        tree.unlock(lock)
    return hits


def read_requests(path: str) -> list[tuple[list[int], list[int]]]:
    """A native token-form trace's (input, output) token lists (the header line skipped)."""
    reqs = []
    with open(path) as fh:
        for line in fh:
            d = json.loads(line)
            if "input_tokens" in d:
                reqs.append((list(d["input_tokens"]), list(d.get("output_tokens") or [])))
    return reqs


def main(argv: list[str]) -> int:
    unified = "--unified" in argv
    argv = [a for a in argv if a != "--unified"]
    path, page, capacities = argv[1], int(argv[2]), [int(c) for c in argv[3].split(",")]
    reqs = read_requests(path)
    for cap in capacities:
        hits = replay(reqs, page, cap, unified)
        print(json.dumps({"capacity_pages": cap, "hit_tokens": hits}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
