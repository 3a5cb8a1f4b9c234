"""The coordinator's broker link: connect, subscribe, say online and offline, close.

Without a transport given, an `MqttTransport` is built from ``[broker]`` with
a retained last will (the coordinator's ``offline`` status), and a broker
that is not up yet is waited for (`ursa.protocol.connect`). On a clean stop
the link publishes ``offline``, drains the outbox (a handler's last answers
too) and closes; what is queued is published outside the service's lock
(`flush`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.signing_point import SigningPoint
from ursa.protocol.connect import connect_patiently
from ursa.protocol.messages import COORDINATOR, Status
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import (
    BRIDGE_STATE_FILTER,
    STATUS,
    coordinator_subscriptions,
    global_topic,
)
from ursa.protocol.transport import Transport, TransportError, TransportStats

__all__ = ["BrokerLink", "Handler"]

logger = logging.getLogger("ursa.coordinator")

Handler = Callable[[str, bytes], None]
"""Takes a topic and a payload."""


class BrokerLink:
    """The link to the broker (module docstring).

    Args:
        config: The federation and ``[broker]``.
        outbox: What the service queued.
        outgoing: Encodes the status messages.
        round_index: The current round (statuses carry it).
        transport: A transport to use (tests: in-memory); None builds one.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        outbox: Outbox,
        outgoing: SigningPoint,
        round_index: Callable[[], int],
        transport: Transport | None = None,
    ) -> None:
        self._config = config
        self._outbox = outbox
        self._outgoing = outgoing
        self._round = round_index
        self.transport = transport
        """The transport (None until `connect` built one)."""

    @property
    def stats(self) -> TransportStats:
        """Messages and payload bytes through the link so far."""
        transport = self.transport
        return TransportStats() if transport is None else transport.stats

    @property
    def is_connected(self) -> bool:
        """True while the link is up."""
        transport = self.transport
        return transport is not None and transport.is_connected

    def connect(
        self, handler: Handler, retained: Handler, stop: threading.Event
    ) -> Transport:
        """Subscribe ``handler`` (``retained``: stored messages) and connect."""

        def subscribe(transport: Transport) -> Transport:
            transport.set_handler(handler)
            transport.set_retained_handler(retained)
            for pattern in coordinator_subscriptions(self._config.federation):
                transport.subscribe(pattern)
            transport.subscribe(BRIDGE_STATE_FILTER)
            return transport

        def make() -> Transport:
            from ursa.protocol.mqtt import MqttTransport

            will = (
                global_topic(self._config.federation, STATUS),
                self._outgoing.encode(self._status(online=False)),
            )
            broker = self._config.broker
            return subscribe(MqttTransport(broker.mqtt_config(COORDINATOR, will=will)))

        transport = self.transport
        if transport is None:
            broker = self._config.broker
            transport = self.transport = connect_patiently(
                make,
                what="coordinator",
                min_delay_s=broker.reconnect_min_delay_s,
                max_delay_s=broker.reconnect_max_delay_s,
                stop=stop,
            )
        else:
            subscribe(transport)
            if not transport.is_connected:
                transport.connect()
        return transport

    def _status(self, *, online: bool) -> Status:
        return Status(
            federation=self._config.federation,
            round=self._round(),
            sender=COORDINATOR,
            online=online,
            state="serving" if online else "offline",
        )

    def publish_status(self, *, online: bool) -> None:
        """Queue the coordinator's retained status."""
        payload = self._outgoing.encode(self._status(online=online))
        self._outgoing.send_raw(payload, "status", None)

    def flush(self) -> None:
        """Publish what is queued (outside the service's lock)."""
        self._outbox.flush(self.transport)

    def close(self) -> None:
        """Say offline, drain the outbox and close the transport."""
        transport = self.transport
        if transport is None or not transport.is_connected:
            return
        try:
            self.publish_status(online=False)
            self._outbox.drain(transport, 5.0)  # a handler's last answers too
            transport.flush(5.0)
        except TransportError as exc:
            logger.warning("could not flush on stop: %s", exc)
        self._outbox.close()  # a tick racing the stop: dropped quietly
        transport.close()
