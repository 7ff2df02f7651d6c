"""Invariant checks of a recorded expert-cache run, from its fault mask and victims alone.

Independent of the policy that made the run and of the backend (numba or Python): the
checker replays residency request by request and fails on the first step that breaks the
rules of demand paging (see :mod:`prefixlab.experts.simulate`).
"""

from __future__ import annotations

from prefixlab.errors import ConfigError
from prefixlab.experts.policies import make_policy
from prefixlab.experts.simulate import ExpertResult, TraceLike, _resolve_trace


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
    pages, layers, experts = _resolve_trace(trace, num_layers, num_experts)
    if result.fault_mask is None or result.victims is None:
        raise ConfigError("check_result needs a recorded result (simulate(..., record=True))")
    shares = make_policy(result.policy).shares(result.capacity, layers)
    group = layers * experts if shares is None else experts
    caps = [result.capacity] if shares is None else shares.tolist()
    _replay_recorded(pages.tolist(), result, group, caps, layers * experts)
    mask = result.fault_mask
    per_layer = [int(mask[j::layers].sum()) for j in range(layers)]
    if per_layer != result.faults_per_layer.tolist() or int(mask.sum()) != result.num_faults:
        raise AssertionError(
            f"counters disagree: num_faults={result.num_faults}, faults_per_layer="
            f"{result.faults_per_layer.tolist()}, fault mask gives {per_layer}"
        )


def _replay_recorded(seq: list[int], result: ExpertResult, group: int, caps: list[int],
                     num_pages: int) -> None:  # fmt: skip
    assert result.fault_mask is not None and result.victims is not None
    mask, victims = result.fault_mask.tolist(), result.victims.tolist()
    resident = bytearray(num_pages)
    sizes = [0] * len(caps)
    for t, p in enumerate(seq):
        v, g = victims[t], p // group
        if resident[p]:
            if mask[t] or v >= 0:
                raise AssertionError(f"t={t}: page {p} is resident, yet a fault or victim")
            continue
        if not mask[t]:
            raise AssertionError(f"t={t}: page {p} is not resident but no fault is recorded")
        if sizes[g] == caps[g]:
            if v < 0 or v >= num_pages or not resident[v] or v // group != g:
                raise AssertionError(f"t={t}: full cache, victim {v} is not a valid choice")
            resident[v] = 0
            sizes[g] -= 1
        elif v >= 0:
            raise AssertionError(f"t={t}: evicted {v} although the cache had room")
        resident[p] = 1
        sizes[g] += 1
        if sizes[g] > caps[g]:
            raise AssertionError(f"t={t}: {sizes[g]} pages exceed capacity {caps[g]}")
