"""The runtimes' shape: no inheritance towers, no reach into another's privates.

Every class in ``ursa.edge_sdk``, ``ursa.coordinator`` and ``ursa.protocol``
has at most one concrete ursa-defined class above it in its MRO: state is
shared by handing parts their collaborators, not by stacking classes.
Exempt are pydantic message and config models and the abstract contracts a
class implements (an ABC with abstract methods, or a Protocol): a method
class over its one contract. And no class reads another object's
``_private`` attribute (``self._x`` is its own; ``other._x`` is not).

Both allow-lists only shrink: an entry that no longer offends fails the test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pydantic
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ursa.edge_sdk", "ursa.coordinator", "ursa.protocol")

TOWERS = {
    # an error family: ChunkError under ProtocolError
    "ursa.protocol.chunking.RequestLimitError",
}
"""Classes still over more than one concrete ursa class (shrink only)."""

PRIVATE_REACH = {
    "coordinator/gather.py",
    "coordinator/seal_pages.py",
    "protocol/inmemory.py",  # the in-memory broker and its sessions
    "protocol/mqtt.py",  # paho's wake-up socket pair has no public close
}
"""Files that still read another object's private attribute (shrink only)."""


def _classes() -> list[type]:
    found: list[type] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            try:
                module = importlib.import_module(info.name)
            except ImportError as exc:  # an optional extra (torch, onnx)
                if exc.name is None or exc.name.startswith("ursa"):
                    raise
                continue
            found += [
                cls
                for _, cls in inspect.getmembers(module, inspect.isclass)
                if cls.__module__ == info.name
            ]
    return found


def _contract(cls: type) -> bool:
    """An abstract contract: an ABC with abstract methods, or a Protocol."""
    return inspect.isabstract(cls) or bool(getattr(cls, "_is_protocol", False))


def _towers() -> set[str]:
    towers = set()
    for cls in _classes():
        if issubclass(cls, pydantic.BaseModel):
            continue
        concrete = [
            base
            for base in cls.__mro__[1:]
            if base.__module__.startswith("ursa.") and not _contract(base)
        ]
        if len(concrete) > 1:
            towers.add(f"{cls.__module__}.{cls.__qualname__}")
    return towers


def test_no_class_stands_on_more_than_one_concrete_ursa_class() -> None:
    towers = _towers()
    assert towers - TOWERS == set(), "new inheritance towers"
    assert TOWERS - towers == set(), "no longer towers: take them off TOWERS"


def _private_reads(source: str) -> list[str]:
    """``line: expression`` of every read of another object's private name."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def _sources() -> list[Path]:
    return sorted(
        path
        for package in ("edge_sdk", "coordinator", "protocol")
        for path in (ROOT / package).rglob("*.py")
    )


def test_no_class_reads_another_objects_private_attribute() -> None:
    offenders = {
        str(path.relative_to(ROOT)): reads
        for path in _sources()
        if (reads := _private_reads(path.read_text(encoding="utf-8")))
    }
    new = {
        path: reads for path, reads in offenders.items() if path not in PRIVATE_REACH
    }
    assert new == {}
    assert PRIVATE_REACH - set(offenders) == set(), "clean now: take them off"


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    def f(self, other):\n        return other._x\n",
        "class A:\n    def f(self):\n        return self._b._x\n",
    ],
)
def test_the_private_reach_check_sees_a_foreign_read(source: str) -> None:
    assert len(_private_reads(source)) == 1
