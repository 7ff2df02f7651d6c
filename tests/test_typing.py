"""Public signatures say what they take and give: no ``typing.Any`` in the parameters or
return type of a public function or method of the library (issue 19, item 4).

Public: the name, its class and its module all without a leading underscore. The command
line (``prefixlab.cli``) is left out: its callbacks take what typer and rich hand them.
Where ``Any`` is the honest type (an object of an optional, untyped library such as
sentence-transformers or transformers; keyword arguments forwarded unchanged), the
signature carries a ``# Any: <reason>`` comment, and this test accepts it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import prefixlab

SRC = Path(prefixlab.__file__).parent


def _mentions_any(node: ast.AST | None) -> bool:
    return node is not None and any(
        isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(node)
    )


def _annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST | None]:
    a = fn.args
    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
        if arg is not None:
            yield arg.annotation
    yield fn.returns


def _public_any(path: Path, root: Path = SRC.parent) -> Iterator[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()

    def visit(node: ast.AST, private: bool) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, private or child.name.startswith("_"))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                hidden = private or (child.name.startswith("_") and not child.name.startswith("__"))
                signature = lines[child.lineno - 1 : max(child.body[0].lineno - 1, child.lineno)]
                justified = any("# Any:" in line for line in signature)
                if not hidden and not justified and any(map(_mentions_any, _annotations(child))):
                    yield f"{path.relative_to(root)}:{child.lineno} {child.name}"
                # a function's inner functions are not public

    module_private = path.name.startswith("_") and path.name != "__init__.py"
    yield from visit(ast.parse(text), module_private)


def test_no_any_in_public_signatures() -> None:
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if "cli" not in path.relative_to(SRC).parts
        for hit in _public_any(path)
    ]
    assert not found, "typing.Any in public signatures:\n" + "\n".join(found)


def test_the_check_finds_a_public_any(tmp_path: Path) -> None:
    """The scan is not vacuous: it flags what it should, and only that."""
    text = """
from typing import Any
def public(x: Any) -> int: ...
def _private(x: Any) -> int: ...
def returns() -> list[Any]: ...
def justified(x: Any) -> int: ...  # Any: a torch module
class _Hidden:
    def method(self, x: Any) -> None: ...
class Shown:
    def method(self, *args: Any) -> None: ...
"""
    path = tmp_path / "mod.py"
    path.write_text(text, encoding="utf-8")
    hits = [h.split(" ")[1] for h in _public_any(path, tmp_path)]
    assert hits == ["public", "returns", "method"]
