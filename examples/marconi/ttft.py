"""Time to first token for Marconi and its baselines: the engine runner on a hybrid model.

Marconi's 7B hybrid on an H100 (roofline at 50% MFU; 20 ms per decode step), continuous
batching with chunked prefill, 600 requests of the mixed workload (UniCache's trace #3)
arriving open loop. The byte budget holds the cached tree and the running requests' KV and
live states together. TTFT counts from arrival (queueing included); prefill from the
first schedule.

Run: python examples/marconi/ttft.py  (about half a minute on 2 cores; output checked in CI)
"""

from __future__ import annotations

from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.workload.generators import GENERATORS

SYSTEMS = ["vanilla", "vllm+", "sglang+", "marconi:alpha=1"]


def main() -> None:
    trace = GENERATORS["mix"].fn(trace=3, num_requests=600)
    timing = make_timing(["roofline", "tpot:s=0.02"], "marconi-hybrid-7b", "h100")
    print(f"{len(trace)} requests, {int(trace.input_length.sum()):,} input tokens; {timing.spec()}")
    for gb in (5, 10):
        config = EngineConfig(
            capacity_blocks=1,
            structure="hybrid",
            capacity_bytes=gb * 10**9,
            model="marconi-hybrid-7b",
        )
        print(
            f"\n{gb} GB  {'system':16} {'token hit':>9} {'mean TTFT':>10} {'P95 TTFT':>9} "
            f"{'P95 prefill':>12} {'P95 vs SGLang+':>15}"
        )
        rows = {s: simulate(trace, s, config, timing).metrics for s in SYSTEMS}
        base = rows["sglang+"]["p95_ttft_s"]
        for s, m in rows.items():
            print(
                f"      {s:16} {m['token_hit_ratio']:9.3f} {m['mean_ttft_s'] * 1e3:8.1f}ms "
                f"{m['p95_ttft_s'] * 1e3:7.1f}ms {m['p95_prefill_s'] * 1e3:10.1f}ms "
                f"{(m['p95_ttft_s'] - base) / base:+14.1%}"
            )


if __name__ == "__main__":
    main()
