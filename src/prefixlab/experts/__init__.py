"""Mixture-of-Experts expert caching: layered paging traces, policies and the simulator.

The model is the l-layer paging problem of Angelopoulos, Marchal, Obrecht and Simon, "Cache
Management for Mixture-of-Experts LLMs" (extended version; ``../shared/papers/``): l layers of n
experts each, a page is one (layer, expert), request i belongs to layer i mod l, and a cache
of k pages faults when the requested expert is not resident.

    from prefixlab.experts import generate, simulate
    trace = generate("zipf", num_layers=32, num_experts=16, num_tokens=2000, a=1.0, r=0.5)
    simulate(trace, capacity=200, policy="llru").num_faults

Recording real routing (``prefixlab.experts.record``) needs torch and transformers and is
imported on its own.
"""

from prefixlab.experts.checks import check_result
from prefixlab.experts.generators import EXPERT_GENERATORS, generate
from prefixlab.experts.policies import make_policy, registered
from prefixlab.experts.routing_jsonl import load_routing_jsonl, write_routing_jsonl
from prefixlab.experts.simulate import (
    ExpertResult,
    fault_ratio_to_opt,
    simulate,
    sweep_capacities,
)
from prefixlab.experts.trace import ExpertTrace, TraceSummary
from prefixlab.experts.trace_io import load_expert_trace, load_trace, save_trace

__all__ = [
    "EXPERT_GENERATORS",
    "ExpertResult",
    "ExpertTrace",
    "TraceSummary",
    "check_result",
    "fault_ratio_to_opt",
    "generate",
    "load_expert_trace",
    "load_routing_jsonl",
    "load_trace",
    "make_policy",
    "registered",
    "save_trace",
    "simulate",
    "sweep_capacities",
    "write_routing_jsonl",
]
