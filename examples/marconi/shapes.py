"""Marconi's findings, reproduced on prefixlab's workloads (hybrid KV + SSM prefix caching).

Model: Marconi's 7B hybrid (4 attention, 24 Mamba, 28 MLP layers; a state checkpoint is
26.8 MB, the KV of about 409 tokens). Replay contract of Marconi's simulator. Systems:
vLLM+ (a state every 32 tokens, LRU), SGLang+ (judicious admission, LRU), Marconi
(judicious admission, FLOP-aware eviction, alpha tuned on a bootstrap window, or fixed).

1. Token hit ratio vs cache size on a chat-like, an agent-like and a mixed workload (the
   mixed one, UniCache's trace #3, has the widest spread of prompt lengths).
2. A pure Transformer with the same layers: Marconi and SGLang+ give the same result.
3. Tuned Marconi against SGLang+ and vLLM+ as the share of SSM layers grows (attention:SSM
   1:2, 1:4, 1:8; the paper's Fig. 12a) and as the state dimension grows (16 -> 128; Fig. 12b).

The rules are those of Marconi's published simulator (docs/marconi.md, "Against Marconi's
simulator"). The comparisons use tuned Marconi, the paper's system; alpha = 1 is shown beside.

Run: python examples/marconi/shapes.py  (about a minute on 2 cores; output checked in CI)
"""

from __future__ import annotations

import dataclasses

from prefixlab.model import get_model
from prefixlab.model.spec import ModelSpec
from prefixlab.reproduce.marconi import fig12_shapes
from prefixlab.runner.hybrid import HybridConfig, replay_hybrid
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.trace import Trace

GB = 10**9
HYBRID = get_model("marconi-hybrid-7b")
SYSTEMS = ["vllm+", "sglang+", "marconi", "marconi:alpha=1"]


def workloads() -> dict[str, Trace]:
    return {
        "chat (300 sessions)": GENERATORS["sessions"].fn(num_sessions=300, preset="chat"),
        "agentic (100 sessions)": GENERATORS["sessions"].fn(num_sessions=100, preset="agentic"),
        "mixed (trace #3)": GENERATORS["mix"].fn(trace=3, num_requests=1500),
    }


def hit(trace: Trace, policy: str, capacity_gb: float, model: ModelSpec = HYBRID) -> float:
    spec = (
        policy if not policy.startswith("marconi") or "alpha" in policy else ("marconi:tune_jobs=2")
    )
    res = replay_hybrid(trace, spec, HybridConfig(int(capacity_gb * GB), model))
    return float(res.metrics["token_hit_ratio"])


def spread(trace: Trace) -> str:
    import numpy as np

    p5, p50, p95 = np.percentile(trace.input_length, [5, 50, 95]).astype(int)
    return f"prompt tokens p5/p50/p95 {p5:,}/{p50:,}/{p95:,}"


def part1(traces: dict[str, Trace]) -> None:
    print("1. Token hit ratio vs cache size (Marconi's 7B hybrid)")
    for name, trace in traces.items():
        print(f"\n  {name}: {len(trace):,} requests, {spread(trace)}")
        print(
            f"  {'GB':>4} "
            + " ".join(f"{s:>15}" for s in SYSTEMS)
            + f" {'x vLLM+':>8} {'vs SGLang+':>11}"
        )
        for gb in (5, 10, 20, 40):
            h = {s: hit(trace, s, gb) for s in SYSTEMS}
            gain = (h["marconi"] - h["sglang+"]) / h["sglang+"] if h["sglang+"] else 0.0
            print(
                f"  {gb:>4} "
                + " ".join(f"{h[s]:15.3f}" for s in SYSTEMS)
                + f" {h['marconi'] / h['vllm+']:7.1f}x {gain:+10.1%}"
            )


def part2(traces: dict[str, Trace]) -> None:
    print("\n2. A pure Transformer (the hybrid's 24 SSM layers as attention layers), 5 GB")
    dense = dataclasses.replace(
        HYBRID,
        name="transformer-7b",
        num_attention_layers=28,
        num_ssm_layers=0,
        ssm_d_inner=0,
        ssm_d_state=0,
    )
    for name, trace in traces.items():
        s, m = hit(trace, "sglang+", 5, dense), hit(trace, "marconi:alpha=1", 5, dense)
        print(f"  {name:24} sglang+ {s:.3f}  marconi {m:.3f}  equal: {s == m}")


def part3(trace: Trace) -> None:
    print("\n3. Tuned Marconi against SGLang+ and vLLM+ on the mixed workload at 10 GB")
    for label, model in fig12_shapes(HYBRID, "state dim N={}"):
        v, s = hit(trace, "vllm+", 10, model), hit(trace, "sglang+", 10, model)
        m = hit(trace, "marconi", 10, model)
        ratio = model.state_bytes_per_checkpoint / model.kv_bytes_per_token
        print(
            f"  {label:18} state = KV of {ratio:6,.0f} tokens  vllm+ {v:.3f}  sglang+ {s:.3f}  "
            f"marconi {m:.3f}  {m / v:4.1f}x vLLM+  {(m - s) / s:+.1%} vs SGLang+"
        )


def main() -> None:
    traces = workloads()
    part1(traces)
    part2(traces)
    part3(traces["mixed (trace #3)"])


if __name__ == "__main__":  # tuning runs on worker processes that import this file
    main()
