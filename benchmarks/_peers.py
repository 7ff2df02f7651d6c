"""Time two peer KV-cache simulators on the same block stream as prefixlab.

Standard library only: each peer runs as a subprocess in its own virtual environment, so
``benchmarks/replay_throughput.py`` can print prefixlab's throughput beside theirs::

    from _peers import run_peers
    rows = run_peers("trace.jsonl", capacity_blocks=20_000, block_tokens=16, repeat=3)

Input: a hash-form JSONL trace as ``prefixlab.workload.loaders.native.write_native`` writes
it (a header line, then one request per line with ``hash_ids``, ``input_length``,
``output_length``, ...). Both peers read the same block stream: every request's
``hash_ids`` in order (input and output blocks, the trailing partial block included), one
access per block, capacity in blocks.

Peers (a missing venv is created with ``python3 -m venv`` + ``pip install``; a peer that
cannot be set up or run gives rows with ``error`` set, never an exception):

* KVCache.AI ``kvcache-simulator`` 0.1.3 (``/tmp/kvsim``). Python parses the JSONL
  (``kvcache_sim.trace.parse_trace_file``, untimed) into interned ids, per-block token
  weights and request ends, and writes them as binary arrays; its C++ program
  (``kvcache_sim.cpp_backend.ensure_cpp_simulator``) then replays one policy per process.
  That process also reads the arrays and builds its prefix trie and next-use table, which
  cannot be timed apart from inside; its sweep mode (``--policy batch``, several
  capacities) does that once and then one replay per capacity, so ``seconds`` is
  (time of k replays - time of 1) / (k - 1) at the same capacity (``replays_per_batch``
  = k). ``seconds_total`` is one end-to-end single-policy run, ``seconds_setup`` the same
  run at capacity 0 (everything but the replay). Policies: lru and
  optimal are trie policies (only leaves are evicted, never the current request's path);
  fifo is a plain FIFO over blocks. Hits are prefix hits (a block counts only while every
  earlier block of the request hit), counted only on the requests after the warm-up (the
  first ``KVSIM_WARMUP_FRACTION`` of requests, the package default 0.5); when the cache
  never fills during the warm-up the peer reports no hit rate (``error`` says so).
  ``hit_ratio`` is block-weighted (the program run with every block weighing 1 token);
  ``token_hit_ratio`` is the peer's own token-weighted figure.
* libCacheSim's Python package ``libcachesim`` 0.3.5 (``/tmp/prefixlab-libcachesim``). The
  stream is interned and written (untimed) as an oracleGeneral binary trace (clock time,
  object id, size 1, next access index), whose next-access field Belady reads; ``seconds``
  is ``cache.process_trace(reader)`` (the C replay loop, reading the memory-mapped trace).
  Every access counts: ``hit_ratio`` is 1 - the object miss ratio over the whole stream;
  ``hit_ratio_window`` is the ratio over the same measured requests as kvcache-simulator's
  (the cache warmed on the earlier ones, untimed).

Run ``python benchmarks/_peers.py`` (prefixlab's venv) for a small self-check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

KVSIM = "kvcache-simulator"
LIBCACHESIM = "libCacheSim"
#: peer -> (venv directory, pip requirement, import name)
PEER_ENVS: dict[str, tuple[str, str, str]] = {
    KVSIM: ("/tmp/kvsim", "kvcache-simulator==0.1.3", "kvcache_sim"),
    LIBCACHESIM: ("/tmp/prefixlab-libcachesim", "libcachesim==0.3.5", "libcachesim"),
}
#: kvcache-simulator measures hits after this fraction of requests (its default)
KVSIM_WARMUP_FRACTION = 0.5
#: kvcache-simulator's replay time is timed over a batch of replays lasting about this long
KVSIM_BATCH_TARGET_S = 0.3
#: seconds allowed for one peer's whole run (all policies and repeats)
TIMEOUT_S = 3600
POLICIES = ("lru", "fifo", "opt")

# ---------------------------------------------------------------------------------------
# Drivers, run with the peer's own interpreter: ``python -c DRIVER CONFIG_JSON``. Each
# prints one JSON object: {"rows": [...]} or {"error": "..."}.

_KVSIM_DRIVER = r"""
import json, math, subprocess, sys, tempfile, time, traceback
from array import array
from pathlib import Path

def main(cfg):
    import kvcache_sim
    from kvcache_sim.cpp_backend import _write_binary_trace, ensure_cpp_simulator
    from kvcache_sim.simulator import warmup_requests_for_trace
    from kvcache_sim.trace import parse_trace_file

    t = time.perf_counter()
    trace = parse_trace_file(cfg["trace"], block_size=cfg["block_tokens"])
    parse_s = time.perf_counter() - t
    binary = str(ensure_cpp_simulator())
    warm = warmup_requests_for_trace(trace, cfg["warmup_fraction"])
    n = len(trace.ids)
    rows = []
    with tempfile.TemporaryDirectory(prefix="prefixlab-kvsim-") as tmp:
        files = _write_binary_trace(trace, Path(tmp))
        ones = Path(tmp) / "ones.u16"  # every block weighs 1: hitTokens = hit blocks
        with ones.open("wb") as fh:
            (array("H", [1]) * n).tofile(fh)

        base = [binary, "--ids", str(files.ids), "--request-ends", str(files.request_ends),
                "--request-count", str(trace.request_count), "--total-blocks", str(n),
                "--warmup-requests", str(warm)]

        def timed(args):
            t0 = time.perf_counter()
            out = subprocess.run(base + args, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            if out.returncode != 0:
                raise RuntimeError(f"{args}: exit {out.returncode}: {out.stderr.strip()}")
            return dt, json.loads(out.stdout)

        def single(policy, capacity, tokens=ones):
            return timed(["--policy", policy, "--capacity", str(capacity), "--tokens", str(tokens)])

        def batch(policy, k):
            # The program's sweep mode: one load, one trie build, k replays (all at the same
            # capacity, each from an empty cache).
            caps = ",".join([str(cfg["capacity"])] * k)
            return timed(["--policy", "batch", "--policies", policy, "--capacities", caps,
                          "--tokens", str(ones)])[0]

        repeat = cfg["repeat"]
        # Capacity 0: the program loads the arrays, builds the trie and next-use table and
        # stops (no replay): the setup inside every end-to-end run.
        setup_s = min(single("fifo", 0)[0] for _ in range(repeat))
        for pol in cfg["policies"]:
            name = {"opt": "optimal"}.get(pol, pol)
            row = {"policy": pol, "num_accesses": n, "seconds_parse": parse_s,
                   "seconds_setup": setup_s, "measured_from_request": warm,
                   "num_requests": trace.request_count, "version": kvcache_sim.__version__,
                   "error": None}
            if name not in ("lru", "fifo", "optimal"):
                row.update(seconds=None, seconds_total=None, hit_ratio=None,
                           error=f"kvcache-simulator has no policy {pol!r}")
                rows.append(row)
                continue
            runs = [single(name, cfg["capacity"]) for _ in range(repeat)]
            total_s = min(r[0] for r in runs)
            blocks = runs[0][1]
            tokens = single(name, cfg["capacity"], files.tokens)[1]  # the peer's own weights
            # Replay time: (batch of k replays - batch of 1) / (k - 1), k sized so that the
            # replays outweigh process start-up noise.
            guess = max(total_s - setup_s, 1e-5)
            k = 1 + min(max(2, math.ceil(cfg["batch_target_s"] / guess)), 200)
            one = min(batch(name, 1) for _ in range(repeat))
            many = min(batch(name, k) for _ in range(repeat))
            row.update(seconds=max(many - one, 0.0) / (k - 1), seconds_total=total_s,
                       replays_per_batch=k, num_measured_accesses=blocks["totalTokens"],
                       num_hit_blocks=blocks["hitTokens"], hit_ratio=blocks["hitRate"],
                       token_hit_ratio=tokens["hitRate"])
            if blocks["measurementStartRequest"] == -2:
                row.update(hit_ratio=None, token_hit_ratio=None,
                           error=f"underfilled: the cache of {cfg['capacity']} blocks never "
                                 f"filled during the {warm} warm-up requests, so "
                                 "kvcache-simulator reports no hit rate")
            rows.append(row)
    return rows

cfg = json.loads(sys.argv[1])
try:
    print(json.dumps({"rows": main(cfg)}))
except Exception:
    print(json.dumps({"error": traceback.format_exc(limit=3).strip()}))
"""

_LCS_DRIVER = r"""
import json, math, struct, sys, tempfile, time, traceback
from pathlib import Path

NEVER = 2**63 - 1

def main(cfg):
    import libcachesim as lcs

    ids, ends, intern = [], [], {}
    t = time.perf_counter()
    with open(cfg["trace"], encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            hs = rec.get("hash_ids") if isinstance(rec, dict) else None
            if not isinstance(hs, list) or not hs:
                continue  # the header line, or a request without blocks
            ids.extend(intern.setdefault(h if isinstance(h, int) else str(h), len(intern))
                       for h in hs)
            ends.append(len(ids))
    parse_s = time.perf_counter() - t
    n = len(ids)
    if n == 0:
        raise ValueError("no hash_ids in the trace")
    nxt = [NEVER] * n  # next access index of each access (Belady's oracle)
    last = {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(ids[i], NEVER)
        last[ids[i]] = i
    warm_req = max(0, min(len(ends), math.floor(len(ends) * cfg["warmup_fraction"])))
    warm = ends[warm_req - 1] if warm_req else 0  # first access of the measured requests
    classes = {"lru": lcs.LRU, "fifo": lcs.FIFO, "opt": lcs.Belady}
    rows = []
    with tempfile.TemporaryDirectory(prefix="prefixlab-lcs-") as tmp:
        path = str(Path(tmp) / "stream.oracleGeneral.bin")
        rec = struct.Struct("<IQIq")  # clock_time, obj_id, obj_size, next_access_vtime
        req_of = [0] * n
        for r, (a, b) in enumerate(zip([0] + ends[:-1], ends)):
            req_of[a:b] = [r] * (b - a)
        with open(path, "wb") as fh:
            fh.write(b"".join(rec.pack(r, x, 1, nx) for r, x, nx in zip(req_of, ids, nxt)))
        oracle = lcs.TraceType.ORACLE_GENERAL_TRACE
        for pol in cfg["policies"]:
            row = {"policy": pol, "num_accesses": n, "seconds_parse": parse_s,
                   "measured_from_request": warm_req, "num_requests": len(ends),
                   "version": getattr(lcs, "__version__", None), "error": None}
            cls = classes.get(pol)
            if cls is None:
                row.update(seconds=None, hit_ratio=None, error=f"no policy {pol!r} here")
                rows.append(row)
                continue
            best, miss = None, None
            for _ in range(cfg["repeat"]):
                reader = lcs.TraceReader(path, oracle)
                cache = cls(cfg["capacity"])
                t0 = time.perf_counter()
                miss, _byte_miss = cache.process_trace(reader)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
                if cache.get_n_obj() > cfg["capacity"]:
                    raise RuntimeError("cache holds more objects than its capacity")
            # The measured window: warm on the first requests, then count the rest.
            reader = lcs.TraceReader(path, oracle)
            cache = cls(cfg["capacity"])
            if warm:
                cache.process_trace(reader, 0, warm)
            win_miss = cache.process_trace(reader, warm, -1)[0] if warm < n else None
            row.update(seconds=best, hit_ratio=1.0 - miss,
                       hit_ratio_window=None if win_miss is None else 1.0 - win_miss,
                       num_measured_accesses=n - warm)
            rows.append(row)
    return rows

cfg = json.loads(sys.argv[1])
try:
    print(json.dumps({"rows": main(cfg)}))
except Exception:
    print(json.dumps({"error": traceback.format_exc(limit=3).strip()}))
"""

_NOTES = {
    KVSIM: (
        "C++ replay; seconds = (batch of k replays - batch of 1) / (k - 1) in one process "
        "(excludes array load, trie and next-use build, process start; one end-to-end run "
        "is seconds_total, its setup seconds_setup); JSONL parsing (seconds_parse) untimed. "
        "lru/opt: trie "
        "policies (evict leaves only, never the current request's path; opt may bypass); "
        "fifo: plain FIFO over blocks. hit_ratio = prefix-hit blocks / blocks of the "
        "requests after the warm-up (measured_from_request); token_hit_ratio = the peer's "
        "token-weighted rate"
    ),
    LIBCACHESIM: (
        "seconds = cache.process_trace(reader) on an oracleGeneral binary stream (C loop "
        "plus reading the mmapped records), parsing and conversion untimed; every block "
        "access is a lookup and counts (no prefix rule, no pinning; Belady always admits); "
        "hit_ratio over the whole stream, hit_ratio_window over kvcache-simulator's "
        "measured requests"
    ),
}


def _ensure_env(peer: str) -> tuple[str | None, str | None]:
    """The peer's interpreter, creating and filling its venv if needed: (python, error)."""
    venv, requirement, module = PEER_ENVS[peer]
    python = os.path.join(venv, "bin", "python")

    def importable() -> bool:
        if not os.path.exists(python):
            return False
        probe = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300
        )
        return probe.returncode == 0

    try:
        if importable():
            return python, None
        if not os.path.exists(python):
            base = shutil.which("python3") or sys.executable
            made = subprocess.run(
                [base, "-m", "venv", venv], capture_output=True, text=True, timeout=600
            )
            if made.returncode != 0:
                return None, f"python3 -m venv {venv} failed: {made.stderr.strip()[-500:]}"
        pip = subprocess.run(
            [python, "-m", "pip", "install", "-q", requirement],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if pip.returncode != 0:
            return None, f"pip install {requirement} failed: {pip.stderr.strip()[-500:]}"
        if not importable():
            return None, f"{module} does not import in {venv} after installing {requirement}"
        return python, None
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot set up {venv}: {exc!r}"


def _failed(peer: str, policies: tuple[str, ...], error: str) -> list[dict[str, Any]]:
    return [
        {
            "peer": peer,
            "policy": p,
            "seconds": None,
            "num_accesses": None,
            "hit_ratio": None,
            "note": f"{peer} unavailable",
            "error": error,
        }
        for p in policies
    ]


def _run_peer(peer: str, driver: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    policies = tuple(cfg["policies"])
    python, error = _ensure_env(peer)
    if python is None:
        return _failed(peer, policies, error or "unavailable")
    try:
        out = subprocess.run(
            [python, "-c", driver, json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return _failed(peer, policies, f"{peer} run failed: {exc!r}")
    lines = out.stdout.strip().splitlines()
    try:
        payload = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        payload = {}
    if "rows" not in payload:
        detail = payload.get("error") or out.stderr.strip()[-1000:] or f"exit {out.returncode}"
        return _failed(peer, policies, f"{peer} run failed: {detail}")
    rows = []
    for raw in payload["rows"]:
        row = {
            "peer": peer,
            "policy": raw.pop("policy"),
            "seconds": raw.pop("seconds"),
            "num_accesses": raw.pop("num_accesses"),
            "hit_ratio": raw.pop("hit_ratio"),
            "note": _NOTES[peer],
            "error": raw.pop("error"),
        }
        row.update(raw)  # extras: seconds_total, token_hit_ratio, hit_ratio_window, ...
        rows.append(row)
    return rows


def run_peers(
    trace_jsonl: str,
    capacity_blocks: int,
    block_tokens: int,
    policies: tuple[str, ...] | list[str] = POLICIES,
    repeat: int = 1,
) -> list[dict[str, Any]]:
    """Replay ``trace_jsonl`` through each peer and policy; one dict per (peer, policy).

    Keys: peer, policy, seconds (best of ``repeat``, replay only as far as the peer allows:
    see ``note``), num_accesses (blocks replayed), hit_ratio (block hit ratio as the peer
    counts it), note, error (None, or why the row has no numbers); plus peer-specific
    extras (seconds_parse, seconds_setup, seconds_total, token_hit_ratio, hit_ratio_window,
    measured_from_request, num_measured_accesses, version).
    """
    policies = tuple(policies)
    cfg = {
        "trace": str(Path(trace_jsonl).resolve()),
        "capacity": int(capacity_blocks),
        "block_tokens": int(block_tokens),
        "policies": list(policies),
        "repeat": max(1, int(repeat)),
        "warmup_fraction": KVSIM_WARMUP_FRACTION,
        "batch_target_s": KVSIM_BATCH_TARGET_S,
    }
    if not Path(trace_jsonl).is_file():
        err = f"no trace file {trace_jsonl}"
        return _failed(KVSIM, policies, err) + _failed(LIBCACHESIM, policies, err)
    return _run_peer(KVSIM, _KVSIM_DRIVER, cfg) + _run_peer(LIBCACHESIM, _LCS_DRIVER, cfg)


def _demo() -> int:
    """Generate a small trace with prefixlab, run the peers and prefixlab, print the rows."""
    import time

    from prefixlab.runner.replay import ReplayConfig, replay
    from prefixlab.workload.generators.sessions import generate_sessions
    from prefixlab.workload.loaders.native import write_native
    from prefixlab.workload.trace import to_hash_form

    block_tokens = 16
    tok = generate_sessions(
        num_sessions=40,
        session_rate_per_s=0.5,
        preset="agentic",
        mean_turns=8,
        max_turns=20,
        system_tokens=2048,
        num_system_prompts=8,
        mean_user_tokens=384,
        mean_output_tokens=256,
        seed=0,
    )
    trace = to_hash_form(tok, block_tokens)
    layout = trace.block_layout()
    capacity = max(2000, int(layout.num_blocks_held.max()))
    with tempfile.TemporaryDirectory(prefix="prefixlab-peers-") as tmp:
        path = os.path.join(tmp, "trace.jsonl")
        write_native(trace, path)
        print(
            f"trace: {len(trace)} requests, {layout.num_distinct_keys} distinct full-block "
            f"keys; capacity {capacity} blocks"
        )
        t = time.perf_counter()
        rows = run_peers(path, capacity, block_tokens, repeat=3)
        print(f"peers ran in {time.perf_counter() - t:.1f}s")
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "note"}))
    for peer in (KVSIM, LIBCACHESIM):
        print(f"note {peer}: {_NOTES[peer]}")
    ok = True
    for peer in (KVSIM, LIBCACHESIM):
        got = {r["policy"]: r for r in rows if r["peer"] == peer and r["error"] is None}
        for r in got.values():
            ok &= 0.0 <= r["hit_ratio"] <= 1.0
        if "lru" in got and "opt" in got:
            ok &= got["lru"]["hit_ratio"] <= got["opt"]["hit_ratio"]
        ok &= len(got) == len(POLICIES)
    for spec in POLICIES:
        res = replay(trace, spec, ReplayConfig(capacity_blocks=capacity))
        m = res.metrics
        print(
            f"prefixlab {spec:<4} block_hit_ratio {m['block_hit_ratio']:.4f} "
            f"token_hit_ratio {m['token_hit_ratio']:.4f} "
            f"({m['num_lookup_blocks']} lookup blocks, {res.elapsed_s * 1e3:.1f} ms)"
        )
    print("sane (hit ratios in [0, 1], lru <= opt, no errors):", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_demo())
