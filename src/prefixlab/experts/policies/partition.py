"""Fixed per-layer partitions: one independent inner policy per layer (the ``-dist`` family).

A partitioned policy gives layer j a fixed share s_j of the cache (:func:`layer_shares`:
k // l each, the remainder one each to the first layers) and runs one inner policy per
layer on that layer's own requests. The paper's Theorem 3.1 concerns exactly this family:
any deterministic policy that allocates a fixed portion of the cache to each layer has an
unbounded competitive ratio (once a layer needs more pages than its share).

Layer j's requests are t = j, j + l, j + 2l, ...; its inner policy sees them as a one-layer
problem with local time t // l and local pages = experts::

    global  t:  0   1   2   3   4   5  ...    (l = 3)
    layer 1:        *           *           ->  local t 0, 1, ...  page 1*n + e -> e

Order-based policies (LRU, OPT) decide the same on local and global times, and the
compiled path runs each layer's sub-sequence through the inner policy's kernel.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from prefixlab.experts.policies.base import (
    ExpertPolicy,
    KernelRun,
    PolicyContext,
    layer_shares,
)


def _layer_contexts(ctx: PolicyContext) -> list[PolicyContext]:
    layers, n = ctx.num_layers, ctx.num_experts
    shares = layer_shares(ctx.capacity, layers)
    return [
        PolicyContext(int(shares[j]), 1, n, np.ascontiguousarray(ctx.pages[j::layers] - j * n))
        for j in range(layers)
    ]


class Partitioned(ExpertPolicy):
    """Base of the ``-dist`` policies: ``inner`` runs independently in each layer's share."""

    inner: ClassVar[type[ExpertPolicy]]
    partitioned = True

    def reset(self, ctx: PolicyContext) -> None:
        self._num_layers = ctx.num_layers
        self._num_experts = ctx.num_experts
        self._parts: list[ExpertPolicy] = []
        for sub in _layer_contexts(ctx):
            part = self.inner()
            part.reset(sub)
            self._parts.append(part)

    def on_hit(self, page: int, t: int) -> None:
        j, e = divmod(page, self._num_experts)
        self._parts[j].on_hit(e, t // self._num_layers)

    def on_insert(self, page: int, t: int) -> None:
        j, e = divmod(page, self._num_experts)
        self._parts[j].on_insert(e, t // self._num_layers)

    def victim(self, page: int, t: int) -> int:
        j, e = divmod(page, self._num_experts)
        return j * self._num_experts + self._parts[j].victim(e, t // self._num_layers)

    def tracked(self) -> list[int]:
        n = self._num_experts
        return [j * n + e for j, part in enumerate(self._parts) for e in part.tracked()]

    def run_fast(self, ctx: PolicyContext, record: bool, compiled: bool = True) -> KernelRun | None:
        layers, n = ctx.num_layers, ctx.num_experts
        num_requests = int(ctx.pages.shape[0])
        fpl = np.zeros(layers, np.int64)
        mask = np.zeros(num_requests, np.bool_) if record else None
        victims = np.full(num_requests, -1, np.int64) if record else None
        for j, sub in enumerate(_layer_contexts(ctx)):
            part = self.inner().run_fast(sub, record, compiled)
            if part is None:
                return None
            fpl[j] = part.num_faults
            if mask is not None and victims is not None:
                assert part.fault_mask is not None and part.victims is not None
                mask[j::layers] = part.fault_mask
                victims[j::layers] = np.where(part.victims >= 0, part.victims + j * n, -1)
        return KernelRun(int(fpl.sum()), fpl, mask, victims)
