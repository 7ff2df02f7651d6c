"""Functions stay short enough to read whole: at most 50 lines (issue 19, item 4).

The compiled kernels are the exception, listed below with their current length as a
ceiling: each is one numba function around an inner loop (the compiled replay and
engine steps, the expert simulators, the policy hook dispatch), where a split costs a
call per step unless numba inlines it; they may shrink, never grow, and a new long
function anywhere else fails here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import prefixlab

SRC = Path(prefixlab.__file__).parent
LIMIT = 50

#: compiled kernels (module path, function): their length now, a ceiling
KERNELS: dict[tuple[str, str], int] = {
    ("experts/_kernels.py", "_list_kernel"): 79,
    ("experts/_kernels.py", "_heap_kernel"): 72,
    ("experts/_kernels.py", "_marking_kernel"): 73,
    ("policies/_dispatch.py", "hook"): 63,
    ("policies/hooks/unicache.py", "_alg2"): 53,
    ("runner/_fast.py", "release_blocks"): 104,
    ("runner/_fast.py", "block_kernel"): 75,
    ("runner/_fast.py", "_evict"): 93,
    ("runner/_fast_hybrid.py", "_marconi_free"): 58,
    ("runner/_fast_hybrid.py", "_admit"): 80,
    ("runner/_fast_radix.py", "_pol"): 88,
    ("runner/_fast_radix.py", "_kernel"): 60,
    ("runner/_fast_radix.py", "rx_walk"): 68,
    ("runner/engine/_kernel.py", "engine_kernel"): 572,
    # a step's end and start over one replica's state, for the fleet's kernel (they repeat
    # engine_kernel's body: calling them from it cost nine times its speed), and its loop
    ("runner/engine/_kernel.py", "end_step"): 147,
    ("runner/engine/_kernel.py", "start_step"): 290,
    ("runner/engine/_fleet.py", "fleet_kernel"): 135,
}


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                yield f"{prefix}{child.name}", child.end_lineno - child.lineno + 1
                yield from visit(child, f"{prefix}{child.name}.")

    yield from visit(tree, "")


def _lengths() -> dict[tuple[str, str], int]:
    return {
        (str(path.relative_to(SRC)), name): n
        for path in sorted(SRC.rglob("*.py"))
        for name, n in _functions(path)
    }


def test_functions_are_at_most_50_lines() -> None:
    long = {
        f"{mod}:{name} ({n} lines)": n
        for (mod, name), n in _lengths().items()
        if n > LIMIT and n > KERNELS.get((mod, name), 0)
    }
    assert not long, "functions over 50 lines:\n" + "\n".join(sorted(long, key=long.get))


def test_every_listed_kernel_still_exists_and_is_long() -> None:
    lengths = _lengths()
    for key in KERNELS:
        assert lengths.get(key, 0) > LIMIT, f"{key}: gone or short now: take it off the list"
