"""Replay a CPU tier's calls through vLLM's own CPUOffloadingManager (run in vLLM's Python).

Usage: ``python vllm_offload_run.py OPS.json``. OPS.json holds ``{"capacity": N,
"block_tokens": B, "policy": "lru", "store_threshold": 1, "ops": [...]}`` where each op is
``["load", request, keys, positions]``, ``["store", request, keys, positions]`` or
``["finish", request]``, as prefixlab's tier received them in a simulation. Keys are
integers; each becomes an OffloadKey of its 8 bytes and group 0, at end token
``(position + 1) * B`` of its request. The manager is driven as the offloading
connector's scheduler side drives it when every transfer completes at once:

- load: ``lookup`` of each key (all must hit), ``prepare_load``, ``complete_load``;
- store: ``prepare_store``, ``complete_store`` of the keys it chose;
- finish: ``on_request_finished``.

Prints one JSON line per op: for a load, the keys that missed; for a store, the keys it
stored and the keys it evicted (in order), or ``"failed"`` when the manager refused it.
"""

from __future__ import annotations

import json
import sys

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


def _key(k: int) -> bytes:
    return make_offload_key(int(k).to_bytes(8, "big", signed=True), 0)


def _back(key: bytes) -> int:
    return int.from_bytes(key[:8], "big", signed=True)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    manager = CPUOffloadingManager(
        num_chunks=spec["capacity"],
        cache_policy=spec.get("policy", "lru"),
        store_threshold=spec.get("store_threshold", 1),
    )
    bt = spec["block_tokens"]
    contexts: dict[int, ReqContext] = {}

    def context(r: int) -> ReqContext:
        if r not in contexts:
            contexts[r] = ReqContext(req_id=str(r))
            manager.on_new_request(contexts[r])
        return contexts[r]

    for op in spec["ops"]:
        kind, r = op[0], op[1]
        ctx = context(r)
        if kind == "finish":
            manager.on_request_finished(ctx)
            del contexts[r]
            print(json.dumps({"op": "finish"}))
            continue
        keys = [_key(k) for k in op[2]]
        for key, pos in zip(keys, op[3], strict=True):
            ctx.set_offload_key_position(key, (pos + 1) * bt)
        if kind == "load":
            missed = [_back(k) for k in keys if manager.lookup(k, ctx) != LookupResult.HIT]
            if not missed:
                manager.prepare_load(keys, ctx)
                manager.complete_load(keys, ctx)
            print(json.dumps({"op": "load", "missed": missed}))
            continue
        out = manager.prepare_store(keys, ctx)
        if out is None:
            print(json.dumps({"op": "store", "failed": True}))
            continue
        manager.complete_store(out.keys_to_store, ctx)
        stored = [_back(k) for k in out.keys_to_store]
        evicted = [_back(k) for k in out.evicted_keys]
        print(json.dumps({"op": "store", "stored": stored, "evicted": evicted}))


if __name__ == "__main__":
    main()
