"""The modules of ursa.tools import one another without cycles.

Every import counts: module level, inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _module_of(path: Path) -> str:
    parts = path.relative_to(TOOLS.parent).with_suffix("").parts
    return ".".join(("ursa", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _import_graph() -> dict[str, set[str]]:
    modules = {_module_of(p): p for p in TOOLS.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    return visit(start)


def test_graph_sees_the_packages_imports() -> None:
    graph = _import_graph()
    assert "ursa.tools.demo.run" in graph["ursa.tools.demo.training"]
    plot = graph["ursa.tools.simulate.selection_plot"]
    assert "ursa.tools.simulate.selection" in plot


def test_tools_modules_import_without_cycles() -> None:
    graph = _import_graph()
    cycles = {" -> ".join(c) for n in graph if (c := _cycle_from(n, graph))}
    assert not cycles, "\n".join(sorted(cycles))
