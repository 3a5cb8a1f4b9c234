"""The parts `EdgeClient` owns: no ursa base class, no reach into another's privates."""

from __future__ import annotations

import ast
import importlib
import inspect
from types import ModuleType

import pytest

from ursa.edge_sdk.client import EdgeClient

PARTS = tuple(
    importlib.import_module(f"ursa.edge_sdk.{name}")
    for name in (
        "admission",
        "client",
        "connection",
        "device_link",
        "device_methods",
        "downloads",
        "enrolment",
        "epoch_view",
        "federation_end",
        "inbox",
        "key_epoch",
        "local_dataset",
        "membership",
        "method_context",
        "stats",
        "training_rounds",
        "update_uploads",
        "shutdown",
    )
)


def test_the_client_is_wiring_over_no_base_class() -> None:
    assert EdgeClient.__mro__ == (EdgeClient, object)


def _classes(module: ModuleType) -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__
    ]


@pytest.mark.parametrize("module", PARTS, ids=lambda m: m.__name__)
def test_a_part_has_no_ursa_base_class(module: ModuleType) -> None:
    for cls in _classes(module):
        bases = [
            b.__qualname__
            for b in cls.__mro__[1:]
            if b.__module__.startswith("ursa.") and b.__module__ != "ursa._compat"
        ]  # _compat: 3.11's StrEnum spelt for 3.10
        assert bases == [], f"{cls.__qualname__} builds on {bases}"


@pytest.mark.parametrize("module", PARTS, ids=lambda m: m.__name__)
def test_a_part_reads_no_private_name_but_its_own(module: ModuleType) -> None:
    tree = ast.parse(inspect.getsource(module))
    foreign = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert foreign == []
