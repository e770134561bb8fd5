"""The package's modules import one another without a cycle.

The graph is read from the source (``ast``), with every import a module makes:
at module level, under ``if TYPE_CHECKING:``, and inside functions (an import
deferred to a call is still a dependency, only a hidden one). A package's own
``__init__`` running before its submodules is not an edge (nor ``from . import
_x`` naming it): that is Python's order, not the code's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fastapi_jobs

ROOT = Path(fastapi_jobs.__file__).parent
PACKAGE = "fastapi_jobs"


def _module_name(root: Path, path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The names of the modules ``node`` imports (the package's, and others)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    # ``from .x import y`` imports x, and y as well where y is a module.
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of the package, and the package's modules it imports."""
    paths = {_module_name(root, path): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        found = graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(
                    name
                    for name in _imported(module, is_package, node)
                    if name in paths and name != module and not module.startswith(f"{name}.")
                )
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import one another (Tarjan's
    strongly connected components, each with a path around it)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_around(graph, group) for group in groups]


def _around(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path from the group's first module back to it, inside the group."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                todo.append(nxt)
    raise AssertionError(f"no cycle in {group}")  # pragma: no cover - a group has one


def test_the_package_has_no_import_cycle() -> None:
    """No module of fastapi_jobs imports, directly or not, a module that imports it."""
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_graph_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    """A cycle made only of a deferred import and a TYPE_CHECKING one is found."""
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_a.py").write_text("def f():\n    from ._b import g\n")
    (tmp_path / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import _a\n"
    )
    (tmp_path / "_c.py").write_text("from ._a import f\n")
    graph = import_graph(tmp_path)
    assert graph["fastapi_jobs._c"] == {"fastapi_jobs._a"}
    assert cycles(graph) == [["fastapi_jobs._a", "fastapi_jobs._b", "fastapi_jobs._a"]]


def test_the_seam_is_what_the_integrations_reach() -> None:
    """The integrations (the web side, the command line, metrics, tracing)
    import neither the scheduler's sides nor, where they are given a seam (the
    web side, the metrics' parts), the scheduler: they go through the seam."""
    graph = import_graph()
    sides = {f"{PACKAGE}._core.{name}" for name in ("lifecycle", "manual_runs", "pauses", "reader")}
    given_a_seam = [m for m in graph if m.startswith((f"{PACKAGE}._web", f"{PACKAGE}.metrics._"))]
    integrations = [
        *given_a_seam,
        *(m for m in graph if m.startswith(f"{PACKAGE}._cli")),
        f"{PACKAGE}.metrics",  # instrument(scheduler): given the scheduler itself
    ]
    assert len(given_a_seam) >= 10 and f"{PACKAGE}._cli.main" in integrations
    for name in [*integrations, f"{PACKAGE}.tracing"]:
        assert not graph[name] & sides, name
    for name in given_a_seam:
        assert f"{PACKAGE}._scheduler" not in graph[name], name
