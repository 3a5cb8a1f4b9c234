"""Names mean one thing: no two public classes of ursa share a name.

Two `ModelUpdate`s (the wire message and the aggregator's view of one) or three
`Stage`s make a reader, a grep and an import pick the wrong one. Every module
outside ``tests/`` is read with `ast`, not imported, so the check also runs
where an optional extra (torch, onnx) is missing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {"tests", "build", "site", "node_modules", "__pycache__"}


def _modules(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if not any(part in SKIPPED or part.startswith(".") for part in parts[:-1]):
            yield path


def _top_level(body: list[ast.stmt]) -> Iterator[ast.ClassDef]:
    """Module-level classes, also those under ``if TYPE_CHECKING`` or ``try``."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody)


def public_classes(root: Path) -> dict[str, list[str]]:
    """Public class name -> the files (``a/b.py:line``) that define it."""
    found: dict[str, list[str]] = {}
    for path in _modules(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _top_level(tree.body):
            if not node.name.startswith("_"):
                where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
                found.setdefault(node.name, []).append(where)
    return found


def shared_names(root: Path) -> dict[str, list[str]]:
    return {
        name: where for name, where in public_classes(root).items() if len(where) > 1
    }


def test_no_two_public_classes_share_a_name() -> None:
    shared = shared_names(ROOT)
    lines = [f"{name}: {', '.join(where)}" for name, where in sorted(shared.items())]
    assert not shared, "public classes that share a name:\n" + "\n".join(lines)


def test_the_walk_sees_the_package() -> None:
    classes = public_classes(ROOT)
    assert len(classes) > 300
    assert any(
        where.startswith("coordinator/") for where in classes["CoordinatorService"]
    )
    assert any(where.startswith("edge_sdk/") for where in classes["EdgeClient"])


def test_the_check_finds_two_modules_with_one_class_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "a" / "x.py").write_text(
        "class Phase:\n    pass\n\nclass _Private:\n    pass\n"
    )
    (tmp_path / "b" / "y.py").write_text(
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    class Phase:\n        pass\n\n"
        "class _Private:\n    pass\n\nclass Other:\n    pass\n"
    )
    (tmp_path / "tests" / "test_x.py").write_text("class Other:\n    pass\n")

    assert shared_names(tmp_path) == {"Phase": ["a/x.py:1", "b/y.py:4"]}
