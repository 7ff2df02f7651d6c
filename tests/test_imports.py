"""The import graph (issue 19): no module imports itself back through others.

Built by grimp (import-linter's library) from the source, imports under ``TYPE_CHECKING``
and inside functions included: a cycle through either still ties the modules together.
The last of the five cycles issue 19 found went on 2026-11-27; any new one fails here,
with the modules it ties together.
"""

from __future__ import annotations

import grimp

#: cycles not broken yet, each a strongly connected set of modules


def cycles(graph: grimp.ImportGraph) -> set[frozenset[str]]:
    """The graph's strongly connected sets of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[frozenset[str]] = set()
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.add(frozenset(comp))
    return out


def test_cycles_finds_a_cycle_and_only_cycles() -> None:
    graph = grimp.ImportGraph()
    for m in "abcde":
        graph.add_module(m)
    for a, b in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d")]:
        graph.add_import(importer=a, imported=b)
    assert cycles(graph) == {frozenset("abc"), frozenset("de")}


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("prefixlab", exclude_type_checking_imports=False)
    assert cycles(graph) == set()
