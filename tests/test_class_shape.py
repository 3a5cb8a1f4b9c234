"""The runtimes' shape: no inheritance towers, no reach into another's privates.

Every class in ``ursa.edge_sdk``, ``ursa.coordinator`` and ``ursa.protocol``
has at most one ursa-defined class above it in its MRO, abstract or not:
state is shared by handing parts their collaborators, not by stacking
classes. Exempt are pydantic message and config models, and a method class
(one implementing a method contract: `DeviceMethod`, `RoundPlugin`,
`BeforeTraining`, `SelectionMethod`) whose ursa ancestors are all abstract
contracts (an ABC with abstract methods, or a Protocol). And no class reads
another object's ``_private`` attribute (``self._x`` is its own; ``other._x``
is not).

Both allow-lists only shrink: an entry that no longer offends fails the test.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from abc import ABC, abstractmethod
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


def _method_contracts() -> tuple[type, ...]:
    from ursa.coordinator.before_training import BeforeTraining
    from ursa.coordinator.plugin import RoundPlugin
    from ursa.coordinator.selection_method import SelectionMethod
    from ursa.edge_sdk.method import DeviceMethod

    return (DeviceMethod, RoundPlugin, BeforeTraining, SelectionMethod)


def _is_tower(cls: type) -> bool:
    """More than one ursa class above ``cls``, outside the exemptions."""
    if issubclass(cls, pydantic.BaseModel):
        return False
    above = [base for base in cls.__mro__[1:] if base.__module__.startswith("ursa.")]
    if len(above) <= 1:
        return False
    method = issubclass(cls, _method_contracts())
    return not (method and all(_contract(base) for base in above))


def _towers() -> set[str]:
    return {
        f"{cls.__module__}.{cls.__qualname__}" for cls in _classes() if _is_tower(cls)
    }


def test_no_class_stands_on_more_than_one_concrete_ursa_class() -> None:
    towers = _towers()
    assert towers - TOWERS == set(), "new inheritance towers"
    assert TOWERS - towers == set(), "no longer towers: take them off TOWERS"


def _in_ursa(*classes: type) -> None:
    for cls in classes:
        cls.__module__ = "ursa.edge_sdk.example"


def test_a_stack_of_abstract_bases_is_a_tower_outside_method_classes() -> None:
    class Contract(ABC):
        @abstractmethod
        def train(self) -> None: ...

    class Refined(Contract):
        @abstractmethod
        def train_more(self) -> None: ...

    class Leaf(Refined):
        def train(self) -> None: ...

        def train_more(self) -> None: ...

    _in_ursa(Contract, Refined, Leaf)
    assert not _is_tower(Refined)
    assert _is_tower(Leaf)


def test_a_method_class_may_implement_two_contracts() -> None:
    from ursa.edge_sdk.method import DeviceMethod
    from ursa.edge_sdk.secure_mean import MeanParticipant

    assert DeviceMethod.__module__.startswith("ursa.")
    assert MeanParticipant.__module__.startswith("ursa.")

    class Both(DeviceMethod, MeanParticipant):
        pass

    class Plain:
        pass

    class OverMethod(Plain, DeviceMethod):
        pass

    _in_ursa(Both, Plain, OverMethod)
    assert not _is_tower(Both)
    assert _is_tower(OverMethod)


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
