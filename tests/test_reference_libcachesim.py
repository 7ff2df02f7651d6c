"""The classic eviction policies against libCacheSim (PyPI ``libcachesim``), access by access.

Runs where ``PREFIXLAB_LIBCACHESIM_PYTHON`` names a Python with libCacheSim installed (a
separate environment; ``.ci/run`` makes one and runs this file); skipped with that reason
elsewhere. The driver is ``tests/reference/libcachesim_run.py``.

The stream: Zipf-popular object ids (two skews), each request a one-block, hash-form
prompt with nothing recomputed (``min_recompute_tokens=0``), so prefixlab's block cache is a
plain cache of objects: a request hits or misses its one block, then holds it. LRU, FIFO,
LFU, ARC, SIEVE and Belady's OPT give the same hit or miss on every access. S3-FIFO and
LeCaR differ by choices libCacheSim makes that their papers do not (``docs/policies.md``,
"Against libCacheSim"): they must stay close, and the test says how close.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from prefixlab.runner.replay import ReplayConfig, replay
from prefixlab.workload.trace import Request, Trace
from tests.reference.drivers import json_lines

ENV = "PREFIXLAB_LIBCACHESIM_PYTHON"
PYTHON = os.environ.get(ENV)
pytestmark = pytest.mark.skipif(not PYTHON, reason=f"set {ENV} to a Python with libcachesim")
EXACT = ["lru", "fifo", "lfu", "arc", "sieve", "opt"]
CLOSE = ["s3fifo", "lecar"]
CAPACITIES = [100, 300]


def _stream(skew: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, 2001) ** skew
    return rng.choice(2000, size=20_000, p=p / p.sum())


def _theirs(
    ids: np.ndarray, tmp: Path, policies: list[str] | None = None
) -> dict[tuple[str, int], np.ndarray]:
    path = tmp / "stream.txt"
    path.write_text(" ".join(map(str, ids.tolist())))
    assert PYTHON is not None
    rows = json_lines(
        PYTHON,
        "libcachesim_run.py",
        str(path),
        ",".join(policies or EXACT + CLOSE),
        ",".join(map(str, CAPACITIES)),
    )
    return {(r["policy"], r["capacity"]): np.array(r["hits"], dtype=bool) for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("skew", [0.8, 1.0])
def test_policies_equal_libcachesim_per_access(tmp_path: Path, skew: float) -> None:
    ids = _stream(skew)
    trace = Trace.from_requests(
        (Request(float(i), 16, 0, hash_ids=[int(x)]) for i, x in enumerate(ids)), block_tokens=16
    )
    theirs = _theirs(ids, tmp_path)
    for (policy, cap), want in theirs.items():
        cfg = ReplayConfig(capacity_blocks=cap, block_tokens=16, min_recompute_tokens=0)
        got = replay(trace, policy, cfg).hit_tokens > 0
        if policy in EXACT:
            assert np.array_equal(got, want), (policy, cap, np.flatnonzero(got != want)[:5])
        else:  # measured: 98.2-99.4% of accesses agree, hit totals within 0.7%
            assert np.mean(got == want) >= 0.98, (policy, cap)
            assert abs(int(got.sum()) - int(want.sum())) <= 0.01 * want.sum(), (policy, cap)


def _with_admission(ids: list[int], cap: int, fifo: bool, evict_on_refusal: bool) -> np.ndarray:
    """LRU (or FIFO) of ``cap`` objects behind an admission that takes an object from its
    second miss. ``evict_on_refusal``: a refused miss still takes room while its request
    runs (an engine computes its KV in a block of the pool), so a full cache evicts one
    object for it and keeps the freed room empty."""
    cache: OrderedDict[int, None] = OrderedDict()
    misses: dict[int, int] = {}
    hits = np.zeros(len(ids), dtype=bool)
    for i, x in enumerate(ids):
        if x in cache:
            hits[i] = True
            if not fifo:
                cache.move_to_end(x)
            continue
        misses[x] = misses.get(x, 0) + 1
        admit = misses[x] >= 2
        if (admit or evict_on_refusal) and len(cache) >= cap:
            cache.popitem(last=False)
        if admit:
            cache[x] = None
    return hits


@pytest.mark.slow
@pytest.mark.parametrize("skew", [0.8, 1.0])
def test_seen_admission_against_libcachesim_bloomfilter(tmp_path: Path, skew: float) -> None:
    """``seen:n=2`` vs libCacheSim's BloomFilterAdmissioner (an exact count despite the
    name). They differ by one thing, and only that: libCacheSim refuses an object without
    making room, while a refused block was computed in the pool and took a block while its
    request ran (measured: 0-0.5% of hits apart). With the refusal taking room, LRU and FIFO
    are equal access by access to a model of each; without it, libCacheSim is."""
    ids = _stream(skew)
    trace = Trace.from_requests(
        (Request(float(i), 16, 0, hash_ids=[int(x)]) for i, x in enumerate(ids)), block_tokens=16
    )
    policies = ["lru", "fifo", "lfu", "sieve"]
    theirs = _theirs(ids, tmp_path, [f"{p}+bloomfilter" for p in policies])
    for (spec, cap), want in theirs.items():
        policy = spec.split("+")[0]
        cfg = ReplayConfig(capacity_blocks=cap, min_recompute_tokens=0, admission="seen:n=2")
        got = replay(trace, policy, cfg).hit_tokens > 0
        assert abs(int(got.sum()) - int(want.sum())) <= 0.01 * want.sum(), (spec, cap)
        if policy in ("lru", "fifo"):
            fifo = policy == "fifo"
            ours = _with_admission(ids.tolist(), cap, fifo, evict_on_refusal=True)
            assert np.array_equal(got, ours), (spec, cap)
            assert np.array_equal(want, _with_admission(ids.tolist(), cap, fifo, False))
