"""Patch a checkout of Marconi's published simulator in place before comparing with it.

Usage: python tests/reference/patch_marconi_sim.py PATH_TO_CHECKOUT

Three changes (``../shared/REFERENCES.md``), each a one-expression edit of the user's own
copy (the simulator is CC BY-NC 4.0; nothing of it is copied into prefixlab):

1. ``radix_cache_hybrid.py``: the MLP term of a node's FLOP efficiency subtracts the
   parent's *attention* FLOPs; it should subtract the parent's MLP FLOPs.
2. ``radix_cache_hybrid.py``: the bytes freed by evicting a leaf are taken from ``node``,
   the last candidate scored, rather than ``node_to_evict``, the victim.
3. ``config_tuner.py``: the best alpha is picked from a dict filled in process-pool
   completion order; ties then depend on timing. Pick from the alphas in ascending order,
   so ties go to the smaller alpha and runs repeat.

Running it twice is harmless: an edit already made is reported and skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

EDITS = [
    (
        "radix_cache_hybrid.py",
        "(get_mlp_flops(seqlen_total, self.d) - get_attn_flops(seqlen_parent, self.d))",
        "(get_mlp_flops(seqlen_total, self.d) - get_mlp_flops(seqlen_parent, self.d))",
    ),
    (
        "radix_cache_hybrid.py",
        "get_kvs_size(len(node.value), self.d)",
        "get_kvs_size(len(node_to_evict.value), self.d)",
    ),
    (
        "config_tuner.py",
        "max(results, key=lambda k: results[k][2])",
        "max(sorted(results), key=lambda k: results[k][2])",
    ),
]


def patch(root: Path) -> list[str]:
    """Apply the edits; one line per edit saying what happened."""
    report = []
    for name, old, new in EDITS:
        path = root / name
        text = path.read_text()
        if new in text and old not in text:
            report.append(f"{name}: already patched")
            continue
        if text.count(old) != 1:
            raise SystemExit(f"{path}: expected the expression once: {old}")
        path.write_text(text.replace(old, new))
        report.append(f"{name}: patched")
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    for line in patch(Path(argv[1])):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
