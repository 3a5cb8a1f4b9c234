"""The `Transport` interface, its errors, and MQTT topic matching and validation.

A transport moves raw bytes: `(topic, payload, qos, retain)` out, `(topic,
payload)` in through one handler. It knows nothing about messages, envelopes or
chunks (those sit on top, in `ursa.protocol`). Three implementations, each a
`ursa.protocol.transport_base.TransportBase`:
`ursa.protocol.mqtt.MqttTransport` (paho-mqtt, a real broker),
`ursa.bench.mqtt_pool.PooledTransport` (many paho clients on one loop, for
the load generator) and `ursa.protocol.inmemory.InMemoryTransport` (unit tests
and simulation).

Errors (every failure at the transport edge is one of these)::

    TransportError                 base class; paho return codes are mapped here
    ├── NotConnectedError          closed, never connected, or QoS 0 while offline
    ├── BrokerRefusedError         CONNACK refusal (bad password, not authorised)
    ├── SubscriptionRefusedError   SUBACK failure (e.g. the ACL forbids the filter)
    ├── PayloadTooLargeError       payload above the cap; nothing was sent
    ├── QueueFullError             the client's outgoing queue is full
    ├── TransportTimeoutError      no CONNACK / SUBACK / PUBACK within the timeout
    └── InvalidTopicError          also a ValueError: bad topic or filter syntax
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ursa._compat import StrEnum

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "BrokerRefusedError",
    "InvalidTopicError",
    "MessageHandler",
    "NotConnectedError",
    "PayloadTooLargeError",
    "QueueFullError",
    "SubscriptionRefusedError",
    "TrafficCounter",
    "Transport",
    "TransportError",
    "TransportState",
    "TransportStats",
    "TransportTimeoutError",
    "topic_matches",
    "validate_filter",
    "validate_topic",
]

logger = logging.getLogger(__name__)

#: Largest payload a transport accepts by default: 1 MiB, well below the
#: Mosquitto `max_packet_size` that `ursa.tools.broker.mosquitto` writes (2 MiB)
#: and far above the 256 KiB chunk size, so a chunk plus headers always fits.
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

#: The MQTT limit on a packet's remaining length (the payload can be no larger).
MQTT_MAX_PAYLOAD_BYTES = 268_435_455

MessageHandler = Callable[[str, bytes], None]
"""Receives `(topic, payload)`; runs on the transport's delivery thread."""


class TransportError(Exception):
    """Base class of every transport failure."""


class NotConnectedError(TransportError):
    """The transport is not connected (closed, never connected, or offline)."""


class BrokerRefusedError(TransportError):
    """The broker refused the connection (CONNACK failure code)."""


class SubscriptionRefusedError(TransportError):
    """The broker refused a subscription (SUBACK failure code)."""


class PayloadTooLargeError(TransportError):
    """A payload exceeds the publish cap; it was not sent."""


class QueueFullError(TransportError):
    """The client's queue of outgoing messages is full."""


class TransportTimeoutError(TransportError):
    """An acknowledgement (CONNACK, SUBACK, PUBACK) did not arrive in time."""


class InvalidTopicError(TransportError, ValueError):
    """A topic name or topic filter is not valid MQTT syntax."""


class TransportState(StrEnum):
    """Lifecycle of a transport; methods check it."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


@dataclass(frozen=True)
class TransportStats:
    """Traffic through one transport since it was created (for benchmarks)."""

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0


class TrafficCounter:
    """Thread-safe counters behind `TransportStats` (payload bytes only)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0, 0, 0, 0]

    def count_sent(self, num_bytes: int) -> None:
        """Count one published message of `num_bytes` payload bytes."""
        with self._lock:
            self._counts[0] += 1
            self._counts[1] += num_bytes

    def count_received(self, num_bytes: int) -> None:
        """Count one received message of `num_bytes` payload bytes."""
        with self._lock:
            self._counts[2] += 1
            self._counts[3] += num_bytes

    def snapshot(self) -> TransportStats:
        """Return the counters as an immutable record."""
        with self._lock:
            return TransportStats(*self._counts)


@runtime_checkable
class Transport(Protocol):
    """What the edge SDK and the coordinator need from a publish/subscribe link.

    Call `set_handler` and `subscribe` before or after `connect`; subscriptions
    are remembered and renewed after every reconnect. Messages reach the
    handler one at a time, in arrival order, never on a network thread
    (MqttTransport: its own delivery thread; InMemoryBus: see its modes); an
    exception in the handler is logged and the next message is delivered.
    Only QoS 0 and 1 are used by ursa; QoS 2 passes through untested.
    """

    @property
    def client_id(self) -> str:
        """The client id (for ursa devices also the username and device id)."""
        ...

    @property
    def is_connected(self) -> bool:
        """True while the broker link is up."""
        ...

    @property
    def connections(self) -> int:
        """How often the broker accepted a connection (+1 on every reconnect).

        A reconnect shorter than a caller's poll interval is seen as a changed
        count where `is_connected` would look unchanged.
        """
        ...

    @property
    def stats(self) -> TransportStats:
        """Messages and payload bytes sent and received so far."""
        ...

    def set_handler(self, handler: MessageHandler | None) -> None:
        """Route every received message to `handler` (None drops them)."""
        ...

    def set_retained_handler(self, handler: MessageHandler | None) -> None:
        """Route stored retained messages to `handler` (None: the main handler).

        Those are the ones a broker sends because a subscription matched them
        (at every subscribe), not live publishes.
        """
        ...

    def connect(self) -> None:
        """Connect and wait for the broker to accept (raises TransportError)."""
        ...

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Send `payload` to `topic`; QoS 1 is queued while reconnecting."""
        ...

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe to a topic filter (`+` and `#` wildcards)."""
        ...

    def unsubscribe(self, pattern: str) -> None:
        """Forget a topic filter."""
        ...

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every QoS >= 1 publish so far is acknowledged (or delivered)."""
        ...

    def close(self) -> None:
        """Disconnect cleanly: the broker discards the last will."""
        ...


def validate_topic(topic: str) -> None:
    """Raise InvalidTopicError unless `topic` is a valid topic name to publish to."""
    if not topic:
        raise InvalidTopicError("topic must not be empty")
    if "+" in topic or "#" in topic:
        raise InvalidTopicError(f"topic {topic!r} must not contain wildcards")
    if "\x00" in topic or len(topic.encode()) > 65535:
        raise InvalidTopicError(f"topic {topic[:80]!r} is not a valid MQTT topic")


def validate_filter(pattern: str) -> None:
    """Raise InvalidTopicError unless `pattern` is a valid subscription filter."""
    if not pattern or "\x00" in pattern:
        raise InvalidTopicError(f"invalid topic filter {pattern!r}")
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise InvalidTopicError(f"'#' must be the whole last level: {pattern!r}")
        if "+" in level and level != "+":
            raise InvalidTopicError(f"'+' must be a whole level: {pattern!r}")


def topic_matches(pattern: str, topic: str) -> bool:
    """Return True if topic name `topic` matches filter `pattern` (MQTT rules).

    `+` matches exactly one level (possibly empty), a final `#` matches the
    parent level and everything below it, and wildcards at the first level do
    not match topics starting with `$` (broker topics such as `$SYS`).
    """
    if topic.startswith("$") and pattern[:1] in ("+", "#"):
        return False
    pattern_levels = pattern.split("/")
    topic_levels = topic.split("/")
    for i, level in enumerate(pattern_levels):
        if level == "#":
            return True
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(pattern_levels) == len(topic_levels)


def check_publish_args(
    topic: str, payload: bytes, qos: int, max_payload_bytes: int
) -> None:
    """Validate a publish before it leaves (shared by both transports)."""
    validate_topic(topic)
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, got {qos}")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    if len(payload) > max_payload_bytes:
        raise PayloadTooLargeError(
            f"payload of {len(payload)} bytes on {topic!r} exceeds the cap of "
            f"{max_payload_bytes} bytes; chunk it (ursa.protocol.chunking)"
        )


def call_handler(handler: MessageHandler | None, topic: str, payload: bytes) -> bool:
    """Run `handler` on one message; log and swallow its exception.

    Returns:
        False if the handler raised (the caller may record it).
    """
    if handler is None:
        logger.debug("no handler set; dropped message on %s", topic)
        return True
    try:
        handler(topic, payload)
    except Exception:
        logger.exception("message handler failed on topic %s", topic)
        return False
    return True
