"""The device method contract: a method is built over its context, never attached."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import ursa.edge_sdk
from ursa.edge_sdk.method import DeviceContext, DeviceMethod
from ursa.protocol.router import Router


def _device_methods() -> list[type[DeviceMethod]]:
    """Every concrete `DeviceMethod` class defined in ``ursa.edge_sdk``."""
    for info in pkgutil.walk_packages(ursa.edge_sdk.__path__, "ursa.edge_sdk."):
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra (torch, onnx)
            if exc.name is None or exc.name.startswith("ursa"):
                raise
    found: list[type[DeviceMethod]] = []
    todo: list[type[DeviceMethod]] = [DeviceMethod]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("ursa.") and not inspect.isabstract(cls):
            found.append(cls)
    return found


def _takes_its_context_first(cls: type[DeviceMethod]) -> bool:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return (
        bool(params)
        and params[0].name == "ctx"
        and params[0].annotation
        in (
            "DeviceContext",
            DeviceContext,
        )
    )


def test_every_device_method_takes_its_context_at_construction() -> None:
    methods = {cls.__name__ for cls in _device_methods()}
    assert {"Dubhe", "Climb", "FedDisk", "FedProx", "Flicker", "SecureMeans"} <= methods
    late = [c.__name__ for c in _device_methods() if not _takes_its_context_first(c)]
    assert late == []
    assert not hasattr(DeviceMethod, "attach")  # no second phase to forget


def test_a_method_built_without_its_context_is_seen() -> None:
    class Late(DeviceMethod):
        name = "late"

        def __init__(self, draw: str) -> None:
            self.draw = draw

        def register(self, router: Router) -> None:
            pass

    assert not _takes_its_context_first(Late)
