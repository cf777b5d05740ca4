"""The layout is checked, not hoped for: no import circles anywhere in the package, no
module a newcomer cannot read in one sitting, and the lab outside the product. The layer
contracts themselves are pyproject.toml's, run by ``lint-imports`` in scripts/test."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[2] / "edge_vision"
MAX_LINES = 600


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_package_has_no_import_circle() -> None:
    # grimp reads every import: module level, inside functions and under TYPE_CHECKING.
    graph = grimp.build_graph("edge_vision", include_external_packages=False)
    assert len(graph.modules) > 100  # the whole package was read
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y"]]


def test_no_module_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_product_imports_nothing_of_the_lab() -> None:
    graph = grimp.build_graph("edge_vision", "benchmarks", include_external_packages=False)
    product = {m for m in graph.modules if m.split(".")[0] == "edge_vision"}
    lab = {m for m in graph.modules if m.split(".")[0] == "benchmarks"}
    assert lab  # the lab was read
    imports = {(m, t) for m in product for t in graph.find_modules_directly_imported_by(m)}
    assert {(m, t) for m, t in imports if t in lab} == set()
