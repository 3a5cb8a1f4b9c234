"""`ursa.edge_sdk.callbacks`: hooks are optional and a raising hook is only logged."""

from __future__ import annotations

import logging

import pytest

from ursa.edge_sdk.callbacks import DeviceCallbacks, ModelReceived, Selected, notify


class Counting(DeviceCallbacks):
    def __init__(self) -> None:
        self.models: list[int] = []

    def on_model(self, event: ModelReceived) -> None:
        self.models.append(event.version)

    def on_selected(self, event: Selected) -> None:
        raise RuntimeError("display broke")


def test_a_hook_is_called_with_its_event() -> None:
    app = Counting()
    notify(app, "on_model", ModelReceived(4), device="d1")
    notify(None, "on_model", ModelReceived(5), device="d1")
    assert app.models == [4]


def test_a_raising_hook_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="ursa.edge_sdk"):
        notify(Counting(), "on_selected", Selected(2), device="d1")
    assert "on_selected callback raised" in caplog.text


def test_hooks_default_to_nothing() -> None:
    notify(DeviceCallbacks(), "on_selected", Selected(1), device="d1")
