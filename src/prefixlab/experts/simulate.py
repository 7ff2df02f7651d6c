"""Expert-cache simulator: demand paging of (layer, expert) pages under one policy.

The model is the l-layer paging problem (Angelopoulos et al., Sec. 2): a trace is
a sequence of rounds, each round one page per layer in layer order, so request t belongs
to layer t mod l; page = layer * n + expert. The cache holds ``capacity`` pages and starts
empty. A fault is a request whose page is not resident; the page is then brought in, and
if the cache (for a ``-dist`` policy: the page's layer share) is full the policy names a
resident victim first. Nothing is ever prefetched or evicted without a fault::

    t:        0    1    2    3    4    5      l = 2, n = 3
    page:     0    3    1    3    0    4      layer 0: pages 0..2, layer 1: pages 3..5

Sources (the paper's Sec. 2, ``../shared/papers/moe-expert-caching.md``): there are l layers of n
experts each, and the cache stores k pages; the i-th request of the sequence is a page of
layer ((i - 1) mod l) + 1 (1-based), a round being l consecutive requests, one per layer;
a hit costs nothing, a miss costs one and, with a full cache, the algorithm evicts a page
to make room for the requested one; OPT is the offline algorithm that knows the whole
sequence, and the fault ratio to OPT is what competitive analysis bounds.

A built-in policy is a kernel (:mod:`prefixlab.experts._kernels`), its one implementation:
the ``numba`` backend runs it compiled, the ``python`` backend interpreted, with identical
faults and victims. A policy written in plain Python with hooks runs in the Python loop
below, which can also check the invariants after every step (``check=True``; a kernel's
run is checked from its record). ``prefixlab.experts.checks.check_result`` re-verifies
any recorded run from its fault mask and victims alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.experts import _kernels
from prefixlab.experts.policies import ExpertPolicy, KernelRun, PolicyContext, make_policy
from prefixlab.types import B1, I64

Mask = B1
BACKENDS = ("auto", "numba", "python")


class PagedTrace(Protocol):
    """Anything with a page sequence and its shape (``ExpertTrace`` qualifies)."""

    @property
    def pages(self) -> I64: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_experts(self) -> int: ...


TraceLike = PagedTrace | I64 | Sequence[int]


@dataclass(frozen=True, slots=True)
class ExpertResult:
    """Outcome of one simulated run.

    Attributes:
        policy: the resolved policy spec (e.g. ``"marking:seed=0"``).
        num_first_use_faults: compulsory faults (distinct pages requested); every demand
            policy starting from an empty cache pays them.
        faults_per_layer: faults of each layer's requests.
        fault_mask: per request, whether it faulted (``record=True`` only).
        victims: per request, the page evicted to serve it, -1 for none (``record=True``).
        backend: ``"numba"`` or ``"python"``.
    """

    policy: str
    capacity: int
    num_requests: int
    num_faults: int
    num_first_use_faults: int
    faults_per_layer: I64
    fault_mask: Mask | None = None
    victims: I64 | None = None
    backend: str = "python"

    @property
    def fault_rate(self) -> float:
        """Faults per request (0 for an empty trace)."""
        return self.num_faults / self.num_requests if self.num_requests else 0.0

    def to_row(self) -> dict[str, object]:
        """Scalar fields as a flat dict (a results-table row)."""
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "num_requests": self.num_requests,
            "num_faults": self.num_faults,
            "num_first_use_faults": self.num_first_use_faults,
            "fault_rate": self.fault_rate,
            "backend": self.backend,
        }


# ------------------------------------------------------------------------- validation
def resolve_trace(
    trace: TraceLike, num_layers: int | None, num_experts: int | None
) -> tuple[I64, int, int]:
    """The page array and (l, n), validated: ints in range, in layer order."""
    raw: object
    if isinstance(trace, np.ndarray | Sequence):
        if num_layers is None or num_experts is None:
            raise ConfigError("a plain page array needs num_layers and num_experts")
        raw = trace
    else:
        for name, given in (("num_layers", num_layers), ("num_experts", num_experts)):
            own = int(getattr(trace, name))
            if given is not None and given != own:
                raise ConfigError(f"{name}={given} disagrees with the trace's {name}={own}")
        raw = trace.pages
        num_layers, num_experts = int(trace.num_layers), int(trace.num_experts)
    for name, value in (("num_layers", num_layers), ("num_experts", num_experts)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    pages = np.asarray(raw)
    if pages.ndim != 1 or (pages.size and not np.issubdtype(pages.dtype, np.integer)):
        raise ConfigError(f"pages must be a 1-d integer array, got {pages.dtype} {pages.shape}")
    pages = pages.astype(np.int64, copy=False)
    _check_pages(pages, int(num_layers), int(num_experts))
    return pages, int(num_layers), int(num_experts)


def _check_pages(pages: I64, num_layers: int, num_experts: int) -> None:
    # Fast path: expert = page - layer * n must lie in [0, n) (unsigned compare), row by
    # row over whole rounds plus the partial last one; diagnostics only on failure.
    num_rounds = pages.shape[0] // num_layers
    first = np.arange(num_layers, dtype=np.int64) * num_experts
    head = pages[: num_rounds * num_layers].reshape(num_rounds, num_layers) - first
    tail = pages[num_rounds * num_layers :] - first[: pages.shape[0] - num_rounds * num_layers]
    if not (
        (head.view(np.uint64) >= num_experts).any() or (tail.view(np.uint64) >= num_experts).any()
    ):
        return
    num_pages = num_layers * num_experts
    bad = np.flatnonzero((pages < 0) | (pages >= num_pages))
    if bad.size:
        t = int(bad[0])
        raise ConfigError(
            f"pages: request {t} has page {int(pages[t])}, outside 0..{num_pages - 1} "
            f"(num_layers={num_layers} x num_experts={num_experts})"
        )
    wrong = np.flatnonzero(pages // num_experts != np.arange(pages.shape[0]) % num_layers)
    t = int(wrong[0])
    raise ConfigError(
        f"pages: request {t} has page {int(pages[t])} of layer "
        f"{int(pages[t]) // num_experts}, but request {t} belongs to layer "
        f"{t % num_layers} (t mod num_layers: layer order is enforced)"
    )


def _check_capacity(capacity: int) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
        raise ConfigError(f"capacity must be an integer >= 1 (pages), got {capacity!r}")
    return int(capacity)


def _as_policy(policy: str | ExpertPolicy, seed: int) -> ExpertPolicy:
    pol = make_policy(policy) if isinstance(policy, str) else policy
    return pol.resolve(seed)


# ------------------------------------------------------------------------ Python loop
def _replay_python(
    ctx: PolicyContext, pol: ExpertPolicy, shares: I64 | None, record: bool, check: bool
) -> KernelRun:
    """The reference loop over the policy's hooks (the structure owns residency)."""
    num_layers, n = ctx.num_layers, ctx.num_experts
    num_pages = num_layers * n
    group = num_pages if shares is None else n  # page // group = its capacity group
    caps = [ctx.capacity] if shares is None else shares.tolist()
    sizes = [0] * len(caps)
    resident = bytearray(num_pages)
    fpl = [0] * num_layers
    seq = ctx.pages.tolist()
    mask = bytearray(len(seq)) if record else bytearray()
    victims = [-1] * len(seq) if record else []
    pol.reset(ctx)
    on_hit, on_insert, choose = pol.on_hit, pol.on_insert, pol.victim
    for t, p in enumerate(seq):
        if resident[p]:
            on_hit(p, t)
        else:
            fpl[t % num_layers] += 1
            g = p // group
            if sizes[g] == caps[g]:
                v = choose(p, t)
                if v < 0 or v >= num_pages or not resident[v] or v // group != g:
                    raise RuntimeError(f"{pol.spec()} chose victim {v} at t={t}: not allowed")
                resident[v] = 0
                if record:
                    victims[t] = v
            else:
                sizes[g] += 1
            resident[p] = 1
            on_insert(p, t)
            if record:
                mask[t] = 1
        if check:
            _check_step(t, p, pol, resident, sizes, caps)
    fault_mask = np.frombuffer(bytes(mask), dtype=np.bool_).copy() if record else None
    victim_arr = np.array(victims, dtype=np.int64) if record else None
    return KernelRun(sum(fpl), np.array(fpl, dtype=np.int64), fault_mask, victim_arr)


def _check_step(
    t: int, p: int, pol: ExpertPolicy, resident: bytearray, sizes: list[int], caps: list[int]
) -> None:
    """Invariants after request t: sizes within capacity (per share), the requested page
    resident, and the policy's view equal to the structure's."""
    held = [q for q in range(len(resident)) if resident[q]]
    if len(held) != sum(sizes) or any(s > c for s, c in zip(sizes, caps, strict=True)):
        raise AssertionError(f"t={t}: sizes {sizes} exceed capacities {caps}")
    if not resident[p]:
        raise AssertionError(f"t={t}: requested page {p} is not resident after the step")
    tracked = pol.tracked()
    if sorted(tracked) != held:
        raise AssertionError(f"t={t}: policy tracks {sorted(tracked)}, cache holds {held}")


def check_record(
    seq: list[int],
    run: KernelRun,
    shares: I64 | None,
    capacity: int,
    num_layers: int,
    num_pages: int,
) -> None:
    """Replay residency from a recorded run's fault mask and victims and fail on the first
    request that breaks demand paging (see :func:`prefixlab.experts.checks.check_result`)."""
    assert run.fault_mask is not None and run.victims is not None
    group = num_pages if shares is None else num_pages // num_layers
    caps = [capacity] if shares is None else shares.tolist()
    mask, victims = run.fault_mask.tolist(), run.victims.tolist()
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


# --------------------------------------------------------------------------- simulate
def simulate(
    trace: TraceLike,
    *,
    capacity: int,
    policy: str | ExpertPolicy,
    num_layers: int | None = None,
    num_experts: int | None = None,
    seed: int = 0,
    record: bool = False,
    backend: str = "auto",
    check: bool = False,
) -> ExpertResult:
    """Replay a page sequence through a cache of ``capacity`` pages under ``policy``.

    Args:
        trace: an ``ExpertTrace`` (anything with ``pages``, ``num_layers``,
            ``num_experts``) or a plain page array (then give ``num_layers`` and
            ``num_experts``).
        capacity: cache size in pages (>= 1; >= num_layers for ``-dist`` policies).
        policy: a spec string (``"lru"``, ``"marking:seed=3"``) or a policy object.
        seed: seed of randomised policies whose spec sets none.
        record: keep the per-request fault mask and victims.
        backend: ``"auto"`` (numba when installed), ``"numba"`` or ``"python"``.
        check: check the invariants: after every request for a policy written with
            hooks, from the recorded faults and victims for a kernel.

    Raises:
        ConfigError: bad capacity, pages out of range or out of layer order, unknown
            policy, a ``-dist`` policy with capacity < num_layers, or an unavailable backend.
    """
    pages, layers, experts = resolve_trace(trace, num_layers, num_experts)
    capacity = _check_capacity(capacity)
    _check_backend_and_seed(backend, seed)
    pol = _as_policy(policy, int(seed))
    # A cache of n x l pages holds every page: a larger one behaves the same, so the run
    # sizes its arrays for at most n x l (a capacity of 10**11 costs nothing more).
    size = min(capacity, layers * experts)
    shares = pol.shares(size, layers)  # -dist below one page per layer: ConfigError
    ctx = PolicyContext(size, layers, experts, pages)
    run, used = _run_policy(ctx, pol, shares, backend, record, check)
    return _result(pol, capacity, ctx, run, used)


def _result(
    pol: ExpertPolicy, capacity: int, ctx: PolicyContext, run: KernelRun, used: str
) -> ExpertResult:
    """The run's result: ``capacity`` as asked (not the run's, capped at n x l pages), and
    the compulsory faults counted from ``ctx``'s pages."""
    pages, num_pages = ctx.pages, ctx.num_layers * ctx.num_experts
    first_use = int(np.count_nonzero(np.bincount(pages, minlength=num_pages)))
    return ExpertResult(
        pol.spec(),
        capacity,
        int(pages.shape[0]),
        run.num_faults,
        first_use,
        run.faults_per_layer,
        run.fault_mask,
        run.victims,
        used,
    )


def _check_backend_and_seed(backend: str, seed: int) -> None:
    """Raise ConfigError for an unknown or unavailable backend, then for a bad seed."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "numba" and not _kernels.COMPILED:
        why = "numba is not installed" if not _kernels.HAVE_NUMBA else "NUMBA_DISABLE_JIT is set"
        raise ConfigError(f"backend 'numba' is unavailable: {why}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")


def _run_policy(
    ctx: PolicyContext,
    pol: ExpertPolicy,
    shares: I64 | None,
    backend: str,
    record: bool,
    check: bool,
) -> tuple[KernelRun, str]:
    """Run ``pol`` over ``ctx``: its kernel where it has one (compiled unless ``backend``
    is ``"python"``), else the Python loop; the run and the backend used."""
    compiled = backend != "python" and _kernels.COMPILED
    run = pol.run_fast(ctx, record or check, compiled)
    if run is None and backend == "numba":
        raise ConfigError(
            f"backend 'numba' is unavailable for {pol.spec()}: it has no kernel "
            "(a policy written with hooks runs on the python backend)"
        )
    used = "numba" if run is not None and compiled else "python"
    if run is None:
        run = _replay_python(ctx, pol, shares, record, check)
    elif check:  # a kernel's run, checked from its record (checks.check_result's rules)
        layers, pages = ctx.num_layers, ctx.pages
        check_record(pages.tolist(), run, shares, ctx.capacity, layers, layers * ctx.num_experts)
        if not record:
            run = KernelRun(run.num_faults, run.faults_per_layer, None, None)
    return run, used


def fault_ratio_to_opt(
    trace: TraceLike,
    capacity: int,
    policies: Sequence[str],
    *,
    seed: int = 0,
    num_layers: int | None = None,
    num_experts: int | None = None,
    backend: str = "auto",
) -> dict[str, float]:
    """Each policy's faults divided by OPT's at the same capacity, keyed by the given spec.

    OPT is run once. An empty trace (OPT has no fault) gives 1.0.
    """
    pages, layers, experts = resolve_trace(trace, num_layers, num_experts)

    def faults(spec: str) -> int:
        return simulate(
            pages,
            capacity=capacity,
            policy=spec,
            num_layers=layers,
            num_experts=experts,
            seed=seed,
            backend=backend,
        ).num_faults

    opt = faults("opt")
    return {spec: faults(spec) / opt if opt else 1.0 for spec in policies}


def sweep_capacities(
    trace: TraceLike,
    capacities: Sequence[int],
    policies: Sequence[str],
    seed: int = 0,
    *,
    num_layers: int | None = None,
    num_experts: int | None = None,
    backend: str = "auto",
    skip_infeasible: bool = True,
) -> list[dict[str, object]]:
    """One row per (capacity, policy): faults, OPT's faults and the ratio to OPT.

    ``policy`` is the resolved spec (``marking:seed=0``); ``spec`` the one given.

    OPT runs once per capacity (and is reused as the row of an ``opt`` policy). With
    ``skip_infeasible`` a ``-dist`` policy is left out at capacities below the number of
    layers (it is undefined there); otherwise that raises ConfigError.
    """
    pages, layers, experts = resolve_trace(trace, num_layers, num_experts)
    rows: list[dict[str, object]] = []
    for capacity in capacities:

        def run(pol: str | ExpertPolicy, capacity: int = capacity) -> ExpertResult:
            return simulate(
                pages,
                capacity=capacity,
                policy=pol,
                num_layers=layers,
                num_experts=experts,
                seed=seed,
                backend=backend,
            )

        opt = run("opt")
        for spec in policies:
            pol = _as_policy(spec, seed)
            if skip_infeasible and pol.partitioned and capacity < layers:
                continue
            res = opt if pol.spec() == "opt" else run(pol)
            rows.append(_sweep_row(res, opt, spec, pol, seed, layers, experts))
    return rows


def _sweep_row(
    res: ExpertResult,
    opt: ExpertResult,
    spec: str,
    pol: ExpertPolicy,
    seed: int,
    layers: int,
    experts: int,
) -> dict[str, object]:
    """A sweep's row: ``res`` as a row, with the spec given, the run's shape and OPT's faults."""
    row = res.to_row()
    row.update(
        spec=spec if isinstance(spec, str) else pol.spec(),
        seed=seed,
        num_layers=layers,
        num_experts=experts,
        opt_faults=opt.num_faults,
        fault_ratio_to_opt=res.num_faults / opt.num_faults if opt.num_faults else 1.0,
    )
    return row
