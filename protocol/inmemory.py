"""An in-process MQTT broker and transport for unit tests and simulations."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ursa.protocol.transport import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    NotConnectedError,
    TransportError,
    TransportState,
    TransportTimeoutError,
    call_handler,
    check_publish_args,
    topic_matches,
    validate_topic,
)
from ursa.protocol.transport_base import TransportBase

__all__ = ["DropFilter", "InMemoryBus", "InMemoryTransport"]

logger = logging.getLogger(__name__)

DropFilter = Callable[[str, str, str, bytes], bool]
"""`(sender_id, receiver_id, topic, payload) -> True` loses that one delivery."""


@dataclass
class _Session:
    """Broker-side state of one client id (kept across connections if persistent)."""

    subscriptions: dict[str, int] = field(default_factory=dict)
    offline: deque[tuple[str, bytes]] = field(default_factory=deque)
    transport: InMemoryTransport | None = None


class InMemoryBus:
    """An in-process MQTT broker: routing, retained messages, sessions, last wills.

    Semantics follow MQTT 3.1.1 as Mosquitto implements it, simplified where
    tests gain from it: every delivery is exactly once and in publish order; a
    client gets one copy per message even if several of its filters match;
    QoS >= 1 messages for a disconnected client with a persistent session wait
    in its session (up to `max_queued_messages`, oldest dropped first) and are
    delivered when a transport with the same client id connects; QoS 0 ones
    are lost. A second transport connecting with a live client id takes the
    session over and the first is closed (no will). There is no ACL.

    Delivery modes:
        synchronous=True (default): `publish` delivers on the calling thread
        before it returns, so a test or a simulation step is deterministic.
        A publish made inside a handler is queued and delivered after that
        handler returns (breadth first, no recursion).
        synchronous=False: one dispatcher thread delivers everything, like a
        real client's delivery thread; `flush()` waits until it is idle.

    Fault injection: `drop_filter` loses chosen deliveries (a partition is
    `lambda s, r, t, p: "dev1" in (s, r)`); `InMemoryTransport.kill()` is an
    abrupt disconnect that publishes the will. Handler exceptions are logged
    and counted in `handler_errors` (tests should assert it stays 0).
    """

    def __init__(
        self,
        *,
        synchronous: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_queued_messages: int = 10_000,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.max_queued_messages = max_queued_messages
        self.drop_filter: DropFilter | None = None
        self.handler_errors = 0
        self._synchronous = synchronous
        self._cond = threading.Condition(threading.RLock())
        self._sessions: dict[str, _Session] = {}
        self._retained: dict[str, bytes] = {}
        self._queue: deque[tuple[InMemoryTransport, str, bytes, int, bool]] = deque()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if not synchronous:
            self._thread = threading.Thread(
                target=self._dispatch_forever, name="ursa-inmemory-bus", daemon=True
            )
            self._thread.start()

    @property
    def retained(self) -> dict[str, bytes]:
        """A copy of the retained messages by topic."""
        with self._cond:
            return dict(self._retained)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued delivery has been handled."""
        if self._synchronous or threading.current_thread() is self._thread:
            return
        with self._cond:
            if not self._cond.wait_for(
                lambda: not self._queue and not self._busy, timeout_s
            ):
                raise TransportTimeoutError(f"bus not idle after {timeout_s} s")

    def close(self) -> None:
        """Stop the dispatcher thread (asynchronous mode); idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> InMemoryBus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _attach(self, transport: InMemoryTransport, clean_session: bool) -> None:
        with self._cond:
            session = self._sessions.get(transport.client_id)
            if session is not None and session.transport is not None:
                logger.info("client id %s taken over", transport.client_id)
                session.transport._state = TransportState.CLOSED
            if session is None or clean_session:
                session = self._sessions[transport.client_id] = _Session()
            session.transport = transport
            transport._state = TransportState.CONNECTED
            transport._connections += 1
            for topic, payload in session.offline:
                self._queue.append((transport, topic, payload, 1, False))
            session.offline.clear()
        self._kick()

    def _detach(self, transport: InMemoryTransport, clean_session: bool) -> None:
        with self._cond:
            session = self._sessions.get(transport.client_id)
            if session is None or session.transport is not transport:
                return
            session.transport = None
            if clean_session:
                del self._sessions[transport.client_id]

    def _subscribe(self, transport: InMemoryTransport, pattern: str, qos: int) -> None:
        with self._cond:
            session = self._sessions[transport.client_id]
            session.subscriptions[pattern] = qos
            for topic, payload in self._retained.items():
                if topic_matches(pattern, topic):
                    self._queue.append((transport, topic, payload, qos, True))
        self._kick()

    def _unsubscribe(self, transport: InMemoryTransport, pattern: str) -> None:
        with self._cond:
            self._sessions[transport.client_id].subscriptions.pop(pattern, None)

    def _route(
        self, sender_id: str, topic: str, payload: bytes, qos: int, retain: bool
    ) -> None:
        with self._cond:
            if retain:
                if payload:
                    self._retained[topic] = payload
                else:
                    self._retained.pop(topic, None)
            for client_id, session in self._sessions.items():
                sub_qos = [
                    q
                    for p, q in session.subscriptions.items()
                    if topic_matches(p, topic)
                ]
                if not sub_qos:
                    continue
                drop = self.drop_filter
                if drop is not None and drop(sender_id, client_id, topic, payload):
                    continue
                eff_qos = min(qos, max(sub_qos))
                if session.transport is not None:
                    self._queue.append(
                        (session.transport, topic, payload, eff_qos, False)
                    )
                elif eff_qos >= 1:
                    self._queue_offline(client_id, session, topic, payload)
        self._kick()

    def _queue_offline(
        self, client_id: str, session: _Session, topic: str, payload: bytes
    ) -> None:
        if len(session.offline) >= self.max_queued_messages:
            session.offline.popleft()
            logger.warning("session %s full; dropped its oldest message", client_id)
        session.offline.append((topic, payload))

    def _kick(self) -> None:
        if self._synchronous:
            self._drain()
        else:
            with self._cond:
                self._cond.notify_all()

    def _next(self) -> tuple[InMemoryTransport, str, bytes, bool] | None:
        """Pop the next live delivery (caller holds the lock), or None if empty."""
        while self._queue:
            target, topic, payload, qos, retained = self._queue.popleft()
            if target._state is TransportState.CONNECTED:
                return target, topic, payload, retained
            session = self._sessions.get(target.client_id)
            if qos >= 1 and session is not None and session.transport is None:
                self._queue_offline(target.client_id, session, topic, payload)
        return None

    def _deliver(
        self, target: InMemoryTransport, topic: str, payload: bytes, retained: bool
    ) -> None:
        target._counter.count_received(len(payload))
        if not call_handler(target._handler_for(retained), topic, payload):
            with self._cond:
                self.handler_errors += 1

    def _drain(self) -> None:
        with self._cond:
            if self._busy:
                return  # an outer _drain on the stack (or another thread) delivers it
            self._busy = True
        try:
            while True:
                with self._cond:
                    item = self._next()
                    if item is None:
                        self._busy = False
                        return
                self._deliver(*item)
        except BaseException:
            with self._cond:
                self._busy = False
            raise

    def _dispatch_forever(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: bool(self._queue) or self._closed)
                if self._closed:
                    return
                item = self._next()
                self._busy = item is not None
            if item is not None:
                self._deliver(*item)


class InMemoryTransport(TransportBase):
    """A `Transport` on an `InMemoryBus`: what unit tests and simulations use.

    Args:
        bus: the shared in-process broker.
        client_id: the client id (an ursa device uses its device id).
        will: last will `(topic, payload, retain)`, published by `kill()`.
        clean_session: False (default) keeps subscriptions and queued QoS >= 1
            messages across connections, like the MQTT transport.

    It never reconnects: `connections` is 1 once connected.
    """

    def __init__(
        self,
        bus: InMemoryBus,
        client_id: str,
        *,
        will: tuple[str, bytes, bool] | None = None,
        clean_session: bool = False,
    ) -> None:
        if not client_id:
            raise ValueError("client_id must not be empty")
        if will is not None:
            validate_topic(will[0])
        super().__init__(client_id)
        self._bus = bus
        self._will = will
        self._clean_session = clean_session

    def connect(self) -> None:
        """Attach to the bus, resume the session and subscribe to known filters."""
        if self._state is not TransportState.NEW:
            raise TransportError(f"connect() in state {self._state}; make a new one")
        self._bus._attach(self, self._clean_session)
        for pattern, qos in self._subscriptions.filters():
            self._bus._subscribe(self, pattern, qos)

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Route `payload` to every matching subscriber (see `InMemoryBus`)."""
        check_publish_args(topic, payload, qos, self._bus.max_payload_bytes)
        if not self.is_connected:
            raise NotConnectedError(f"{self._client_id} is {self._state}")
        payload = bytes(payload)
        self._counter.count_sent(len(payload))
        self._bus._route(self._client_id, topic, payload, qos, retain)

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe to `pattern`; retained matches are delivered at once."""
        self._subscriptions.add(pattern, qos)
        if self.is_connected:
            self._bus._subscribe(self, pattern, qos)

    def unsubscribe(self, pattern: str) -> None:
        """Forget `pattern`."""
        self._subscriptions.remove(pattern)
        if self.is_connected:
            self._bus._unsubscribe(self, pattern)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the bus has delivered everything queued so far."""
        self._bus.flush(timeout_s)

    def close(self) -> None:
        """Disconnect cleanly (no will); idempotent."""
        if self._state is TransportState.CONNECTED:
            self._bus._detach(self, self._clean_session)
        self._state = TransportState.CLOSED

    def kill(self) -> None:
        """Simulate an abrupt disconnect: the bus publishes the last will."""
        if self._state is not TransportState.CONNECTED:
            self._state = TransportState.CLOSED
            return
        self._bus._detach(self, self._clean_session)
        self._state = TransportState.CLOSED
        if self._will is not None:
            topic, payload, retain = self._will
            self._bus._route(self._client_id, topic, payload, 1, retain)
