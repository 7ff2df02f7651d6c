"""Serve a trace one request at a time through vLLM's real ``KVCacheManager`` for a model
mixing sliding-window and full attention layers (vLLM's hybrid KV-cache manager).

Run it with a Python that has vLLM installed (0.33.0; ``../shared/REFERENCES.md``):

    python vllm_window_run.py TRACE.jsonl BLOCK LAYERS WINDOW PAGES[,PAGES...]

``LAYERS`` spells the attention layers in order, ``s`` sliding-window and ``f`` full
(``ssfssf``); vLLM's own planner (``kv_cache_planning``) groups them. ``PAGES`` counts usable
pages (vLLM's pool gets one more, its null block). Prints one JSON line per pool:
``{"pages": P, "groups": [...], "hit_tokens": [...]}``.

The calls follow prefixlab's engine with one running request and unchunked prefill, step
by step: ``get_computed_blocks``; ``allocate_slots`` for the prompt with one lookahead
token (the engine holds room for the first output token); one ``allocate_slots`` of one
token (and one lookahead) per decode step, after appending the token sampled before it
(each call first frees the sliding-window blocks past the window,
``remove_skipped_blocks``); at the end, the full blocks of prompt and output cached
(``cache_blocks``, as the engine caches them when the request finishes); then ``free``.
Token-form traces only (``input_tokens``, ``output_tokens``).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _requests(path: str) -> list[tuple[list[int], list[int]]]:
    out = []
    with open(path) as fh:
        for line in fh:
            d = json.loads(line)
            if "input_tokens" in d:  # (the first line is the file's header)
                tokens = [int(t) for t in d.get("output_tokens") or []]
                out.append(([int(t) for t in d["input_tokens"]], tokens))
    return out


def _manager(block: int, layers: str, window: int, pages: int, longest: int):  # type: ignore[no-untyped-def]
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec

    common = {"block_size": block, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    specs = {
        f"layer.{i}": SlidingWindowSpec(**common, sliding_window=window)
        if kind == "s"
        else FullAttentionSpec(**common)
        for i, kind in enumerate(layers)
    }
    groups = _get_kv_cache_groups_uniform_page_size(specs)
    cfg = KVCacheConfig(num_blocks=pages + 1, kv_cache_tensors=[], kv_cache_groups=groups)
    mgr = KVCacheManager(
        cfg,
        max_model_len=longest,
        scheduler_block_size=block,
        hash_block_size=block,
        enable_caching=True,
    )
    kinds = ["s" if isinstance(g.kv_cache_spec, SlidingWindowSpec) else "f" for g in groups]
    return mgr, [f"{k}{len(g.layer_names)}" for k, g in zip(kinds, groups, strict=True)]


def serve(
    reqs: list[tuple[list[int], list[int]]], block: int, layers: str, window: int, pages: int
):  # type: ignore[no-untyped-def]
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    longest = max(len(p) + len(o) for p, o in reqs) + 2 * block
    mgr, groups = _manager(block, layers, window, pages, longest)
    init_none_hash(hashing.sha256)
    hasher = get_request_block_hasher(block, hashing.sha256)
    hits = []
    for i, (prompt, out) in enumerate(reqs):
        req = Request(
            request_id=str(i),
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max(1, len(out))),
            pooling_params=None,
            block_hasher=hasher,
        )
        blocks, hit, _ = mgr.get_computed_blocks(req)
        hits.append(int(hit))
        step = mgr.allocate_slots(req, len(prompt) - hit, hit, blocks, num_lookahead_tokens=1)
        if step is None:
            free = mgr.block_pool.get_num_free_blocks()
            raise SystemExit(
                f"request {i}: its prompt ({len(prompt)} tokens, {hit} hit) does not fit in "
                f"{pages} pages ({free} free)"
            )
        req.num_computed_tokens = len(prompt)
        for g in range(1, len(out)):  # decode steps: the KV of output token g - 1
            req.append_output_token_ids([out[g - 1]])
            if mgr.allocate_slots(req, 1, num_lookahead_tokens=1) is None:
                raise SystemExit(f"request {i}: decode step {g} does not fit in {pages} pages")
            req.num_computed_tokens += 1
        if out:
            req.append_output_token_ids([out[-1]])
        mgr.coordinator.cache_blocks(req, len(prompt) + len(out))
        mgr.free(req)
    return groups, hits


def main(argv: list[str]) -> int:
    path, block, layers, window = argv[1], int(argv[2]), argv[3], int(argv[4])
    reqs = _requests(path)
    for pages in (int(p) for p in argv[5].split(",")):
        groups, hits = serve(reqs, block, layers, window, pages)
        print(json.dumps({"pages": pages, "groups": groups, "hit_tokens": hits}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
