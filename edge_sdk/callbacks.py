"""What a device app hears from the runtime: typed events and its callbacks.

A device app subclasses `DeviceCallbacks` and overrides the hooks it cares
about (all default to doing nothing), e.g. to show progress on a screen::

    class Progress(DeviceCallbacks):
        def on_round_trained(self, event: RoundTrained) -> None:
            print(f"round {event.round}: {event.num_examples} samples")

    EdgeClient(config, labels, trainer=trainer, callbacks=Progress())

Hooks run on the client's thread while it holds its lock: keep them short
(hand long work to a thread of the app's). A hook that raises is logged and
otherwise ignored: an app's bug in a progress display must not stop the
device taking part (`notify`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "DeviceCallbacks",
    "DeviceError",
    "Finished",
    "ModelReceived",
    "RoundTrained",
    "Selected",
    "notify",
]

logger = logging.getLogger("ursa.edge_sdk")


@dataclass(frozen=True)
class Selected:
    """The device is named in a round's signed selection."""

    round: int


@dataclass(frozen=True)
class RoundTrained:
    """The device trained a round and sent its update."""

    round: int
    base_version: int | None
    """The global version it trained from (None: a selection-only trainer)."""
    num_examples: int
    train_s: float
    update_bytes: int


@dataclass(frozen=True)
class ModelReceived:
    """A global model version is downloaded and checked."""

    version: int


@dataclass(frozen=True)
class Finished:
    """The federation ended (the coordinator's signed `FederationEnd`)."""

    rounds: int
    """Rounds the coordinator completed."""
    version: int | None
    """The final global version (None: the federation trained no model)."""
    model_path: Path | None
    """The saved final weights (``.ursw``), if this device trains that model."""
    onnx_path: Path | None
    """The saved ONNX export, when torch and onnx are installed."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The coordinator's evaluation figures of the final model."""


@dataclass(frozen=True)
class DeviceError:
    """Something failed: the device's own training, or a coordinator refusal."""

    round: int
    code: str
    """An `ErrorCode` value (e.g. ``training_failed``)."""
    reason: str
    source: Literal["device", "coordinator"]


class DeviceCallbacks:
    """The hooks a device app may override (each does nothing by default)."""

    def on_selected(self, event: Selected) -> None:
        """The device was selected for a round."""

    def on_round_trained(self, event: RoundTrained) -> None:
        """The device trained a round and sent its update."""

    def on_model(self, event: ModelReceived) -> None:
        """A new global model version arrived."""

    def on_finished(self, event: Finished) -> None:
        """The federation is over (the final model is saved, if any)."""

    def on_error(self, event: DeviceError) -> None:
        """Training failed here, or the coordinator refused a message."""


def notify(
    callbacks: DeviceCallbacks | None,
    hook: Literal[
        "on_selected", "on_round_trained", "on_model", "on_finished", "on_error"
    ],
    event: Selected | RoundTrained | ModelReceived | Finished | DeviceError,
    *,
    device: str,
) -> None:
    """Call one hook; a hook that raises is logged, never propagated."""
    if callbacks is None:
        return
    try:
        getattr(callbacks, hook)(event)
    except Exception:
        logger.exception("%s: the app's %s callback raised (ignored)", device, hook)
