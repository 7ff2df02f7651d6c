"""Fleet runner throughput: replicas behind a router against one engine, on one trace.

Run: ``python benchmarks/fleet_throughput.py`` (``--quick`` for a small trace,
``--replicas 1,4,16`` and ``--router kv-aware`` to choose), or
``python benchmarks/fleet_throughput.py --mooncake 1000000`` for issue 20's scale.

The default workload is a multi-turn chat trace from the session generator (``--sessions``,
1,000 by default: about 4,900 requests), `lru` on 20,000 16-token blocks per replica,
Llama-3.1-8B/H100 power-law prefill and 20 ms per decode step, arrivals sped up with the
replica count so each replica sees about the same load. In the same run:

* ``engine``: ``simulate`` with one replica, the compiled engine (the baseline);
* ``engine (reference)``: ``simulate(..., fast=False)``, the Python loop;
* ``fleet N``: ``simulate_fleet`` with N replicas behind the router (compiled: routed
  ahead for ``round-robin``, ``random`` and ``session``, on the fleet kernel for
  ``least-loaded``, ``power-of-two`` and ``cache-aware``; ``kv-aware`` on the reference
  loop), and ``fleet N (reference)`` on the reference loop;
* ``fleet N + tiers``: the same with KV tiers below each replica's GPU memory (``--tiers``,
  by default a 100,000-block CPU pool per replica and a 400,000-block store they share,
  written back), which run on the reference loop.

``--mooncake N``: the bundled Mooncake conversation trace (12,031 requests, 512-token
blocks) repeated back to back to N requests, each copy's block ids renumbered (copies share
nothing), retimed to ``--rate`` requests/s per replica; `lru` on 20 GB of KV per replica
(298 blocks, Llama-3.1-8B), the same timing. Rows: the fleet of ``--replicas`` (32 by
default) behind each of ``--router`` (comma-separated); one replica, the compiled engine,
on the same requests (the baseline); then, per router, the fleet compiled and on the
reference loop on the first ``--reference`` requests.

Each is timed from the call to its return, after one untimed compiled run that loads the
kernels (and with the trace's block layout computed beforehand, as the engine's runs find
it); requests/s and the ratio to the baseline are printed.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.tiers import tier_of
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.loaders import load_trace
from prefixlab.workload.sources import retimed
from prefixlab.workload.trace import Trace

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake"


def tiled_mooncake(num_requests: int) -> Trace:
    """The bundled Mooncake conversation trace repeated back to back to ``num_requests``,
    each copy's block ids renumbered so copies share nothing."""
    base = load_trace(MOONCAKE / "conversation_trace.jsonl", "mooncake")
    assert base.hash_ids is not None and base.block_tokens is not None
    values, offsets = base.hash_ids
    uniq, ids = np.unique(values, return_inverse=True)
    m, span = len(base), float(base.arrival_s.max() - base.arrival_s.min())
    copies = -(-num_requests // m)
    rows = np.arange(copies * m)[:num_requests]
    copy, row = rows // m, rows % m
    lengths = np.diff(offsets)[row]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = offsets[row]
    pos = np.arange(int(new_offsets[-1])) - np.repeat(new_offsets[:-1] - starts, lengths)
    new_values = (ids[pos] + np.repeat(copy, lengths) * len(uniq)).astype(np.uint64)
    n = rows.shape[0]
    return Trace(
        arrival_s=base.arrival_s[row] + copy * (span + 1.0),
        input_length=base.input_length[row].copy(),
        output_length=base.output_length[row].copy(),
        session_id=[None] * n,
        turn=np.zeros(n, np.int64),
        task=[None] * n,
        hash_ids=(new_values, new_offsets),
        hashed_tokens=base.input_length[row].copy(),
        block_tokens=base.block_tokens,
        name=f"mooncake-x{copies}",
    )


def scale(args: argparse.Namespace) -> None:
    """Issue 20's scale: a fleet on a million Mooncake-like requests (see the module)."""
    replicas = int(args.replicas) if "," not in args.replicas else 32
    trace = retimed(tiled_mooncake(args.mooncake), request_rate=args.rate * replicas)
    timing = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
    cfg = EngineConfig(capacity_blocks=298, block_tokens=512, model="llama-3.1-8b")
    trace.block_layout(512, None, False, cfg.min_recompute_tokens)  # untimed
    head = trace.take(np.arange(min(args.reference, len(trace))))
    head.block_layout(512, None, False, cfg.min_recompute_tokens)
    small = head.take(np.arange(100))
    simulate(small, "lru", cfg, timing)  # load the kernels: the engine's, each router's fleet's
    for router in args.router.split(","):
        simulate_fleet(small, "lru", cfg, FleetConfig(2, router), timing)
    rows = []
    start = time.perf_counter()
    one = simulate(trace, "lru", cfg, timing)
    baseline = len(trace) / (time.perf_counter() - start)
    rows.append(("1 replica, compiled engine", len(trace), baseline, one.metrics))
    for router in args.router.split(","):
        start = time.perf_counter()
        res = simulate_fleet(trace, "lru", cfg, FleetConfig(replicas, router), timing)
        rate = len(trace) / (time.perf_counter() - start)
        rows.append((f"fleet {replicas} x {router}", len(trace), rate, res.engine.metrics))
    for router in args.router.split(","):
        for fast in (True, False):
            start = time.perf_counter()
            res = simulate_fleet(head, "lru", cfg, FleetConfig(replicas, router), timing, fast=fast)
            rate = len(head) / (time.perf_counter() - start)
            name = f"fleet {replicas} x {router}, {'compiled' if fast else 'reference'}"
            rows.append((name, len(head), rate, res.engine.metrics))
    print(f"trace: {trace.name}, {len(trace):,} requests at {trace.request_rate():.1f}/s")
    head_row = f"{'run':<44} {'requests':>9} {'requests/s':>11} {'x 1 replica':>11}"
    print(f"{head_row} {'hit':>6} {'P95 TTFT':>9}")
    for name, n_req, rate, m in rows:
        print(
            f"{name:<44} {n_req:>9,} {rate:>11,.0f} {rate / baseline:>11.2f} "
            f"{m['token_hit_ratio']:>6.3f} {m['p95_ttft_s']:>8.2f}s"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 sessions")
    ap.add_argument("--mooncake", type=int, default=0, help="N Mooncake-like requests")
    ap.add_argument("--rate", type=float, default=0.5, help="--mooncake: requests/s a replica")
    ap.add_argument("--reference", type=int, default=20_000, help="--mooncake: reference rows")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--replicas", default="1,4,16", help="comma-separated replica counts")
    ap.add_argument("--router", default="round-robin")
    ap.add_argument(
        "--tiers",
        default="cpu:blocks=100000 + store:blocks=400000,write=back",
        help="tier specs joined by ' + ' ('' for no tier rows)",
    )
    args = ap.parse_args()
    if args.mooncake:
        scale(args)
        return
    sessions = 200 if args.quick else args.sessions
    base = generate_sessions(num_sessions=sessions, seed=0, session_rate_per_s=2.0)
    timing = make_timing("power:preset=llama-3.1-8b-h100+tpot:s=0.02")
    cfg = EngineConfig(capacity_blocks=20_000, block_tokens=16, model="llama-3.1-8b")
    specs = [t for t in args.tiers.split(" + ") if t.strip()]
    tiered = replace(cfg, tiers=tuple(tier_of(t, cfg.model, 16) for t in specs))
    simulate(base, "lru", cfg, timing)  # load the kernels
    rows = []
    start = time.perf_counter()
    simulate(base, "lru", cfg, timing)
    baseline = len(base) / (time.perf_counter() - start)
    rows.append(("engine (compiled)", len(base), baseline))
    start = time.perf_counter()
    simulate(base, "lru", cfg, timing, fast=False)
    rows.append(("engine (reference)", len(base), len(base) / (time.perf_counter() - start)))
    for n in (int(x) for x in args.replicas.split(",")):
        trace = retimed(base, time_scale=1.0 / n)  # n times the load for n replicas
        trace.block_layout(cfg.block_tokens, None, False, cfg.min_recompute_tokens)  # untimed
        fleet = FleetConfig(n, args.router)
        runs = (("", cfg, True), (" (reference)", cfg, False), (" + tiers", tiered, True))
        for name, c, fast in runs:
            if c is tiered and not specs:
                continue
            start = time.perf_counter()
            simulate_fleet(trace, "lru", c, fleet, timing, fast=fast)
            rate = len(trace) / (time.perf_counter() - start)
            rows.append((f"fleet {n} x {args.router}{name}", len(trace), rate))
    print(f"{'run':<36} {'requests':>9} {'requests/s':>11} {'x engine':>9}")
    for name, n_req, rate in rows:
        print(f"{name:<36} {n_req:>9,} {rate:>11,.0f} {rate / baseline:>9.3f}")


if __name__ == "__main__":
    main()
