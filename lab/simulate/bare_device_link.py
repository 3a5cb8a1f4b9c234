"""A simulated device's end of the bus: its topics, what is addressed to it, its sends.

The lab's bare devices (`ursa.lab.simulate.flicker_device`,
`ursa.lab.simulate.climb_device`) run a production device method without an
`EdgeClient`; `BareDeviceLink` is the part of the client's transport handling
they share: subscribe to the device's topics, tell which raw messages are
addressed to this device (its federation; the global topics, or its own down
topic), and publish its replies in order through an `Outbox` once a handler
returns.
"""

from __future__ import annotations

from collections.abc import Callable

from ursa.protocol.envelope import encode, message_kind
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import BaseMessage
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import (
    device_subscriptions,
    name_for,
    parse_topic,
    qos_for,
    up_topic,
)
from ursa.protocol.transport import Transport

__all__ = ["BareDeviceLink"]


class BareDeviceLink:
    """One device's transport, topics and outbox (module docstring)."""

    def __init__(self, federation: str, device_id: str, transport: Transport) -> None:
        self.federation = federation
        self.device_id = device_id
        self._transport = transport
        self._outbox = Outbox(device_id)

    def attach(self, handler: Callable[[str, bytes], None]) -> None:
        """Deliver the transport's messages to ``handler``; subscribe to own topics."""
        self._transport.set_handler(handler)
        for pattern in device_subscriptions(self.federation, self.device_id):
            self._transport.subscribe(pattern)

    def addressed(self, topic: str) -> bool | None:
        """Whether ``topic`` is this device's own down topic; None: not for it."""
        try:
            where = parse_topic(topic)
        except ProtocolError:
            return None  # not an ursa topic
        own = where.device == self.device_id and where.direction == "down"
        if where.federation != self.federation or not (where.scope == "global" or own):
            return None
        return own

    def send(self, message: BaseMessage) -> None:
        """Queue a message for the coordinator (published at the next `flush`)."""
        name = name_for(message_kind(message))
        topic = up_topic(self.federation, self.device_id, name)
        self._outbox.put(topic, encode(message), qos_for(name))

    def flush(self) -> None:
        """Publish what was queued, in order."""
        self._outbox.flush(self._transport)
