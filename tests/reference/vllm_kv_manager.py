"""Replay a trace through vLLM's real ``KVCacheManager`` (v1, on CPU), request by request.

Run it with a Python that has vLLM installed (0.33.0 was used; ``../shared/REFERENCES.md``
says how it installs without a GPU), never prefixlab's own environment:

    python vllm_kv_manager.py TRACE.jsonl BLOCK_SIZE CAPACITY_BLOCKS[,CAPACITY_BLOCKS...]

Prints one JSON line per capacity: ``{"capacity_blocks": C, "hit_tokens": [...]}``.
``CAPACITY_BLOCKS`` counts usable blocks, as prefixlab does; vLLM's pool gets one more, its
reserved null block. The manager is built as vLLM's own ``tests/v1/core/test_prefix_caching.py``
builds it (one full-attention group).

Trace lines: token form (``input_tokens``, ``output_tokens``) or hash form (``input_length``,
``output_length``, ``hash_ids``; every token of block j is ``hash_ids[j]``, so equal id
prefixes give equal block hashes). Per request, as prefixlab's replay contract:
``get_computed_blocks`` (vLLM caps the hit at ``len(prompt) - 1``), ``allocate_slots`` for
the prompt, then for token form the output tokens appended and one ``allocate_slots`` (so
full output blocks are cached), for hash form the output only reserved (lookahead slots,
never cached); then ``free``, which releases the blocks tail first.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _requests(path: str, block: int) -> list[tuple[list[int], list[int] | None, int]]:
    out = []
    with open(path) as fh:
        for line in fh:
            d = json.loads(line)
            if "input_tokens" in d:
                toks = [int(t) for t in d.get("output_tokens") or []]
                out.append(([int(t) for t in d["input_tokens"]], toks, len(toks)))
            elif "hash_ids" in d:
                n, ids = int(d["input_length"]), [int(h) for h in d["hash_ids"]]
                prompt = [ids[min(t // block, len(ids) - 1)] for t in range(n)]
                out.append((prompt, None, int(d.get("output_length", 0))))
    return out


def replay(
    reqs: list[tuple[list[int], list[int] | None, int]], block: int, capacity: int
) -> list[int]:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
    cfg = KVCacheConfig(
        num_blocks=capacity + 1,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    longest = max(len(p) + n for p, _, n in reqs) + block
    mgr = KVCacheManager(
        cfg,
        max_model_len=longest,
        scheduler_block_size=block,
        hash_block_size=block,
        enable_caching=True,
    )
    init_none_hash(hashing.sha256)
    hasher = get_request_block_hasher(block, hashing.sha256)
    hits = []
    for i, (prompt, out, n_out) in enumerate(reqs):
        req = Request(
            request_id=str(i),
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=max(1, n_out)),
            pooling_params=None,
            block_hasher=hasher,
        )
        blocks, hit, _ = mgr.get_computed_blocks(req)
        hits.append(int(hit))
        ahead = n_out if out is None else 0
        if (
            mgr.allocate_slots(req, len(prompt) - hit, hit, blocks, num_lookahead_tokens=ahead)
            is None
        ):
            raise SystemExit(f"request {i} does not fit in {capacity} blocks")
        req.num_computed_tokens = len(prompt)
        if out:
            req.append_output_token_ids(out)
            if mgr.allocate_slots(req, len(out)) is None:
                raise SystemExit(f"request {i} does not fit in {capacity} blocks")
        mgr.free(req)
    return hits


def main(argv: list[str]) -> int:
    path, block, capacities = argv[1], int(argv[2]), [int(c) for c in argv[3].split(",")]
    reqs = _requests(path, block)
    for cap in capacities:
        print(json.dumps({"capacity_blocks": cap, "hit_tokens": replay(reqs, block, cap)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
