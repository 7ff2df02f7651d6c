"""Loaders stream: memory follows the kept columns (or nothing at all), not the file.

Measured with tracemalloc (numpy and array buffers are traced), never with wall-clock time.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np

from prefixlab.workload.loaders import iter_requests, load_trace
from prefixlab.workload.loaders.base import LoadOptions


def _big_native(path: Path, requests: int = 1000, tokens: int = 1000) -> int:
    """A token-form native file of ~7 MB; returns the number of token ids in it."""
    rng = np.random.default_rng(0)
    with path.open("w") as fh:
        fh.write('{"prefixlab_trace": 1}\n')
        for i in range(requests):
            ids = rng.integers(100_000, 128_000, tokens).tolist()
            fh.write(
                json.dumps(
                    {
                        "arrival_s": i * 0.1,
                        "session_id": f"s{i % 97}",
                        "input_tokens": ids,
                        "output_length": 4,
                    }
                )
                + "\n"
            )
    return requests * tokens


def _peak(fn) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_iter_requests_holds_one_request_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    _big_native(path)
    size = path.stat().st_size
    count = 0

    def consume() -> None:
        nonlocal count
        for _ in iter_requests(path):
            count += 1

    peak = _peak(consume)
    assert count == 1000
    assert peak < size / 50, (peak, size)  # a few lines' worth, not the file


def test_load_trace_holds_columns_not_text(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    n_tokens = _big_native(path)
    size = path.stat().st_size
    holder: list[object] = []
    peak = _peak(lambda: holder.append(load_trace(path)))
    columns = n_tokens * 8  # int64 token ids
    # Building the trace copies the columns once (array -> numpy): at most ~2x the columns,
    # far below what Python lists of ints would take (~36 bytes per id).
    assert peak < 2.5 * columns, (peak, columns, size)
    assert peak < n_tokens * 20


def test_filters_apply_while_streaming(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    n_tokens = _big_native(path)
    holder: list[object] = []
    opts = {"start_s": 50.0, "end_s": 60.0}
    peak = _peak(lambda: holder.append(load_trace(path, **opts)))  # type: ignore[arg-type]
    trace = holder[0]
    assert len(trace) == 100  # type: ignore[arg-type]
    # Only the 100 kept requests' columns are held, not the other 900.
    assert peak < n_tokens * 8 / 4
    kept = list(iter_requests(path, options=LoadOptions(start_s=50.0, end_s=60.0)))
    assert [r.arrival_s for r in kept] == list(trace.arrival_s)  # type: ignore[attr-defined]


def test_line_by_line_read_reports_its_progress(tmp_path: Path) -> None:
    """A JSON Lines loader reports the bytes read every 4,096 lines, inside the file."""
    from prefixlab.workload.loaders.base import load_progress

    path = tmp_path / "big.jsonl"
    _big_native(path, requests=10_000, tokens=5)
    size = path.stat().st_size
    seen: list[tuple[int, int]] = []
    with load_progress(lambda done, total: seen.append((done, total))):
        load_trace(path)
    assert len(seen) == 2  # lines 4,096 and 8,192 (the header is line 1)
    assert 0 < seen[0][0] < seen[1][0] <= size and {t for _, t in seen} == {size}
    load_trace(path)  # outside the block: no reporter, nothing reported
    assert len(seen) == 2
