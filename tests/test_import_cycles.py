"""The modules of the ursa package import one another without cycles.

Every import counts: module level, inside functions and under TYPE_CHECKING. A
cycle hidden in a function or behind TYPE_CHECKING still ties two modules into
one concept, so it is a layout question, not only an import-order one. An
import of ``a.b`` is an edge to ``a.b`` alone, not to the package ``a`` Python
also runs: a package's ``__init__`` imports its modules back to re-export them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ursa._compat import tomllib

ROOT = Path(__file__).resolve().parents[1]


CHECKOUT_ONLY = ("lab", "bench")
"""Packages a checkout runs but the wheel leaves out: their imports count too."""


def _package_modules() -> dict[str, Path]:
    """Every module of the wheel (pyproject's packages list) and of the lab, by name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = list(config["tool"]["setuptools"]["packages"])
    packages += [
        ".".join(("ursa", *init.parent.relative_to(ROOT).parts))
        for top in CHECKOUT_ONLY
        for init in (ROOT / top).rglob("__init__.py")
    ]
    modules: dict[str, Path] = {}
    for package in packages:
        folder = ROOT.joinpath(*package.split(".")[1:])
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _imported(
    node: ast.AST, name: str, path: Path, modules: dict[str, Path]
) -> set[str]:
    """The package modules one import statement loads, relative ones resolved."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & modules.keys()
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        anchor = name.split(".")[: None if path.stem == "__init__" else -1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    # `from a import b` loads the module a.b when there is one, else only a
    found = {
        f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
        for a in node.names
    }
    return found & modules.keys()


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports, anywhere in its source."""
    return {
        name: {
            target
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            for target in _imported(node, name, path, modules)
            if target != name
        }
        for name, path in modules.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component of more than one node.

    Returns:
        Each cycle as its nodes in order, the first repeated at the end.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while (member := stack.pop()) != node:
                component.add(member)
            components.append(component | {node})

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(_shortest_cycle(min(c), graph, c) for c in components if len(c) > 1)


def _shortest_cycle(
    start: str, graph: dict[str, set[str]], within: set[str]
) -> list[str]:
    """Breadth-first from start back to start, inside one component."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & within):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is on no cycle")  # a component always has one


def test_find_cycles_reports_each_cycle_once() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"f"},
        "f": {"e"},
    }
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]


def test_find_cycles_passes_a_graph_without_cycles() -> None:
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert find_cycles(graph) == []


def test_graph_resolves_every_kind_of_import(tmp_path: Path) -> None:
    sources = {
        "pkg/__init__.py": "from pkg.sub import Thing\n",
        "pkg/sub.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg import other\n"
            "def f():\n    import pkg.lazy\n"
            "from . import rel\n"
        ),
        "pkg/other.py": "",
        "pkg/lazy.py": "",
        "pkg/rel.py": "from .sub import f\n",
    }
    modules = {}
    for relative, text in sources.items():
        path = tmp_path / relative
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        stem = relative.removesuffix(".py").replace("/", ".")
        modules[stem.removesuffix(".__init__")] = path
    graph = import_graph(modules)
    assert graph["pkg"] == {"pkg.sub"}
    assert graph["pkg.sub"] == {"pkg.other", "pkg.lazy", "pkg.rel"}
    assert find_cycles(graph) == [["pkg.rel", "pkg.sub", "pkg.rel"]]


def test_graph_sees_the_packages_imports() -> None:
    graph = import_graph(_package_modules())
    assert "ursa.tools.demo.run" in graph["ursa.tools.demo.training"]
    assert "ursa.crypto.encoding" in graph["ursa.crypto.paillier"]
    assert "ursa.protocol.messages.base" in graph["ursa.protocol.messages"]
    assert "ursa.tools.data.federation" in graph["ursa.lab.simulate.methods"]
    assert "ursa.bench.mqtt_pool" in graph["ursa.bench.protocol"]


def test_package_modules_import_without_cycles() -> None:
    cycles = find_cycles(import_graph(_package_modules()))
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)
