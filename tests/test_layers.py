"""The layers of the house (issue 19; drawn in docs/architecture.md): a package imports
only packages of the layers below it, never one above, directly or through others, and
the packages of one layer never import each other.

Checked by grimp (import-linter's library) over the source, imports inside functions and
under ``TYPE_CHECKING`` included.
"""

from __future__ import annotations

import grimp

#: top to bottom; the packages of one layer are independent
LAYERS: list[set[str]] = [
    {"cli"},
    {"studies", "reproduce"},
    {"experts", "analysis"},
    {"report"},
    {"experiments"},
    {"runner"},
    {"metrics", "policies", "routers"},
    {"learn", "cache"},
    {"workload", "model"},
    {"configfile", "procs", "registry", "io", "_keytable"},
    {"_jit", "errors", "types"},
]


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("prefixlab", exclude_type_checking_imports=False)


def test_every_package_has_its_layer() -> None:
    names = {m.split(".")[1] for m in _graph().modules if m.count(".") >= 1} - {"__main__"}
    placed = [name for layer in LAYERS for name in layer]
    assert len(placed) == len(set(placed)), "a package is in two layers"
    assert names == set(placed), f"unplaced: {sorted(names - set(placed))}"


def _route(route: grimp.Route) -> str:
    return " -> ".join([min(route.heads), *route.middle, min(route.tails)])


def test_no_package_imports_upward_or_sideways() -> None:
    layers = [grimp.Layer(*sorted(layer), independent=True) for layer in LAYERS]
    illegal = _graph().find_illegal_dependencies_for_layers(layers=layers, containers={"prefixlab"})
    found = sorted(
        f"{d.importer} imports {d.imported}: {_route(min(d.routes, key=_route))}" for d in illegal
    )
    assert found == [], "\n".join(found)


def test_the_check_finds_an_upward_import() -> None:
    """The same call on a graph with one upward import (cache -> runner) reports it."""
    graph = grimp.ImportGraph()
    for m in ("p", "p.cache", "p.cache.block", "p.runner", "p.runner.replay"):
        graph.add_module(m)
    graph.add_import(importer="p.runner.replay", imported="p.cache.block")
    assert not graph.find_illegal_dependencies_for_layers(
        layers=[grimp.Layer("runner"), grimp.Layer("cache")], containers={"p"}
    )
    graph.add_import(importer="p.cache.block", imported="p.runner.replay")
    (dep,) = graph.find_illegal_dependencies_for_layers(
        layers=[grimp.Layer("runner"), grimp.Layer("cache")], containers={"p"}
    )
    assert (dep.importer, dep.imported) == ("p.cache", "p.runner")
    assert [_route(r) for r in dep.routes] == ["p.cache.block -> p.runner.replay"]
