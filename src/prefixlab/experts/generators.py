"""Seeded generators of expert traces, registered by name (``gen:KIND:k=v,...`` sources).

``zipf`` (per-layer Zipf popularity, temporal reuse, cross-layer correlation, top-k),
``uniform``, ``cyclic``, and the adversarial sequences ``thm33`` (LRU faults on every request)
and ``thm31`` (fixed per-layer partitions fault every round). Each generator is
``fn(params=None, **overrides) -> ExpertTrace`` with a frozen parameter dataclass declared with
:func:`prefixlab.workload.generators.base.param`, so the CLI can build one flag per parameter.

Randomness: every purpose draws from its own stream ``default_rng([seed, purpose])``, so
changing, say, ``r`` keeps the layouts and the fresh Zipf draws (common random numbers across
a parameter sweep), and the same parameters always give identical arrays.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.experts.trace import ExpertTrace
from prefixlab.registry import parse_spec
from prefixlab.types import F64, I64
from prefixlab.workload.generators.base import GeneratorInfo, param, registrar, resolve_params

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Stream tags of default_rng([seed, tag]): one per purpose (see the module docstring).
_LAYOUT, _FRESH, _REUSE, _LINK, _FURTHER, _SPREAD = range(6)


ExpertGeneratorInfo = GeneratorInfo[ExpertTrace]
EXPERT_GENERATORS: dict[str, ExpertGeneratorInfo] = {}


def register_expert_generator(
    name: str, params: type[DataclassInstance], summary: str
) -> Callable[[Callable[..., ExpertTrace]], Callable[..., ExpertTrace]]:
    """Decorator: register ``fn`` as the expert generator ``name``."""
    return registrar(EXPERT_GENERATORS, name, params, summary)


def generate(kind: str, **params: object) -> ExpertTrace:
    """Run the generator registered as ``kind`` with keyword parameters."""
    if kind not in EXPERT_GENERATORS:
        known = ", ".join(sorted(EXPERT_GENERATORS))
        raise ConfigError(f"unknown expert generator '{kind}'; known: {known}")
    return EXPERT_GENERATORS[kind].fn(**params)


def generate_from_spec(spec: str) -> ExpertTrace:
    """``"zipf:a=1.2,num_tokens=100"`` (a ``gen:`` source without its prefix)."""
    kind, kwargs = parse_spec(spec, "expert generator spec")
    return generate(kind, **kwargs)


def _meta(kind: str, params: object) -> dict[str, str]:
    values = dataclasses.asdict(params)  # type: ignore[call-overload]
    text = ",".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()
    )
    return {
        "source": "generator",
        "generator": kind,
        "params": json.dumps(values, sort_keys=True),
        "spec": f"gen:{kind}:{text}",
    }


def _from_grid(grid: I64, num_experts: int, meta: dict[str, str]) -> ExpertTrace:
    """A trace from experts shaped ``(token, rank, layer)``: token t gives k rounds."""
    num_tokens, k, num_layers = grid.shape
    grid = np.ascontiguousarray(grid)
    token_idx = np.repeat(np.arange(num_tokens, dtype=np.int64), k * num_layers)
    rank = np.tile(np.repeat(np.arange(k, dtype=np.int64), num_layers), num_tokens)
    return ExpertTrace(num_layers, num_experts, grid.reshape(-1), token_idx, rank, meta=meta)


# ---------------------------------------------------------------------------------- zipf


def zipf_popularity(num_experts: int, a: float, b: float = 0.0) -> F64:
    """Probability of each popularity rank j = 1..n: ``p_j = (j + b)^-a / sum``."""
    w: F64 = (np.arange(1, num_experts + 1, dtype=np.float64) + b) ** -a
    out: F64 = w / w.sum()
    return out


def zipf_layout(num_layers: int, num_experts: int, *, shuffle: bool, seed: int) -> I64:
    """``layout[j, rank]`` = the expert of layer j holding that popularity rank (0: top).

    Without ``shuffle`` expert e has rank e in every layer; with it each layer has its own
    seeded permutation. Expert labels do not change any policy's faults (pages are only
    compared for equality), only which ids look popular.
    """
    if not shuffle:
        return np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))
    rng = np.random.default_rng([seed, _LAYOUT])
    return np.stack([rng.permutation(num_experts) for _ in range(num_layers)]).astype(np.int64)


def cross_layer_map(layout: I64) -> I64:
    """``link[j, e]``: the layer-j expert with the same popularity rank as layer j-1's e.

    Row 0 is the identity (layer 0 has no previous layer). With ``c = 1`` every layer's
    expert is ``link[j, expert at layer j-1]``.
    """
    ranks = np.argsort(layout, axis=1)  # ranks[j, e] = rank of expert e in layer j
    link = np.empty_like(layout)
    link[0] = np.arange(layout.shape[1])
    link[1:] = np.take_along_axis(layout[1:], ranks[:-1], axis=1)
    return link


@dataclass(frozen=True, slots=True)
class ZipfParams:
    num_layers: int = param(32, 1, "Layers l (Llama-MoE-like default: 32 layers, 16 experts).")
    num_experts: int = param(16, 1, "Experts n per layer.")
    num_tokens: int = param(1000, 1, "Tokens; each gives top_k rounds of num_layers requests.")
    a: float = param(1.0, 0, "Zipf exponent: p_j proportional to 1/(j+b)^a, ranks j=1..n.")
    b: float = param(0.0, -1, "Zipf shift b (> -1).", strict=True)
    a_spread: float = param(
        0.0, 0, "Layer heterogeneity: layer j's exponent is a + a_spread * u_j, u_j in [-1, 1]."
    )
    r: float = param(0.0, 0, "Temporal reuse: keep the previous token's expert, per layer.")
    c: float = param(0.0, 0, "Cross-layer correlation: follow the previous layer's rank.")
    top_k: int = param(1, 1, "Distinct experts per token and layer (top_k rounds per token).")
    shuffle: bool = param(True, help="Give each layer its own seeded rank-to-expert order.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        for name in ("r", "c"):
            if getattr(self, name) > 1.0:
                raise ConfigError(
                    f"{name} must be a probability in [0, 1], got {getattr(self, name)}"
                )
        if self.top_k > self.num_experts:
            raise ConfigError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")


def _draw_ranks(rng: np.random.Generator, cdf: F64, size: int, taken: I64 | None = None) -> I64:
    """Popularity ranks (0-based) from the law with cumulative sums ``cdf``, restricted to
    the ranks not in ``taken[:, i]`` for draw i (exact: the draw on the remaining mass is
    moved past each taken interval in increasing order)::

        mass  |--r0--|--r1--|--r2--|--r3--|     taken = {r1}
        u     |--r0--|--r2--|--r3--|            u >= start(r1): u += p(r1)
    """
    if taken is None or not taken.size:
        u = rng.random(size) * cdf[-1]
    else:
        start = np.r_[0.0, cdf[:-1]]
        taken = np.sort(taken, axis=0)
        mass = cdf[taken] - start[taken]
        u = rng.random(size) * (cdf[-1] - mass.sum(axis=0))
        for t, m in zip(taken, mass, strict=True):
            u += np.where(u >= start[t], m, 0.0)
    ranks: I64 = np.searchsorted(cdf, u, side="right")
    return np.minimum(ranks, cdf.size - 1)


def _first_choices(q: ZipfParams, popularity: F64, layout: I64) -> I64:
    """First-choice experts, ``(layer, token)``: a Markov chain along tokens per layer.

    Layer by layer (tokens vectorised): fresh Zipf draws, replaced with probability ``c`` by
    the same-rank expert of the previous layer's choice, then each token keeps the previous
    token's expert with probability ``r`` (a forward fill from the last token that did not).
    """
    num_tokens, num_layers = q.num_tokens, q.num_layers
    cdfs = np.cumsum(popularity, axis=1)
    link = cross_layer_map(layout)
    fresh, reuse, linked = (np.random.default_rng([q.seed, s]) for s in (_FRESH, _REUSE, _LINK))
    positions = np.arange(num_tokens)
    out = np.empty((num_layers, num_tokens), dtype=np.int64)
    for j in range(num_layers):
        col = layout[j, _draw_ranks(fresh, cdfs[j], num_tokens)]
        if j > 0 and q.c > 0:
            col = np.where(linked.random(num_tokens) < q.c, link[j, out[j - 1]], col)
        if q.r > 0:
            stay = reuse.random(num_tokens) < q.r
            stay[0] = False
            col = col[np.maximum.accumulate(np.where(stay, 0, positions))]
        out[j] = col
    return out


def _further_choices(q: ZipfParams, popularity: F64, layout: I64, first: I64) -> I64:
    """Choices 2..k, ``(k-1, layer, token)``: successive Zipf draws without replacement
    (choice c follows the Zipf law restricted to the experts not chosen yet)."""
    k, num_tokens = q.top_k, q.num_tokens
    rng = np.random.default_rng([q.seed, _FURTHER])
    cdfs = np.cumsum(popularity, axis=1)
    ranks_of = np.argsort(layout, axis=1)
    out = np.empty((k - 1, q.num_layers, num_tokens), dtype=np.int64)
    for j in range(q.num_layers):
        taken = np.empty((k, num_tokens), dtype=np.int64)
        taken[0] = ranks_of[j, first[j]]
        for c in range(1, k):
            pick = _draw_ranks(rng, cdfs[j], num_tokens, taken[:c])
            # Rounding can leave a draw on a taken boundary (never seen; probability ~1e-16).
            clash = np.flatnonzero((pick == taken[:c]).any(axis=0))
            for _ in range(8):
                if not clash.size:
                    break
                pick[clash] = _draw_ranks(rng, cdfs[j], clash.size, taken[:c, clash])
                clash = clash[(pick[clash] == taken[:c, clash]).any(axis=0)]
            if clash.size:
                raise RuntimeError(f"zipf: {clash.size} draws keep hitting taken experts")
            taken[c] = pick
        out[:, j] = layout[j, taken[1:]]
    return out


@register_expert_generator("zipf", ZipfParams, "Per-layer Zipf popularity, reuse, correlation.")
def generate_zipf(params: ZipfParams | None = None, **overrides: object) -> ExpertTrace:
    """Synthetic MoE routing with per-layer Zipf expert popularity.

    Model. The paper's synthetic traces (Sec. 5.1, used for its Fig. 6) are i.i.d. Zipf with
    ``p_j ~ 1/(j+b)^a`` and the same law in every layer: ``r = c = a_spread = 0`` here. The
    paper publishes no statistic of real routing (per-layer skew, reuse between tokens,
    cross-layer correlation); the reuse, correlation and heterogeneity mechanisms below are
    prefixlab's own choices, stated here:

    * popularity: in each layer, popularity rank j = 1..n has probability
      ``p_j ∝ 1/(j+b)^a``; ``shuffle`` gives each layer its own seeded rank-to-expert order.
      With ``a_spread`` > 0 the exponent differs by layer (``a + a_spread * u``, ``u``
      uniform in [-1, 1]): some layers concentrated, others flat, as real routers are.
    * temporal reuse ``r``: the first choice of token t at layer j is token t-1's first choice
      at layer j with probability r (a Markov chain whose stationary law is the Zipf law).
    * cross-layer correlation ``c``: otherwise, with probability c it is the expert of the
      same popularity rank as the token's choice at layer j-1 (a fixed seeded permutation
      that keeps every layer's marginal exactly Zipf); otherwise a fresh Zipf draw.
    * ``top_k``: choices 2..k are Zipf draws without replacement excluding the first choice
      (reuse and correlation act on the first choice only); token t gives k rounds, round r
      holding every layer's r-th choice.

    Vectorised over tokens, looping over layers: 10M requests take a second or two.
    """
    q = resolve_params(ZipfParams, params, overrides, "zipf")
    return _zipf_trace(q, "zipf")


def layer_exponents(q: ZipfParams) -> F64:
    """Each layer's Zipf exponent: ``a`` everywhere, or with ``a_spread`` > 0 ``a + a_spread
    * u_j`` with ``u_j`` uniform in [-1, 1] (seeded, its own stream), at least 0."""
    if q.a_spread == 0:
        return np.full(q.num_layers, q.a)
    u = np.random.default_rng([q.seed, _SPREAD]).uniform(-1.0, 1.0, q.num_layers)
    out: F64 = np.maximum(q.a + q.a_spread * u, 0.0)
    return out


def _zipf_trace(q: ZipfParams, kind: str) -> ExpertTrace:
    popularity = np.stack([zipf_popularity(q.num_experts, a, q.b) for a in layer_exponents(q)])
    layout = zipf_layout(q.num_layers, q.num_experts, shuffle=q.shuffle, seed=q.seed)
    first = _first_choices(q, popularity, layout)
    grid = first[None]
    if q.top_k > 1:
        grid = np.concatenate([grid, _further_choices(q, popularity, layout, first)])
    return _from_grid(grid.transpose(2, 0, 1), q.num_experts, _meta(kind, q))


@dataclass(frozen=True, slots=True)
class UniformParams:
    num_layers: int = param(32, 1, "Layers l.")
    num_experts: int = param(16, 1, "Experts n per layer.")
    num_tokens: int = param(1000, 1, "Tokens; each gives top_k rounds of num_layers requests.")
    top_k: int = param(1, 1, "Distinct experts per token and layer.")
    seed: int = param(0, 0, "Random seed.")

    def validate(self) -> None:
        if self.top_k > self.num_experts:
            raise ConfigError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")


@register_expert_generator("uniform", UniformParams, "Independent uniform routing.")
def generate_uniform(params: UniformParams | None = None, **overrides: object) -> ExpertTrace:
    """Every (token, layer) picks top_k distinct experts uniformly at random (zipf with a=0)."""
    q = resolve_params(UniformParams, params, overrides, "uniform")
    z = ZipfParams(q.num_layers, q.num_experts, q.num_tokens, 0.0, top_k=q.top_k, seed=q.seed)
    trace = _zipf_trace(z, "uniform")
    return dataclasses.replace(trace, meta=_meta("uniform", q))


# ------------------------------------------------------------------------- deterministic


@dataclass(frozen=True, slots=True)
class CyclicParams:
    num_layers: int = param(4, 1, "Layers l.")
    num_experts: int = param(4, 1, "Experts n per layer.")
    num_rounds: int = param(16, 1, "Rounds (one token each).")


@register_expert_generator("cyclic", CyclicParams, "Round r uses expert r mod n everywhere.")
def generate_cyclic(params: CyclicParams | None = None, **overrides: object) -> ExpertTrace:
    """Round r requests expert ``r mod n`` in every layer (each round its own token)."""
    q = resolve_params(CyclicParams, params, overrides, "cyclic")
    column = np.arange(q.num_rounds, dtype=np.int64) % q.num_experts
    grid = np.repeat(column[:, None, None], q.num_layers, axis=2)
    return _from_grid(grid, q.num_experts, _meta("cyclic", q))


@dataclass(frozen=True, slots=True)
class Thm33Params:
    k: int = param(7, 1, "Cache capacity k the sequence is built against.")
    l: int = param(4, 1, "Layers l; k + 1 must be a multiple of l.")  # noqa: E741
    num_cycles: int = param(10, 1, "Times the k + 1 pages are requested in turn.")

    def validate(self) -> None:
        if (self.k + 1) % self.l:
            raise ConfigError(f"thm33 needs (k + 1) % l == 0, got k={self.k}, l={self.l}")


@register_expert_generator("thm33", Thm33Params, "k+1 pages in a cycle: LRU faults always.")
def generate_thm33(params: Thm33Params | None = None, **overrides: object) -> ExpertTrace:
    """The cyclic sequence of Theorem 3.3 (deterministic lower bound).

    With ``(k + 1) % l == 0``, take n = (k + 1) / l experts per layer, k + 1 pages in all,
    and request them in one fixed cyclic order that respects the layer order: round r uses
    expert ``r mod n`` in every layer, so every n rounds (k + 1 requests) each page is
    requested exactly once, ``num_cycles`` times over::

        k = 7, l = 4, n = 2:  pages 0 2 4 6 | 1 3 5 7 | 0 2 4 6 | 1 3 5 7 ...

    Theorem 3.3 of the paper: "For any l and k such that l divides k+1, Cr(LRU) >= k": with a
    cache of k pages LRU faults on every request (the page requested is always the one it
    evicted longest ago), while OPT (Belady) faults at most once per k requests after the
    cold start, so LRU's ratio approaches k.
    """
    q = resolve_params(Thm33Params, params, overrides, "thm33")
    n = (q.k + 1) // q.l
    cyc = CyclicParams(num_layers=q.l, num_experts=n, num_rounds=q.num_cycles * n)
    return dataclasses.replace(generate_cyclic(cyc), meta=_meta("thm33", q))


@dataclass(frozen=True, slots=True)
class Thm31Params:
    k: int = param(8, 1, "Cache capacity k the sequence is built against.")
    l: int = param(2, 2, "Layers l.")  # noqa: E741
    num_rounds: int = param(100, 1, "Rounds (one token each).")
    layer: int = param(0, 0, "The layer that cycles through its experts.")
    num_experts: int = param(0, 0, "Experts per layer; 0: the minimum, ceil(k/l) + 1.")

    def cycle(self) -> int:
        """Experts the cycling layer uses: one more than the largest even share ceil(k/l)."""
        return math.ceil(self.k / self.l) + 1

    def validate(self) -> None:
        if self.layer >= self.l:
            raise ConfigError(f"layer must be in [0, l={self.l}), got {self.layer}")
        pages = self.cycle() + self.l - 1
        if pages > self.k:
            raise ConfigError(
                f"thm31 uses ceil(k/l) + l = {pages} pages, more than k={self.k}: OPT could not"
                " keep them all; raise k or lower l"
            )
        if 0 < self.num_experts < self.cycle():
            raise ConfigError(f"num_experts must be >= ceil(k/l) + 1 = {self.cycle()}")


@register_expert_generator("thm31", Thm31Params, "Beats fixed per-layer partitions.")
def generate_thm31(params: Thm31Params | None = None, **overrides: object) -> ExpertTrace:
    """The Theorem 3.1 instance: fixed per-layer partitions are not competitive.

    Theorem 3.1 says a deterministic policy that gives each layer a fixed share of the
    cache has an unbounded competitive ratio. Our instance: layer ``layer`` requests its
    experts 0, 1, ..., s in turn (s = ceil(k/l), the largest share of an even split), one
    per round, while every other layer requests expert 0 each round. The s + l distinct
    pages fit in k (checked), so OPT faults only on first use, whereas a policy holding at
    most s pages of the cycling layer faults there on every round: its faults grow with
    ``num_rounds`` while OPT's stay at s + l.
    """
    q = resolve_params(Thm31Params, params, overrides, "thm31")
    grid = np.zeros((q.num_rounds, 1, q.l), dtype=np.int64)
    grid[:, 0, q.layer] = np.arange(q.num_rounds) % q.cycle()
    return _from_grid(grid, q.num_experts or q.cycle(), _meta("thm31", q))
