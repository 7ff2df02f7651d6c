"""Replay the Mooncake conversation trace on the reference vLLM block pool.

Usage: python tests/reference/run_vllm_ref.py [TRACE_JSONL]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_pool_ref import replay_mooncake

DEFAULT_TRACE = "/work/shared/data/mooncake/conversation_trace.jsonl"
POOL_SIZES = (2000, 10000, 50000)


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else DEFAULT_TRACE
    for num_blocks in POOL_SIZES:
        start = time.perf_counter()
        hit, total = replay_mooncake(path, num_blocks)
        elapsed = time.perf_counter() - start
        print(
            f"num_blocks={num_blocks} num_hit_tokens={hit} num_input_tokens={total} "
            f"ratio={hit / total!r}"
        )
        print(f"  ({elapsed:.2f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
