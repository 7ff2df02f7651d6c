"""Fleet runner throughput: replicas behind a router against one engine, on one trace.

Run: ``python benchmarks/fleet_throughput.py`` (``--quick`` for a small trace,
``--replicas 1,4,16`` and ``--router kv-aware`` to choose).

The workload is a multi-turn chat trace from the session generator (``--sessions``, 1,000
by default: about 4,900 requests), `lru` on 20,000 16-token blocks per replica,
Llama-3.1-8B/H100 power-law prefill and 20 ms per decode step, arrivals sped up with the
replica count so each replica sees about the same load. In the same run:

* ``engine``: ``simulate`` with one replica, the compiled engine (the baseline);
* ``engine (reference)``: ``simulate(..., fast=False)``, the Python loop the fleet runs on;
* ``fleet N``: ``simulate_fleet`` with N replicas behind the router;
* ``fleet N + tiers``: the same with KV tiers below each replica's GPU memory (``--tiers``,
  by default a 100,000-block CPU pool per replica and a 400,000-block store they share,
  written back), which the fleet runs on the same loop.

Each is timed from the call to its return, after one untimed compiled run that loads the
kernels (and with the trace's block layout computed beforehand, as the engine's runs find
it); requests/s and the ratio to the baseline are printed. The fleet runs on the
reference loop (Python): the ratio shows how far it is from the compiled engine, which is
what issue 20's scale item has to close.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from prefixlab.model.timing import make_timing
from prefixlab.runner.engine import EngineConfig, simulate
from prefixlab.runner.engine.tiers import tier_of
from prefixlab.runner.fleet import FleetConfig, simulate_fleet
from prefixlab.workload.generators import generate_sessions
from prefixlab.workload.sources import retimed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 sessions")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--replicas", default="1,4,16", help="comma-separated replica counts")
    ap.add_argument("--router", default="round-robin")
    ap.add_argument(
        "--tiers",
        default="cpu:blocks=100000 + store:blocks=400000,write=back",
        help="tier specs joined by ' + ' ('' for no tier rows)",
    )
    args = ap.parse_args()
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
        for name, c in (("", cfg), (" + tiers", tiered)):
            if c is tiered and not specs:
                continue
            start = time.perf_counter()
            simulate_fleet(trace, "lru", c, fleet, timing)
            rate = len(trace) / (time.perf_counter() - start)
            rows.append((f"fleet {n} x {args.router}{name}", len(trace), rate))
    print(f"{'run':<36} {'requests':>9} {'requests/s':>11} {'x engine':>9}")
    for name, n_req, rate in rows:
        print(f"{name:<36} {n_req:>9,} {rate:>11,.0f} {rate / baseline:>9.3f}")


if __name__ == "__main__":
    main()
