"""Wire plumbing of a device's FLICKER participant: admit, queue, note, publish.

`DeviceWire` knows topics and envelopes, not the protocol: it subscribes to
the device's own down topics and the global ones, decodes what arrives
(logging what does not), drops QoS 1 redeliveries by message id, queues
outgoing messages under the state lock and publishes them in order outside
it. `ursa.edge_sdk.methods.flicker.participant.FlickerParticipant` builds on it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, TypeVar

from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import decode, encode, message_kind
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import BaseMessage
from ursa.protocol.outbox import Outbox, Outgoing
from ursa.protocol.topics import (
    device_subscriptions,
    name_for,
    parse_topic,
    qos_for,
    up_topic,
)
from ursa.protocol.transport import Transport

__all__ = ["SEEN_IDS", "DeviceWire", "RejectedError"]

logger = logging.getLogger("ursa.edge_sdk.methods.flicker.algorithm")

SEEN_IDS = 4096
"""Message ids remembered to drop redeliveries."""

_M = TypeVar("_M", bound=BaseMessage)


class RejectedError(Exception):
    """A message this device refuses (the reason is logged)."""


class DeviceWire:
    """Decoding, redelivery filter, outbox and rejection log; subclasses act.

    Args:
        identity: This device's identity.
        federation: The federation id.
        transport: Where messages go; None inside an `EdgeClient`, which
            admits messages and flushes ``outbox`` itself.
        outbox: The queue to publish through (default: its own).
    """

    def __init__(
        self,
        identity: DeviceIdentity,
        federation: str,
        transport: Transport | None,
        *,
        outbox: Outbox | None = None,
    ) -> None:
        self.identity = identity
        self.device_id = identity.device_id
        self.federation = federation
        self.rejections: list[tuple[str, str]] = []
        self._transport = transport
        self._lock = threading.Lock()
        self._flush_lock = threading.RLock()
        self._outbox = outbox if outbox is not None else Outbox(f"{self.device_id}")
        self._seen: OrderedDict[str, None] = OrderedDict()

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to own topics."""
        if self._transport is None:
            raise RuntimeError("attach() needs a transport (a client routes itself)")
        self._transport.set_handler(self.handle)
        for pattern in device_subscriptions(self.federation, self.device_id):
            self._transport.subscribe(pattern)

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: admit one raw message, then act on it."""
        try:
            where = parse_topic(topic)
        except ProtocolError:
            return  # not an ursa topic
        mine = where.device == self.device_id and where.direction == "down"
        if where.federation != self.federation or not (where.scope == "global" or mine):
            return
        try:
            message = decode(payload)
        except ProtocolError as exc:
            self._note("?", f"undecodable message on {topic}: {exc}")
            return
        self.on_message(message, relayed=mine)

    def on_message(self, message: BaseMessage, *, relayed: bool) -> None:
        """Act on one decoded message (``relayed``: on this device's down topic)."""
        raise NotImplementedError

    def _first_time(self, message_id: str) -> bool:
        """Whether a message id is new (a QoS 1 redelivery is not)."""
        if message_id in self._seen:
            return False
        self._seen[message_id] = None
        if len(self._seen) > SEEN_IDS:
            self._seen.popitem(last=False)
        return True

    def _message(self, cls: type[_M], round_index: int, **fields: Any) -> _M:
        """A message from this device."""
        fields.update(federation=self.federation, sender=self.device_id)
        return cls(round=round_index, **fields)

    def _send(self, message: BaseMessage) -> Outgoing:
        """Queue a message for the coordinator; return it as queued."""
        name = name_for(message_kind(message))
        item = Outgoing(
            up_topic(self.federation, self.device_id, name),
            encode(message),
            qos_for(name),
        )
        self._outbox.put_item(item)
        return item

    def _note(self, kind: str, reason: str) -> None:
        logger.warning("FLICKER %s rejected %s: %s", self.device_id, kind, reason)
        self.rejections.append((kind, reason))

    def _flush(self) -> None:
        """Publish queued messages in order, outside the state lock."""
        if self._transport is not None:  # else the client flushes its outbox
            self._outbox.flush(self._transport)
