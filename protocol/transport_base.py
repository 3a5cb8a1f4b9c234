"""`TransportBase`: what every `Transport` keeps whatever carries its bytes.

The client id, the lifecycle state, the count of accepted connections (callers
compare it to see a reconnect they polled too slowly to see), the traffic
counters, the message handler and the wanted filters (`SubscriptionBook`).
`MqttTransport`, `PooledTransport` and `InMemoryTransport` differ only in how
they connect, send and deliver.
"""

from __future__ import annotations

from ursa.protocol.subscriptions import SubscriptionBook
from ursa.protocol.transport import (
    MessageHandler,
    NotConnectedError,
    TrafficCounter,
    TransportState,
    TransportStats,
    check_publish_args,
)

__all__ = ["TransportBase"]


class TransportBase:
    """The state and read-only surface shared by the `Transport` implementations."""

    def __init__(self, client_id: str) -> None:
        self._client_id = client_id
        self._state = TransportState.NEW
        self._connections = 0
        self._counter = TrafficCounter()
        self._handler: MessageHandler | None = None
        self._retained_handler: MessageHandler | None = None
        self._subscriptions = SubscriptionBook()

    @property
    def client_id(self) -> str:
        """The MQTT client id (an ursa device's is its device id)."""
        return self._client_id

    @property
    def state(self) -> TransportState:
        """The lifecycle state."""
        return self._state

    @property
    def is_connected(self) -> bool:
        """True while the broker link is up (CONNACK accepted, not lost)."""
        return self._state is TransportState.CONNECTED

    @property
    def connections(self) -> int:
        """Connections the broker accepted so far (each reconnect adds one)."""
        return self._connections

    @property
    def stats(self) -> TransportStats:
        """Messages and payload bytes sent and received so far."""
        return self._counter.snapshot()

    def set_handler(self, handler: MessageHandler | None) -> None:
        """Route every received message to `handler` (None drops them)."""
        self._handler = handler

    def set_retained_handler(self, handler: MessageHandler | None) -> None:
        """Route stored retained messages to `handler` (None: the main handler).

        Those are the ones a broker sends because a subscription matched them.
        """
        self._retained_handler = handler

    def _handler_for(self, retained: bool) -> MessageHandler | None:
        if retained and self._retained_handler is not None:
            return self._retained_handler
        return self._handler

    def _check_paho_publish(
        self, topic: str, payload: bytes, qos: int, max_payload_bytes: int
    ) -> None:
        """Refuse a publish paho would not take: bad arguments, or no link for it.

        paho queues QoS >= 1 publishes while it reconnects, not QoS 0 ones.

        Raises:
            PayloadTooLargeError: above `max_payload_bytes`.
            NotConnectedError: not connected yet or closed, or QoS 0 offline.
        """
        check_publish_args(topic, payload, qos, max_payload_bytes)
        if self._state in (TransportState.NEW, TransportState.CLOSED) or (
            qos == 0 and not self.is_connected
        ):
            raise NotConnectedError(f"{self.client_id} is {self._state}")
