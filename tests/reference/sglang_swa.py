"""Replay a trace through SGLang's real SWA prefix cache, request by request (prefixlab's contract).

Run it with a Python that has SGLang installed (0.5.23 was used; ``../shared/REFERENCES.md``
says how it installs on a CPU-only machine, plus ``openai`` and ``partial-json-parser`` for the
scheduler imports), never prefixlab's own environment:

    python sglang_swa.py TRACE.jsonl PAGE_SIZE WINDOW FULL:SWA[,FULL:SWA...] [--tree-core python|rust] [--no-waiting-refresh]

TRACE.jsonl: one request per line with ``input_tokens`` and ``output_tokens`` (a prefixlab native
header line is skipped). PAGE_SIZE is SGLang's ``--page-size``. WINDOW is SGLang's
``sliding_window_size`` as the model reports it (gpt-oss reports ``config.sliding_window - 1``,
i.e. 127; note that 0.5.23 does not serve Gemma 2/3 as hybrid SWA models at all). Each ``FULL:SWA`` pair gives the two pool sizes in tokens, the
allocator's ``size`` and ``size_swa`` (SGLang's default is ``SWA = floor_page(FULL * 0.8)``,
``--swa-full-tokens-ratio``). Prints one JSON line per pair:

    {"full_tokens": F, "swa_tokens": S, "hit_tokens": [...],
     "full_evicted": [...], "swa_evicted": [...]}

``hit_tokens[i]`` is request i's ``req.prefix_len`` after its match; ``full_evicted[i]`` and
``swa_evicted[i]`` sum the ``EvictResult`` counts of every eviction the scheduler asked for while
request i ran (prefill and decode allocations). If a pair is too small for some request (an
allocation fails even after eviction, where SGLang would refuse admission or retract) the line
carries ``"error"`` and ``"failed_request"`` instead and the lists stop at that request.
``--tree-core`` picks the TreeCore backend; the default is SGLang's own choice
(``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, "rust", i.e. the bundled Rust TreeCore where it
loads, else the Python ``UnifiedTreeCore``). Both gave identical output on the tests here.

What runs is SGLang's own code on CPU: ``UnifiedRadixCache`` with components (FULL, SWA) -- what
``--enable-radix-cache`` builds for a hybrid SWA model (``mem_cache/registry.py:83-191``) --
over ``SWATokenToKVPoolAllocator`` and ``SWAKVPool`` (one full and one SWA layer, 1 head of dim 1),
a real ``ReqToTokenPool`` and real ``Req`` objects. Per request, one at a time, with nothing else
running, and the non-overlap scheduler order:

1. every 32nd request (0, 32, 64, ...) first gets ``touch_waiting_prefix`` (the waiting-queue LRU
   refresh of ``schedule_policy.py:280-302``, on by default, once per ``calc_priority`` call with a
   non-empty queue; one call per request here; `--no-waiting-refresh` leaves it out, as
   prefixlab does not model it);
2. ``req.init_next_round_input(tree_cache)`` (``scheduler.py:4260``): ``match_prefix`` of the input
   capped at ``len(input) - 1`` (``schedule_batch.py:1766``); the hit is ``req.prefix_len``;
3. admission: ``req.extend_end = len(input)``, ``req.lock = tree_cache.lock(req.last_node)``
   (``schedule_policy.py:1689-1690``); the admission budget is not modelled (a pair too small
   for a request is reported as an error, see above);
4. ``alloc_for_extend`` (``allocation.py:374-488``): prefix indices off the tree, a
   ``req_to_token`` row, then the real ``alloc_token_slots`` (page 1) or
   ``alloc_paged_token_slots_extend`` (page > 1), which call ``evict_from_tree_cache`` with the
   extend length (plus one page per request when paged) and then allocate; indices written into
   the row as ``write_cache_indices`` does. Unchunked: the whole prompt is one extend;
5. the prefill "forward" samples ``output_tokens[0]``; ``update_finish_state``; in a free group
   (``batch_result_processor.py:264-501``): ``release_kv_cache(checkpoint=True)`` if finished, else
   ``checkpoint_kv_cache`` (``batch_result_processor.py:379-394``), which frees the out-of-window
   SWA slots and inserts the page-aligned prompt;
6. each decode step (``prepare_for_decode``, ``schedule_batch.py:3780``): ``maybe_evict_swa``
   (``schedule_batch.py:4068-4123``, decode branch: from the second decode step, when
   ``seqlen - 1 - WINDOW >= swa_evicted_seqlen + SGLANG_SWA_EVICTION_INTERVAL`` (default 128),
   ``tree_cache.evict_sliding_windows(req, seqlen - 1)``), then the real ``alloc_token_slots``
   (1 token) or ``alloc_paged_token_slots_decode`` (evicts for one page), the row write and the
   ``kv_*_len`` bumps of ``alloc_for_decode_default`` (``allocation.py:625-688``); the "forward"
   samples the next output token; when the output is exhausted the request finishes
   (``max_new_tokens = len(output)``, ``ignore_eos``) and ``release_kv_cache(checkpoint=True)``
   runs in a free group (``batch_result_processor.py:998-1100,1466``): insert of input + output
   minus the last token (never computed), page-aligned, then frees and unlock.

Stand-ins (imitations of scheduler pieces, not SGLang calls): the loop above itself, the
admission lock of step 3, the row writes, the ``maybe_evict_swa`` gate of step 6 (copied from
``_swa_eviction_trigger``, ``schedule_batch.py:4047-4066``; ``SGLANG_OPT_RELEASE_PREFILL_SWA`` is
off by default so no early SWA lock release), and the sampled tokens (the trace's outputs). An
empty ``output_tokens`` counts as one sampled token, which is never cached anyway. The overlap
scheduler (SGLang's default on GPU) would allocate one more decode slot before a finish is seen
and free it at release; that can add one token (page) to the last eviction of a request.
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
    reqs: list[tuple[list[int], list[int]]],
    page: int,
    window: int,
    full_tokens: int,
    swa_tokens: int,
    tree_core: str | None = None,
    on_request=None,
    waiting_refresh: bool = True,
) -> dict:
    import logging

    import torch

    logging.disable(logging.WARNING)
    from sglang.srt.environ import envs
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocation import (
        alloc_paged_token_slots_decode,
        alloc_paged_token_slots_extend,
        alloc_token_slots,
    )
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.common import (
        checkpoint_kv_cache,
        release_kv_cache,
        touch_waiting_prefix,
    )
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    max_len = max((len(i) + max(len(o), 1) for i, o in reqs), default=1)
    req_to_token_pool = ReqToTokenPool(
        size=2, max_context_len=max_len + 2 * page + 8, device="cpu", enable_memory_saver=False
    )
    kv_pool = SWAKVPool(
        size=full_tokens,
        size_swa=swa_tokens,
        page_size=page,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=1,
        swa_attention_layer_ids=[0],
        full_attention_layer_ids=[1],
        device="cpu",
    )
    allocator = SWATokenToKVPoolAllocator(
        full_tokens, swa_tokens, page, torch.int64, "cpu", kv_pool, need_sort=False
    )
    tree = UnifiedRadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=page,
            eviction_policy="lru",
            sliding_window_size=window,
            tree_components=(ComponentType.FULL, ComponentType.SWA),
            tree_core_backend=tree_core,
        )
    )

    counts = {"full": 0, "swa": 0}
    evict_for_alloc = tree.evict_for_alloc

    def counting_evict_for_alloc(params, **kw):
        res = evict_for_alloc(params, **kw)
        counts["full"] += res.num_tokens_evicted
        counts["swa"] += res.swa_num_tokens_evicted
        return res

    tree.evict_for_alloc = counting_evict_for_alloc
    tree.pretty_print = lambda: None  # the allocation helpers dump the tree on OOM

    interval = max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get())
    retain = tree.swa_retain_window
    swa = ComponentType.SWA
    out = {"full_tokens": full_tokens, "swa_tokens": swa_tokens, "hit_tokens": []}
    out["full_evicted"], out["swa_evicted"] = [], []

    for idx, (inp, outp) in enumerate(reqs):
        outp = list(outp) or [0]
        counts["full"] = counts["swa"] = 0
        sampling_params = SamplingParams(temperature=0, max_new_tokens=len(outp), ignore_eos=True)
        sampling_params.normalize(None)  # as the tokenizer manager does
        req = Req(
            rid=str(idx),
            origin_input_text="",
            origin_input_ids=array("q", inp),
            sampling_params=sampling_params,
        )
        try:
            # schedule_policy.py:280-302 (WAITING_PREFIX_REFRESH_INTERVAL)
            if waiting_refresh and idx % 32 == 0:
                touch_waiting_prefix(req, tree)
            req.init_next_round_input(tree)
            hit = req.prefix_len
            out["hit_tokens"].append(int(hit))
            length = len(inp)
            req.extend_end = length
            req.lock = tree.lock(req.last_node)

            # alloc_for_extend
            prefix = (
                tree.prefix_device_indices(req).to(torch.int64)
                if hit > 0
                else torch.empty((0,), dtype=torch.int64)
            )
            row = req_to_token_pool.alloc([req])[0]
            if page == 1:
                loc = alloc_token_slots(tree, length - hit)
            else:
                last = prefix[-1:] if hit > 0 else torch.full((1,), -1, dtype=torch.int64)
                loc = alloc_paged_token_slots_extend(
                    tree_cache=tree,
                    prefix_lens=torch.tensor([hit], dtype=torch.int64),
                    prefix_lens_cpu=torch.tensor([hit], dtype=torch.int64),
                    seq_lens=torch.tensor([length], dtype=torch.int64),
                    seq_lens_cpu=torch.tensor([length], dtype=torch.int64),
                    last_loc=last,
                    extend_num_tokens=length - hit,
                )
            req_to_token_pool.write((row, slice(0, hit)), prefix)
            req_to_token_pool.write((row, slice(hit, length)), loc)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = length

            # prefill result
            allocator.free_group_begin()
            req.output_ids.append(outp[0])
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, tree, checkpoint=True)
            else:
                checkpoint_kv_cache(req, tree)
            allocator.free_group_end()

            seq_len = length
            k = 1
            while not req.finished():
                # prepare_for_decode -> alloc_for_decode_default -> maybe_evict_swa
                allocator.free_group_begin()
                if (
                    req.decode_batch_idx >= 1
                    and req.kv.holds_kv
                    and req.seqlen - 1 - retain >= req.kv.get_evicted_seqlen(swa) + interval
                ):
                    tree.evict_sliding_windows(req, req.seqlen - 1, eviction_interval=1)
                allocator.free_group_end()
                if page == 1:
                    loc = alloc_token_slots(tree, 1)
                else:
                    loc = alloc_paged_token_slots_decode(
                        tree_cache=tree,
                        seq_lens=torch.tensor([seq_len + 1], dtype=torch.int64),
                        seq_lens_cpu=torch.tensor([seq_len + 1], dtype=torch.int64),
                        last_loc=req_to_token_pool.req_to_token[row, seq_len - 1 : seq_len],
                    )
                req_to_token_pool.write((row, seq_len), loc.to(torch.int32))
                req.kv.kv_allocated_len += 1
                req.kv.kv_committed_len += 1
                req.decode_batch_idx += 1
                seq_len += 1

                # decode result
                allocator.free_group_begin()
                req.output_ids.append(outp[k])
                k += 1
                req.update_finish_state()
                if req.finished():
                    release_kv_cache(req, tree, checkpoint=True)
                allocator.free_group_end()
        except RuntimeError as exc:  # an allocation that eviction could not satisfy
            out["error"] = str(exc).splitlines()[0]
            out["failed_request"] = idx
            out["full_evicted"].append(counts["full"])
            out["swa_evicted"].append(counts["swa"])
            return out
        out["full_evicted"].append(counts["full"])
        out["swa_evicted"].append(counts["swa"])
        if on_request is not None:  # a hook for inspecting the tree between requests
            on_request(idx, tree)
    return out


def main(argv: list[str]) -> int:
    args = list(argv[1:])
    tree_core = None
    if "--tree-core" in args:
        at = args.index("--tree-core")
        tree_core = args[at + 1]
        del args[at : at + 2]
    refresh = "--no-waiting-refresh" not in args
    if not refresh:
        args.remove("--no-waiting-refresh")
    path, page, window, pairs = args[0], int(args[1]), int(args[2]), args[3]
    from sglang_radix import read_requests  # (its neighbour: run as a script)

    reqs = read_requests(path)
    for pair in pairs.split(","):
        full, swa = (int(x) for x in pair.split(":"))
        out = replay(reqs, page, window, full, swa, tree_core, waiting_refresh=refresh)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
