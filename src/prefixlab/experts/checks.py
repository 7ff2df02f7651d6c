"""Invariant checks of a recorded expert-cache run, from its fault mask and victims alone.

Independent of the policy that made the run and of the backend (numba or Python): the
checker replays residency request by request and fails on the first step that breaks the
rules of demand paging (see :mod:`prefixlab.experts.simulate`).
"""

from __future__ import annotations

from prefixlab.errors import ConfigError
from prefixlab.experts.policies import KernelRun, make_policy
from prefixlab.experts.simulate import ExpertResult, TraceLike, check_record, resolve_trace


def check_result(
    trace: TraceLike,
    result: ExpertResult,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
) -> None:
    """Re-verify a recorded run from its fault mask and victims alone (any backend).

    Replays residency and checks, request by request: a resident page never faults and
    evicts nothing; a missing page faults; a victim is named exactly when the cache (or
    the layer's share, for ``-dist`` policies) is full, is resident, is in the requested
    page's layer for ``-dist``; the cache never exceeds its capacity; the counters agree.

    Raises:
        AssertionError: the first violated invariant, with the request index.
        ConfigError: the result was not recorded (``record=True``).
    """
    pages, layers, experts = resolve_trace(trace, num_layers, num_experts)
    if result.fault_mask is None or result.victims is None:
        raise ConfigError("check_result needs a recorded result (simulate(..., record=True))")
    shares = make_policy(result.policy).shares(result.capacity, layers)
    run = KernelRun(result.num_faults, result.faults_per_layer, result.fault_mask, result.victims)
    check_record(pages.tolist(), run, shares, result.capacity, layers, layers * experts)
    mask = result.fault_mask
    per_layer = [int(mask[j::layers].sum()) for j in range(layers)]
    if per_layer != result.faults_per_layer.tolist() or int(mask.sum()) != result.num_faults:
        raise AssertionError(
            f"counters disagree: num_faults={result.num_faults}, faults_per_layer="
            f"{result.faults_per_layer.tolist()}, fault mask gives {per_layer}"
        )
