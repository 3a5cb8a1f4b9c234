"""`DeviceLink`: what every part of the device runtime shares to talk to the fleet.

The client owns the outbox and the run it joined; its parts are handed this
link (who the device is, which federation, how a message leaves) rather
than the client itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ursa.protocol.messages import BaseMessage

__all__ = ["DeviceLink"]


@dataclass(frozen=True)
class DeviceLink:
    """This device's identity on the wire and its way out (the client's outbox)."""

    federation: str
    device_id: str
    send: Callable[[BaseMessage], None]
    """Stamps the joined run and queues the message (sent outside the lock)."""
