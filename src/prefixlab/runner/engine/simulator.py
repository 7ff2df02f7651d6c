"""The engine runner: a discrete-event serving simulation over the same caches and policies.

::

    arrivals (open loop: trace times; closed loop: previous turn's finish + think time;
              gated: the later of the trace time and the previous turn's finish)
        |
        v
    Scheduler.schedule(now) --> Batch --> TimingModel.step_s --> step ends at now + d
        ^                                                             |
        +------------------ Scheduler.complete(batch) <---------------+

The loop handles every event at one instant (step ends first, then arrivals) before it
starts the next step, so a request arriving exactly when a step ends joins the next one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixlab.cache.block import BlockCache
from prefixlab.cache.events import Observer
from prefixlab.cache.radix import RadixCache
from prefixlab.cache.tier import AnyTier
from prefixlab.errors import CapacityError, ConfigError
from prefixlab.metrics.latency import by_task, latency_summary
from prefixlab.metrics.replay import ReplayMetrics
from prefixlab.model.spec import ModelSpec
from prefixlab.model.timing import Roofline, TimingModel
from prefixlab.policies.array_policy import ArrayPolicy
from prefixlab.policies.base import EvictionPolicy, Policy, make_policy
from prefixlab.policies.block_admission import check_structure, is_default
from prefixlab.policies.hooks.lpc import CODE as LPC_CODE
from prefixlab.runner.engine.events import Finished
from prefixlab.runner.engine.run import Run, arrival_plan
from prefixlab.runner.engine.scheduler import Scheduler
from prefixlab.runner.engine.tiers import (
    TierConfig,
    TierStack,
    check_tiers,
    gpu_evictions,
    make_tier,
)
from prefixlab.runner.replay import ReplayConfig, build_cache, reserved_blocks, without_lookups
from prefixlab.types import F64, I64, Row
from prefixlab.workload.trace import BlockLayout, Trace

if TYPE_CHECKING:
    from prefixlab.runner._fast import BlockState, PolicyArgs, Prepared
    from prefixlab.runner._fast_hybrid import HybridArrays
    from prefixlab.runner._fast_radix import RadixArgs, Tree
    from prefixlab.runner.engine.hybrid import HybridEngineCache
    from prefixlab.runner.engine.swa_radix import SwaEngineCache
    from prefixlab.runner.engine.windowed import WindowedBlockCache

    #: the arguments of ``_kernel.engine_kernel``, in order
    EngineArgs = tuple[
        BlockState, PolicyArgs, I64, F64, F64,  # the block structure and its policy
        I64, I64, I64, I64, I64, I64, I64, int, int, int, I64,  # requests, sizes, cfg
        I64, F64, I64, F64, F64, I64, F64, F64, F64,  # arrivals, timing
        F64, F64, F64, F64, I64, I64, I64, I64, I64, F64,  # outputs
        Tree | None, RadixArgs | None, int, int, HybridArrays | None, F64 | None,
    ]  # fmt: skip


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """Cache, memory and scheduler settings of one simulation."""

    capacity_blocks: int
    structure: str = "block"
    block_tokens: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    closed_loop: bool = False
    #: a session's turn arrives at its trace time or when its previous turn finishes,
    #: whichever is later (UniCache's simulator, Algorithm 3 lines 21-24: the next turn is
    #: queued when the previous completes, admitted once its timestamp is reached)
    gated: bool = False
    min_recompute_tokens: int = 1
    max_free_blocks: int | None = None
    #: cache a prompt's full blocks as soon as they are computed (vLLM v1, SGLang), so
    #: concurrent requests share them; False caches them when the request finishes, as the
    #: replay runner does
    cache_while_running: bool = True
    #: False: no lookups, the no-prefix-caching baseline (see ReplayConfig)
    prefix_caching: bool = True
    #: radix structure: pages kept free beyond a request's own, as SGLang's paged allocator
    #: does (1: one spare page per request at prefill, one free page per running request at
    #: each decode step); 0 evicts only what is needed
    spare_blocks: int = 0
    #: the hybrid structure's byte budget (KV + states of the tree and running requests)
    capacity_bytes: int | None = None
    #: the model that sizes KV and states (hybrid structure), and the memory a policy
    #: reserves for itself (LPC's predictor)
    model: str | None = None
    #: which new blocks the block or radix cache keeps (see ReplayConfig)
    admission: str = "all"
    #: tiers below GPU memory, top down: a CPU pool per replica, a store shared by the
    #: fleet (:mod:`prefixlab.runner.engine.tiers`); their blocks' bytes follow ``model``
    tiers: tuple[TierConfig, ...] = ()
    #: a request's tier loads run under the prefill of the rest of its prompt
    load_overlap: bool = False
    #: how the cache keeps a model with sliding-window layers: "window", the engine's rule
    #: (the block structure: vLLM's hybrid KV-cache manager, those layers' pages freed past
    #: the window, a hit needs the window's pages, runner/engine/windowed.py; the radix
    #: structure: SGLang's SWA radix cache, runner/engine/swa_radix.py), or "full", every
    #: layer of every block (vLLM's --disable-hybrid-kv-cache-manager)
    sliding_window_rule: str = "window"

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(
            capacity_blocks=self.capacity_blocks,
            structure=self.structure,
            block_tokens=self.block_tokens,
            max_free_blocks=self.max_free_blocks,
            min_recompute_tokens=self.min_recompute_tokens,
            prefix_caching=self.prefix_caching,
            model=self.model,
            admission=self.admission,
        )

    def validate(self) -> None:
        if self.structure == "hybrid":
            c = self.capacity_bytes
            if isinstance(c, bool) or not isinstance(c, int) or c <= 0:
                raise ConfigError(f"the hybrid structure needs capacity_bytes > 0, got {c!r}")
            if self.model is None:
                raise ConfigError("the hybrid structure needs a model (KV and state bytes)")
            if not self.prefix_caching:
                raise ConfigError("for the hybrid structure without caching use -p vanilla")
            check_structure(self.admission, self.structure)
        else:
            self.replay_config().validate()
        check_tiers(self.tiers, self.structure, self.model)
        names = ("chunked_prefill", "closed_loop", "gated", "cache_while_running", "load_overlap")
        for name in names:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        if self.closed_loop and self.gated:
            raise ConfigError("closed_loop and gated are two arrival modes: choose one")
        s = self.spare_blocks
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"spare_blocks must be an integer >= 0, got {s!r}")
        if s and self.structure != "radix":
            raise ConfigError("spare_blocks applies to the radix structure (SGLang's allocator)")
        if self.sliding_window_rule not in ("window", "full"):
            raise ConfigError(
                f"sliding_window_rule is 'window' or 'full', got {self.sliding_window_rule!r}"
            )


@dataclass(slots=True)
class EngineResult:
    """Per-request times and the summary of one simulation."""

    policy: str
    config: EngineConfig
    timing: str
    arrival_s: F64 = field(repr=False)
    scheduled_s: F64 = field(repr=False)
    first_token_s: F64 = field(repr=False)
    finish_s: F64 = field(repr=False)
    hit_tokens: I64 = field(repr=False)
    num_preemptions: I64 = field(repr=False)
    #: Any: numbers, and the nested by_task / alpha_history; callers read the numbers as such
    metrics: dict[str, Any] = field(default_factory=dict)
    num_steps: int = 0

    def as_dict(self) -> Row:
        out: Row = {
            "policy": self.policy,
            "structure": self.config.structure,
            "capacity_blocks": self.config.capacity_blocks,
            "timing": self.timing,
        }
        out.update(self.metrics)
        return out


def simulate(
    trace: Trace,
    policy: Policy | str,
    config: EngineConfig,
    timing: TimingModel,
    observers: Sequence[Observer] = (),
    check_every: int = 0,
    fast: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
) -> EngineResult:
    """Run the trace through a continuous-batching engine and return latencies and hits.

    Args:
        trace: requests in arrival order.
        policy: an unbound policy or a spec string.
        config: capacity, structure and scheduler limits.
        timing: prices each step.
        observers: see cache events and engine events (Arrived, Scheduled, FirstToken,
            Finished, Preempted, StepDone).
        check_every: check invariants (cache and scheduler) every this many steps.
        fast: run the compiled engine (:mod:`prefixlab.runner.engine._kernel`) when it
            applies: numba installed; a built-in policy (or, on the block structure, any
            keyed policy with KeyedPolicy's hooks) on the block, radix or hybrid
            structure; power, table, tpot or roofline timing; no observers or checks. It
            gives the same results as the reference (tested). Tuned Marconi's tuner (the
            replays of its bootstrap window) is called back in Python.
        on_progress: called with (requests finished, requests) as requests finish (a
            progress bar); it does not keep the compiled engine from running.
    """
    config.validate()
    pol, layout = policy_and_layout(trace, policy, config)
    hits = ReplayMetrics(len(trace))
    obs: list[Observer] = [hits, *observers]
    if on_progress is not None:
        obs.append(_FinishedCounter(on_progress, len(trace)))
    rc = structure_config(trace, pol, config, layout)
    codes = timing_codes(timing)
    if (
        fast
        and codes is not None
        and not config.tiers
        and windowed_model(config) is None
        and compiled_path(pol, rc, observers, check_every)
    ):
        return _simulate_compiled(trace, pol, config, rc, layout, timing, codes, on_progress)
    cache = reference_cache(trace, pol, config, rc, layout, obs)
    prepare_policy(pol, trace, layout)
    return _run_reference(trace, pol, config, timing, layout, cache, obs, hits, check_every)


def policy_and_layout(
    trace: Trace, policy: Policy | str, config: EngineConfig
) -> tuple[Policy, BlockLayout]:
    """The policy object and the trace's block layout (no lookups without prefix caching),
    after checking that every arrival is a number."""
    nan = np.flatnonzero(np.isnan(trace.arrival_s))
    if nan.shape[0]:  # an event at NaN would never come: the loop could not end
        raise ConfigError(f"request {int(nan[0])}: arrival_s is NaN")
    pol = make_policy(policy, config.structure) if isinstance(policy, str) else policy
    hybrid = config.structure == "hybrid"
    bt = config.block_tokens if config.block_tokens is not None or not hybrid else 16
    layout = trace.block_layout(bt, None, False, config.min_recompute_tokens)
    if not config.prefix_caching:
        layout = without_lookups(layout)
    return pol, layout


def structure_config(
    trace: Trace, pol: Policy, config: EngineConfig, layout: BlockLayout
) -> ReplayConfig | None:
    """Check that ``pol`` applies to the structure; the block or radix structure's replay
    config, less the blocks the policy reserves for itself (None: the hybrid structure)."""
    if config.structure == "hybrid":
        from prefixlab.policies.hybrid import HybridPolicy
        from prefixlab.runner.engine.hybrid import check_token_form

        if not isinstance(pol, HybridPolicy):
            raise ConfigError(f"policy '{pol.spec()}' does not apply to the hybrid structure")
        assert config.capacity_bytes is not None and config.model is not None
        check_token_form(trace)
        return None
    if not isinstance(pol, EvictionPolicy):
        raise ConfigError(f"policy '{pol.spec()}' applies to the hybrid structure only")
    rc = config.replay_config()
    reserved = reserved_blocks(pol, config.model, layout.block_tokens)
    if reserved >= rc.capacity_blocks:
        raise ConfigError(
            f"policy '{pol.spec()}' reserves {reserved:,} blocks, the whole "
            f"capacity of {rc.capacity_blocks:,}"
        )
    return dataclasses.replace(rc, capacity_blocks=rc.capacity_blocks - reserved)


def compiled_path(
    pol: Policy, rc: ReplayConfig | None, observers: Sequence[Observer], check_every: int
) -> bool:
    """Whether the compiled engine runs ``pol`` (``rc`` None: on the hybrid structure)."""
    if rc is None:
        return _hybrid_compiled_applies(pol, observers, check_every)
    assert isinstance(pol, EvictionPolicy)  # structure_config checked it
    return _compiled_applies(pol, rc, observers, check_every)


def reference_cache(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    rc: ReplayConfig | None,
    layout: BlockLayout,
    obs: list[Observer],
) -> BlockCache | RadixCache | HybridEngineCache | WindowedBlockCache | SwaEngineCache:
    """The reference loop's cache (``rc`` None: the hybrid structure's)."""
    if rc is None:
        from prefixlab.model.spec import get_model
        from prefixlab.policies.hybrid import HybridPolicy
        from prefixlab.runner.engine.hybrid import HybridEngineCache

        assert isinstance(pol, HybridPolicy)  # structure_config checked it
        assert config.capacity_bytes is not None and config.model is not None
        return HybridEngineCache(
            config.capacity_bytes, get_model(config.model), pol, trace, layout.block_tokens
        )
    assert isinstance(pol, EvictionPolicy)  # structure_config checked it
    model = windowed_model(config)
    if model is not None and config.structure == "radix":
        from prefixlab.runner.engine.swa_radix import SwaEngineCache, check_swa_radix

        check_swa_radix(pol.spec(), bool(config.tiers), is_default(config.admission))
        return SwaEngineCache(rc.capacity_blocks, model, layout.block_tokens, obs)
    if model is not None:
        from prefixlab.runner.engine.windowed import WindowedBlockCache

        check_windowed(pol, config)
        sizes = (layout.num_distinct_keys, layout.block_tokens, config.max_num_batched_tokens)
        keys, bt, budget = sizes
        return WindowedBlockCache(rc.capacity_blocks, pol, keys, model, bt, obs, budget)
    cache = build_cache(rc, pol, layout, obs)
    if isinstance(cache, RadixCache):
        cache.spare_blocks = config.spare_blocks
    return cache


def windowed_model(config: EngineConfig) -> ModelSpec | None:
    """The model whose sliding-window layers the cache keeps by the engine's rule for them
    (``sliding_window_rule = "window"``): the block structure by vLLM's hybrid manager,
    the radix structure by SGLang's SWA radix cache; or None."""
    if (
        config.structure not in ("block", "radix")
        or config.model is None
        or config.sliding_window_rule != "window"
        or not config.prefix_caching
    ):
        return None
    from prefixlab.model.spec import get_model

    model = get_model(config.model)
    if not model.num_sliding_layers:
        return None
    if config.structure == "radix":
        from prefixlab.runner.engine.swa_radix import sglang_hybrid_swa

        return model if sglang_hybrid_swa(model) else None  # SGLang: one pool for Gemma 3
    return model


def check_windowed(pol: EvictionPolicy, config: EngineConfig) -> None:
    """What the sliding-window rule does not model yet, refused with the way around it."""
    why = ""
    if pol.needs_future or pol.needs_trace:
        why = f"policy '{pol.spec()}' reads the trace's keys, which the window's pages lack"
    elif not is_default(config.admission):
        why = f"admission '{config.admission}' would count each group's pages as blocks"
    elif config.tiers:
        why = "tiers below GPU memory are not modelled with it"
    elif config.max_free_blocks is not None:
        why = "max_free_blocks is not modelled with it"
    if why:
        raise ConfigError(
            f"the sliding-window cache rule (vLLM's hybrid KV-cache manager): {why}; "
            "use sliding_window_rule = 'full' (--sliding-window-rule full)"
        )


def _run_reference(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    timing: TimingModel,
    layout: BlockLayout,
    cache: BlockCache | RadixCache | HybridEngineCache | WindowedBlockCache | SwaEngineCache,
    obs: list[Observer],
    hits: ReplayMetrics,
    check_every: int,
) -> EngineResult:
    """The reference loop: the scheduler over ``cache``, driven by the event loop."""
    sched = make_scheduler(trace, layout, cache, pol, config, obs)
    stack = None
    if config.tiers:
        tiers = [make_tier(t, layout) for t in config.tiers]
        stack = attach_tiers(sched, config, tiers, timing)
    run = Run(trace, [sched], timing, [obs], (config.closed_loop, config.gated), check_every)
    start = time.perf_counter()
    run.go()
    result = _result(trace, pol, config, timing, run, hits)
    if stack is not None:
        result.metrics.update(tier_metrics([stack], hits.hit_tokens, trace.input_length))
    result.metrics["elapsed_s"] = time.perf_counter() - start  # how long we took, for reports
    return result


def make_scheduler(
    trace: Trace,
    layout: BlockLayout,
    cache: BlockCache | RadixCache | HybridEngineCache | WindowedBlockCache | SwaEngineCache,
    pol: Policy,
    config: EngineConfig,
    obs: list[Observer],
) -> Scheduler:
    """The reference loop's scheduler of one engine over ``cache``."""
    return Scheduler(
        trace,
        layout,
        cache,
        pol,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        chunked_prefill=config.chunked_prefill,
        observers=obs,
        # the hybrid tree takes a sequence when it finishes (states exist only there)
        cache_while_running=config.cache_while_running and config.structure != "hybrid",
    )


def attach_tiers(
    sched: Scheduler, config: EngineConfig, tiers: list[AnyTier], timing: TimingModel
) -> TierStack:
    """Put ``tiers`` (the pools this replica reads; a store may be shared) below the
    scheduler's GPU cache."""
    from prefixlab.model.spec import get_model

    assert config.model is not None  # validate() checked it
    block_bytes = get_model(config.model).kv_bytes_per_block(sched.bt)
    overlap = timing if config.load_overlap else None
    stack = TierStack(config.tiers, tiers, block_bytes, len(sched.input), overlap)
    sched.tiers = stack
    sched.cache.observers.append(gpu_evictions(stack))
    return stack


def tier_metrics(stacks: Sequence[TierStack], hit_tokens: I64, input_length: I64) -> Row:
    """Per tier: the share of input tokens it served, bytes loaded and stored, evictions,
    loads that waited for a write in flight; the GPU's share; the mean wait for loads (over
    every request's first admission)."""
    out: Row = {}
    inp = int(input_length.sum())
    lower = 0
    first = stacks[0]
    for j, cfg in enumerate(first.configs):
        served = int(sum(int(s.hit_tokens[j].sum()) for s in stacks))
        lower += served
        out[f"{cfg.name}_token_hit_ratio"] = served / inp if inp else 0.0
        out[f"{cfg.name}_bytes_loaded"] = sum(s.bytes_loaded[j] for s in stacks)
        out[f"{cfg.name}_bytes_stored"] = sum(s.bytes_stored[j] for s in stacks)
        out[f"{cfg.name}_evictions"] = sum(s.num_evictions[j] for s in stacks)
        out[f"{cfg.name}_in_flight_waits"] = sum(s.in_flight_waits[j] for s in stacks)
    out["gpu_token_hit_ratio"] = (int(hit_tokens.sum()) - lower) / inp if inp else 0.0
    waits = np.sum([s.load_wait_s for s in stacks], axis=0)
    out["mean_load_wait_s"] = float(waits.mean()) if waits.shape[0] else 0.0
    return out


def prepare_policy(pol: Policy, trace: Trace, layout: BlockLayout) -> None:
    """What a policy that reads the future or the trace learns before the simulation."""
    if isinstance(pol, EvictionPolicy) and pol.needs_future:
        pol.prepare(layout)
    if isinstance(pol, EvictionPolicy) and pol.needs_trace:
        pol.prepare_trace(trace, "view")


class _FinishedCounter:
    """Reports finished requests to ``on_progress`` (about every 1% of them)."""

    def __init__(self, report: Callable[[int, int], None], total: int) -> None:
        self.report, self.total = report, total
        self.done = 0
        self.every = max(1, total // 100)

    def on_event(self, event: object) -> None:
        if isinstance(event, Finished):
            self.done += 1
            if self.done % self.every == 0 or self.done == self.total:
                self.report(self.done, self.total)


def _run_reporting(
    kernel: Callable[..., tuple[I64, F64]],
    args: tuple[object, ...],
    out: I64,
    total: int,
    report: Callable[[int, int], None],
) -> tuple[I64, F64]:
    """Run the kernel on a thread; report out[4] (finished requests) until it returns."""
    box: list[tuple[I64, F64] | BaseException] = []

    def work() -> None:
        try:
            box.append(kernel(*args))
        except BaseException as exc:  # pragma: no cover - re-raised below
            box.append(exc)

    worker = threading.Thread(target=work, name="prefixlab-engine", daemon=True)
    worker.start()
    shown = -1
    while worker.is_alive():
        worker.join(0.1)
        done = int(out[4])
        if done != shown:
            report(done, total)
            shown = done
    result = box[0]
    if isinstance(result, BaseException):  # pragma: no cover - a kernel bug
        raise result
    report(int(out[4]), total)
    return result


def _result(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    timing: TimingModel,
    run: Run,
    hits: ReplayMetrics,
) -> EngineResult:
    if run.check_every:
        run.scheds[0].check()
    history = getattr(run.scheds[0].cache, "alpha_history", None)
    return assemble(
        trace,
        pol,
        config,
        timing,
        hits,
        (run.arrival_s, run.scheduled_s, run.first_token_s, run.finish_s),
        np.array(run.scheds[0].num_preemptions, dtype=np.int64),
        run.num_steps,
        history if hasattr(pol, "current_alpha") else None,
    )


def assemble(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    timing: TimingModel,
    hits: ReplayMetrics,
    times: tuple[F64, F64, F64, F64],
    preempt: I64,
    num_steps: int,
    history: list[tuple[int, float]] | None,
) -> EngineResult:
    args = (*times, trace.input_length, trace.output_length)
    metrics: dict[str, Any] = dict(hits.summary(trace.input_length))  # Any: as EngineResult.metrics
    metrics.update(latency_summary(*args))
    metrics["num_preemptions"] = int(preempt.sum())
    metrics["num_steps"] = num_steps
    if not is_default(config.admission):
        metrics["num_admitted_blocks"] = hits.num_admitted_blocks
        metrics["num_rejected_blocks"] = hits.num_rejected_blocks
    if history is not None:  # Marconi on the hybrid tree
        metrics["alpha"] = float(pol.current_alpha)  # type: ignore[attr-defined]
        metrics["alpha_history"] = [[n, a] for n, a in history]
    metrics["by_task"] = by_task(
        trace.task,
        lambda rows: {
            **latency_summary(*args, rows=rows),
            "token_hit_ratio": _ratio(hits.hit_tokens[rows], trace.input_length[rows]),
            "num_requests": int(rows.sum()),
        },
    )
    return EngineResult(
        policy=pol.spec(),
        config=config,
        timing=timing.spec(),
        arrival_s=times[0],
        scheduled_s=times[1],
        first_token_s=times[2],
        finish_s=times[3],
        hit_tokens=hits.hit_tokens,
        num_preemptions=preempt,
        metrics=metrics,
        num_steps=num_steps,
    )


# ----------------------------------------------------------------------------- compiled
def timing_codes(timing: TimingModel) -> tuple[I64, F64, F64, F64] | None:
    """The compiled engine's encoding of a timing model (codes and a roofline's integers,
    parameters, table), or None when it has none (a model class of the user's)."""
    from prefixlab.model.timing import Composite, ConstantTPOT, PowerLaw, Roofline, TableTiming
    from prefixlab.runner.engine import _kernel as K

    pre: TimingModel | None
    dec: TimingModel | None
    lone = False
    if type(timing) is Composite:
        pre, dec = timing.prefill, timing.decode
        lone = pre is dec and pre is not None  # a lone roofline prices the mixed batch
    elif type(timing) is Roofline:
        pre = dec = timing
        lone = True
    elif type(timing) in (PowerLaw, TableTiming):
        pre, dec = timing, None
    elif type(timing) is ConstantTPOT:
        pre, dec = None, timing
    else:
        return None
    tcode = np.zeros(K.TC_WINDOW + 1, np.int64)
    tpar = np.zeros(K.TP_SIZE, np.float64)
    tt, ts = np.zeros(1), np.zeros(1)
    roof = None
    if type(pre) is PowerLaw:
        tcode[0] = K.T_POWER
        tpar[:3] = (pre.a, pre.b, pre.c)
    elif type(pre) is TableTiming:
        tcode[0] = K.T_TABLE
        tt, ts = pre.tokens.astype(np.float64), pre.seconds.astype(np.float64)
    elif type(pre) is Roofline:
        tcode[0], roof = K.T_ROOF_PREFILL, pre
    elif pre is not None:
        return None
    if type(dec) is ConstantTPOT:
        tcode[1] = K.T_TPOT
        tpar[3] = dec.s
    elif type(dec) is Roofline:
        if roof is not None and dec is not roof:
            return None  # two rooflines (not built by make_timing)
        tcode[1], roof = K.T_ROOF_DECODE, dec
    elif dec is not None:
        return None
    tcode[2] = int(lone)
    if roof is not None:
        _roofline_codes(roof, tcode, tpar)
    return tcode, tpar, tt, ts


def _roofline_codes(roof: Roofline, tcode: I64, tpar: F64) -> None:
    """A roofline's model and GPU as the kernel reads them (``_kernel.roofline_s``): the
    numbers ``ModelSpec._flops`` and ``parameters_read`` use, as the types they use."""
    from prefixlab.runner.engine import _kernel as K

    m, g = roof.model, roof.gpu
    d = float(m.hidden_size)
    d_q, d_kv = m.attention_dims()
    tcode[K.TC_E] = m.num_experts
    tcode[K.TC_K] = m.experts_per_token
    tcode[K.TC_MOE_LAYERS] = m.num_moe_layers
    per = m.kv_bytes_per_layer_token_read(roof.tp)
    tcode[K.TC_KV] = (m.num_attention_layers - m.num_sliding_layers) * per
    tcode[K.TC_STATE] = m.state_bytes_per_checkpoint
    tcode[K.TC_SWA_KV] = m.num_sliding_layers * per
    tcode[K.TC_WINDOW] = m.sliding_window
    tpar[K.TP_MODEL : K.TP_SIZE] = (
        d,
        d_kv,
        d_q,
        m.intermediate_size,
        m.mlp_matrices,
        m.moe_intermediate_size,
        m.experts_per_token,
        m.num_experts,
        float(m.ssm_d_inner),
        float(m.ssm_d_state),
        m.num_attention_layers,
        m.num_mlp_layers,
        m.num_moe_layers,
        m.num_ssm_layers,
        g.peak_flops,
        roof.mfu,
        g.mem_bandwidth,
        roof.mbu,
        *m.weight_units(),
        m.shared_expert_intermediate_size,
        m.ssm_in_proj_dim,
        m.num_sliding_layers,
        m.sliding_window,
        *m.attention_dims(decode=True),
        m.mla_context_flops,
    )


def _compiled_applies(
    pol: EvictionPolicy, rc: ReplayConfig, observers: Sequence[Observer], check_every: int
) -> bool:
    from prefixlab.runner import _fast
    from prefixlab.runner._fast_radix import radix_code

    if not _fast.HAVE_NUMBA or observers or check_every or not is_default(rc.admission):
        return False  # (the kernel caches every block)
    if rc.structure == "radix":
        return "radix" in pol.structures and radix_code(pol, engine=True) >= 0
    return rc.structure == "block" and _fast.engine_code(pol) >= 0


def _hybrid_compiled_applies(pol: Policy, observers: Sequence[Observer], check_every: int) -> bool:
    from prefixlab.policies.hybrid import HybridPolicy
    from prefixlab.runner import _fast
    from prefixlab.runner._fast_hybrid import hybrid_code

    if not _fast.HAVE_NUMBA or observers or check_every:
        return False
    return isinstance(pol, HybridPolicy) and hybrid_code(pol) >= 0


def _hybrid_arrays(
    trace: Trace, pol: Policy, config: EngineConfig, history: list[tuple[int, float]]
) -> tuple[HybridArrays, int]:
    """The compiled engine's hybrid cache (``_fast_hybrid``'s ``H``) and the id of the tuner
    it calls back (tuned Marconi: the replays of its window run here, in Python)."""
    from prefixlab.model.spec import get_model
    from prefixlab.policies.hybrid import HybridPolicy, Marconi
    from prefixlab.runner import _fast_hybrid as HF
    from prefixlab.runner.engine.hybrid import tune_on

    assert isinstance(pol, HybridPolicy) and config.capacity_bytes is not None
    assert config.model is not None
    model = get_model(config.model)
    total = config.capacity_bytes
    values, offsets = trace.sequence_tokens()
    inputs = trace.input_length.astype(np.int64)
    k = HF.HybridKernel(values, offsets, inputs, pol, model, total, "path")
    alpha, mult, every = 0.0, 1.0, 0
    if isinstance(pol, Marconi):  # as bind_cache does on the object tree
        alpha = pol.current_alpha = 0.0 if pol.alpha is None else pol.alpha
        mult, every = pol.bootstrap_multiplier, pol.retune_every

    def tuner(window: I64, lookups: int) -> float:
        assert isinstance(pol, Marconi)
        pol.current_alpha = tune_on(trace, window.copy(), pol, total, model)
        history.append((int(lookups), pol.current_alpha))
        return float(pol.current_alpha)

    tid = id(tuner)
    HF.TUNERS[tid] = tuner
    E = np.zeros(6, np.int64)
    E[HF.E_TOTAL], E[HF.E_TUNER], E[HF.E_EVERY] = total, tid, every
    hf = np.array([alpha, mult], np.float64)
    H = (k.values, k.offsets, k.inputs, k.cfg, k.tot, k.st, k.mi, E, hf, k.N, k.T, k.W)
    return H, tid


def _simulate_compiled(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    rc: ReplayConfig | None,
    layout: BlockLayout,
    timing: TimingModel,
    codes: tuple[I64, F64, F64, F64],
    on_progress: Callable[[int, int], None] | None = None,
) -> EngineResult:
    """The simulation on the compiled engine (same results as the reference loop)."""
    o = KernelOut.empty(len(trace))
    arrivals = first_arrivals(trace, config)
    start = time.perf_counter()
    history = run_compiled(trace, pol, config, rc, layout, codes, arrivals, o, on_progress)
    elapsed = time.perf_counter() - start
    hits = o.metrics(len(trace))
    result = assemble(trace, pol, config, timing, hits, o.times, o.preempt, int(o.out[2]), history)
    result.metrics["elapsed_s"] = elapsed
    return result


def run_compiled(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    rc: ReplayConfig | None,
    layout: BlockLayout,
    codes: tuple[I64, F64, F64, F64],
    arrivals: tuple[I64, F64, I64],
    o: KernelOut,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[tuple[int, float]] | None:
    """Serve ``arrivals`` (:func:`first_arrivals`'s, or a part of them) on the compiled
    engine, writing each request's times and hits into ``o`` (a request not among them is
    left alone); tuned Marconi's alpha history, else None. With ``on_progress`` the kernel
    (which releases the GIL) runs on a thread while this one reports the finished
    requests it counts in out[4]."""
    from prefixlab.runner import _fast
    from prefixlab.runner.engine import _kernel as K

    n = len(trace)
    _fast.warm_up()
    prepare_policy(pol, trace, layout)
    history: list[tuple[int, float]] = []
    s = kernel_cache(trace, pol, config, rc, layout, history)
    inp = trace.input_length.astype(np.int64)
    outp = trace.output_length.astype(np.int64)
    args = _kernel_args(trace, pol, config, layout, s, inp, outp, arrivals, codes, o)
    try:
        if on_progress is None:
            s.prep.ist, s.prep.fst = K.engine_kernel(*args)
        else:
            s.prep.ist, s.prep.fst = _run_reporting(K.engine_kernel, args, o.out, n, on_progress)
    finally:
        if s.hybrid is not None:
            from prefixlab.runner._fast_hybrid import TUNERS

            TUNERS.pop(s.tid, None)
    if isinstance(pol, ArrayPolicy):  # the policy object ends with its state, as on the reference
        pol.state = (s.prep.ist, s.prep.fst)
    check_status(pol, s, o, inp, outp, layout.block_tokens)
    return history if s.hybrid is not None and hasattr(pol, "current_alpha") else None


def first_arrivals(trace: Trace, config: EngineConfig) -> tuple[I64, F64, I64]:
    """:func:`arrival_plan` for the compiled engine, which refuses an arrival before 0."""
    arrivals = arrival_plan(trace, config.closed_loop or config.gated)
    early = np.flatnonzero(arrivals[1] < 0.0)
    if early.shape[0]:  # as the reference's loop says when it schedules it
        raise ConfigError(
            f"cannot schedule an event at {float(arrivals[1][early[0]])} s, before now (0.0 s)"
        )
    return arrivals


@dataclass(slots=True)
class KernelCache:
    """The compiled engine's cache: its capacity in blocks, the block structure's state
    (a placeholder's on the radix and hybrid structures), the tree and its policy's
    arguments (radix), the hybrid cache and its tuner's id (hybrid)."""

    cap: int
    prep: Prepared
    tree: Tree | None = None
    radix_args: RadixArgs | None = None
    rcode: int = -1
    hybrid: HybridArrays | None = None
    tid: int = 0
    max_free: int = -1


def kernel_cache(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    rc: ReplayConfig | None,
    layout: BlockLayout,
    history: list[tuple[int, float]],
    raw_keys: bool = False,
) -> KernelCache:
    """The compiled engine's cache for ``rc``'s structure (None: the hybrid structure; its
    tuner appends to ``history``). ``raw_keys``: the block structure maps the keys it
    holds to slots through a table (``_fast.kernel_state``), instead of a row per distinct
    key of the trace: a fleet's many replicas then take memory by their capacity."""
    from prefixlab.runner import _fast

    bt = layout.block_tokens
    num_keys = max(layout.num_distinct_keys, 1)
    if rc is None:  # the hybrid structure
        from prefixlab.model.spec import get_model
        from prefixlab.policies.lru import LRU
        from prefixlab.runner.engine.hybrid import capacity_blocks

        assert config.capacity_bytes is not None and config.model is not None
        cap = capacity_blocks(config.capacity_bytes, get_model(config.model), bt)
        hybrid, tid = _hybrid_arrays(trace, pol, config, history)
        prep = _fast.Prepared(LRU(), 1, bt, 1, 1, engine=True)
        return KernelCache(cap, prep, hybrid=hybrid, tid=tid)
    s: KernelCache
    if rc.structure == "radix":
        from prefixlab.policies.lru import LRU
        from prefixlab.runner import _fast_radix as R

        assert isinstance(pol, EvictionPolicy)  # simulate refuses a hybrid one here
        rcode = R.radix_code(pol, engine=True)
        cap = rc.capacity_blocks
        tree, radix_args = R.new_tree(cap), R.radix_policy_args(pol, cap, num_keys)
        # the block structure's arguments: a placeholder's (the kernel reads the tree's)
        prep = _fast.Prepared(LRU(), 1, bt, 1, 1, engine=True)
        prep.ist, prep.fst = radix_args[24], radix_args[25]
        s = KernelCache(cap, prep, tree, radix_args, rcode)
    else:
        assert isinstance(pol, EvictionPolicy)
        cap = rc.capacity_blocks
        prep = _fast.Prepared(pol, cap, bt, num_keys, 1, raw_keys=raw_keys, engine=True)
        s = KernelCache(cap, prep)
    if rc.max_free_blocks is not None:
        s.max_free = rc.max_free_blocks
    return s


@dataclass(slots=True)
class KernelOut:
    """What the compiled engine writes: per-request times (arrival, scheduled, first
    token, finish), hits, misses and preemptions, and its status (``out``, ``out_f``)."""

    times: tuple[F64, F64, F64, F64]
    first_hits: I64
    hit_blocks: I64
    miss_blocks: I64
    preempt: I64
    out: I64
    out_f: F64

    @classmethod
    def empty(cls, n: int) -> KernelOut:
        times = (np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan))
        return cls(
            times,
            np.full(n, -1, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(5, np.int64),
            np.zeros(2, np.float64),
        )

    def arrays(self) -> tuple[F64, F64, F64, F64, I64, I64, I64, I64, I64, F64]:
        """The arrays, in the order ``engine_kernel`` takes them."""
        return (
            *self.times,
            self.first_hits,
            self.hit_blocks,
            self.miss_blocks,
            self.preempt,
            self.out,
            self.out_f,
        )

    def metrics(self, n: int) -> ReplayMetrics:
        """The hit counts, as the reference's observer gathers them."""
        hits = ReplayMetrics(n)
        hits.hit_tokens = np.maximum(self.first_hits, 0)
        hits.hit_blocks = self.hit_blocks
        hits.miss_blocks = self.miss_blocks
        hits.num_evictions = int(self.out[3])
        return hits


def _kernel_args(
    trace: Trace,
    pol: Policy,
    config: EngineConfig,
    layout: BlockLayout,
    s: KernelCache,
    inp: I64,
    outp: I64,
    arrivals: tuple[I64, F64, I64],
    codes: tuple[I64, F64, F64, F64],
    o: KernelOut,
) -> EngineArgs:
    """``engine_kernel``'s arguments (``arrivals``: :func:`arrival_plan`'s)."""
    bt = layout.block_tokens
    lookups, cfg, widens = engine_inputs(trace, pol, config, layout, s)
    prep = s.prep
    block = (prep.state, prep.policy_args(), prep.ist, prep.fst, prep.nu_pos)
    think, arrival = trace.think_s.astype(np.float64), trace.arrival_s.astype(np.float64)
    sizes = (inp, outp, lookups[6], bt, s.cap, s.max_free, cfg)
    structure = (s.tree, s.radix_args, s.rcode, config.spare_blocks, s.hybrid, widens)
    return (
        *block, *lookups[:4], *sizes, *arrivals, think, arrival, *codes, *o.arrays(), *structure
    )  # fmt: skip


def engine_inputs(
    trace: Trace, pol: Policy, config: EngineConfig, layout: BlockLayout, s: KernelCache
) -> tuple[tuple[I64, I64, I64, I64, I64, I64, I64], I64, F64 | None]:
    """What every replica of the compiled engine reads alike: the requests' lookups (keys,
    their offsets, lookup blocks, lookup end, input and output lengths, full input blocks:
    the kernel's ``L``), the scheduler's limits (``cfg``) and ``W`` (a placeholder when
    the policy's state may widen, LPC's records, else None)."""
    inp = trace.input_length.astype(np.int64)
    outp = trace.output_length.astype(np.int64)
    input_keys = np.minimum(inp // layout.block_tokens, np.diff(layout.key_offsets))
    big = 1 << 62  # limits beyond any count of requests or tokens: the same as no limit
    cfg = np.array(
        [
            min(config.max_num_seqs, big),
            min(config.max_num_batched_tokens, big),
            config.chunked_prefill,
            config.cache_while_running and s.hybrid is None,
            config.gated,
        ],
        np.int64,
    )
    widens = np.zeros(1) if isinstance(pol, ArrayPolicy) and pol.code == LPC_CODE else None
    lookups = (layout.keys, layout.key_offsets, layout.num_lookup_blocks, layout.lookup_end_tokens)
    return (*lookups, inp, outp, input_keys), cfg, widens


def check_status(pol: Policy, s: KernelCache, o: KernelOut, inp: I64, outp: I64, bt: int) -> None:
    """Raise what the reference would when the kernel stopped short (``out[0]``)."""
    from prefixlab.runner.engine import _kernel as K

    status = int(o.out[0])
    if status == K.TOO_BIG:
        r = int(o.out[1])
        need = -(-(int(inp[r]) + int(outp[r])) // bt)
        raise CapacityError(
            f"request {r} needs {need} blocks of {bt} tokens ({int(inp[r])} input + "
            f"{int(outp[r])} output tokens) but the pool holds {s.cap}; raise the capacity"
        )
    if status == K.IN_PAST:
        raise ConfigError(
            f"cannot schedule an event at {float(o.out_f[0])} s, before now ({float(o.out_f[1])} s)"
        )
    if status == K.UNFINISHED:  # pragma: no cover - a scheduler bug
        raise AssertionError("simulation ended with unfinished requests")
    if status == K.NO_VICTIM:  # pragma: no cover - a policy bug (the reference raises too)
        raise AssertionError(f"policy '{pol.name}' found no victim")
    if s.hybrid is not None:  # every request finished: no node is locked any more
        from prefixlab.runner import _fast_hybrid as HF

        pins = (int(s.hybrid[5][HF.S_PIN_TOKENS]), int(s.hybrid[5][HF.S_PIN_CKPTS]))
        if pins != (0, 0):  # pragma: no cover - a bookkeeping bug
            raise AssertionError(f"locked tokens and checkpoints left at the end: {pins}")


def _ratio(a: I64, b: I64) -> float:
    total = int(b.sum())
    return int(a.sum()) / total if total else 0.0
