"""`MqttPool`: many MQTT connections on one selector loop, no thread per client.

`MqttTransport` gives each client paho's own network thread and a delivery
thread; paho's ``loop()`` then uses ``select()``, which fails past file
descriptor 1024, so one process holds a few hundred clients at most. A load
generator needs thousands per process: here one loop (`selectors`, epoll on
Linux) drives every paho client through paho's external-loop API
(``on_socket_open/close``, ``on_socket_(un)register_write``, ``loop_read``,
``loop_write``, ``loop_misc``).

Everything paho does happens on the loop's thread. Messages are queued by
paho's callback and handed to each transport's handler after the I/O of the
loop's iteration, for at most `DELIVERY_SLICE_S` before the sockets are
served again, so a handler runs outside paho's callbacks but on the same
thread: a handler must not block (it may publish; `connect` and `flush` do
not wait there). Other threads reach the loop through `call_soon`.

A refused CONNACK for bad credentials or authorisation closes the transport;
any other refusal or a lost connection is retried with jittered exponential
backoff, and the subscriptions are renewed on every connection. TLS is not
supported (paho's TLS reads need a second look at the socket's pending bytes).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import random
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ursa.protocol.mqtt_config import MqttConfig
from ursa.protocol.paho_client import check_publish_rc, new_client, start_connect
from ursa.protocol.transport import (
    BrokerRefusedError,
    NotConnectedError,
    TransportError,
    TransportState,
    TransportTimeoutError,
    call_handler,
)
from ursa.protocol.transport_base import TransportBase
from ursa.protocol.unacked import Unacked

__all__ = ["MqttPool", "PooledTransport"]

logger = logging.getLogger(__name__)

MISC_INTERVAL_S = 1.0
"""How often every client's keepalive is checked (`loop_misc`)."""

DELIVERY_SLICE_S = 0.05
"""Handlers (and calls from `call_soon`) run at most this long per iteration
before the loop turns again.

A global message reaches every client of the pool at once; handing all of
them out in one go (each device's Paillier work included) would starve the
sockets for longer than the keepalive, and the broker would drop them all.
"""

_FATAL_REFUSALS = {"Bad user name or password", "Not authorized"}
"""CONNACK reasons that no retry can fix (MQTT 3.1.1 codes 4 and 5, v5 alike)."""


class MqttPool:
    """One event loop for many `PooledTransport` clients.

    Run the loop with `run` (until a stop event) or `run_once` on one thread;
    that thread is then the only one that touches paho.
    """

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._calls: deque[Callable[[], None]] = deque()
        self._inbox: deque[tuple[PooledTransport, str, bytes]] = deque()
        self._transports: list[PooledTransport] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._next_misc = 0.0
        self._rng = rng or random.Random()

    @property
    def transports(self) -> list[PooledTransport]:
        """Every transport made by this pool."""
        return list(self._transports)

    def transport(self, config: MqttConfig) -> PooledTransport:
        """A new client of this pool (not connected yet: `open` or `connect`)."""
        if config.tls:
            raise ValueError("MqttPool does not support TLS; use MqttTransport")
        transport = PooledTransport(self, config)
        self._transports.append(transport)
        return transport

    def in_loop(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return self._thread is threading.current_thread()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop's thread soon (safe from any thread)."""
        self._calls.append(fn)
        if not self.in_loop():
            with contextlib.suppress(OSError):  # full: the loop is awake already
                self._wake_w.send(b"x")

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop's thread after `delay_s` (from the loop's thread)."""
        when = time.monotonic() + max(0.0, delay_s)
        heapq.heappush(self._timers, (when, next(self._sequence), fn))

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set (checked at least every 0.2 s)."""
        while not stop.is_set():
            self.run_once(0.2)

    def run_once(self, timeout_s: float) -> None:
        """One iteration: I/O, due timers, calls from other threads, deliveries."""
        self._thread = threading.current_thread()
        busy = self._calls or self._inbox
        now = time.monotonic()
        if self._timers:
            timeout_s = min(timeout_s, max(0.0, self._timers[0][0] - now))
        for key, mask in self._selector.select(0.0 if busy else timeout_s):
            owner = key.data
            if owner is None:
                self._drain_wakeups()
                continue
            if mask & selectors.EVENT_READ:
                owner.on_readable()
            if mask & selectors.EVENT_WRITE:
                owner.on_writable()
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, fn = heapq.heappop(self._timers)
            self._guarded(fn)
        deadline = time.monotonic() + DELIVERY_SLICE_S
        while self._calls and time.monotonic() < deadline:
            self._guarded(self._calls.popleft())
        deadline = time.monotonic() + DELIVERY_SLICE_S
        while self._inbox and time.monotonic() < deadline:
            transport, topic, payload = self._inbox.popleft()
            transport.deliver(topic, payload)
        if now >= self._next_misc:
            self._next_misc = now + MISC_INTERVAL_S
            for transport in self._transports:
                transport.on_misc()

    def close(self) -> None:
        """Drop every connection (no DISCONNECT) and release the loop's sockets."""
        for transport in self._transports:
            transport.drop()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def backoff_s(self, attempt: int, min_s: float, max_s: float) -> float:
        """Jittered exponential backoff: a herd of clients spreads out."""
        return float(self._rng.uniform(0.5, 1.0) * min(max_s, min_s * 2**attempt))

    # --- used by PooledTransport (loop thread) ---------------------------------

    def watch(self, sock: Any, owner: PooledTransport, write: bool) -> None:
        """Select `sock` for reading, and for writing if `write`."""
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        try:
            self._selector.modify(sock, events, owner)
        except KeyError:
            self._selector.register(sock, events, owner)

    def unwatch(self, sock: Any) -> None:
        """Stop selecting `sock` (closed, or never watched)."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def received(self, transport: PooledTransport, topic: str, payload: bytes) -> None:
        """Queue a message for `transport`'s handler (after this iteration's I/O)."""
        self._inbox.append((transport, topic, payload))

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    @staticmethod
    def _guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            logger.exception("MqttPool: a scheduled call failed")


class PooledTransport(TransportBase):
    """A `Transport` whose network I/O runs on its `MqttPool`'s loop.

    Lifecycle as `MqttTransport`: NEW -> `open()`/`connect()` -> CONNECTED <->
    RECONNECTING -> `close()` -> CLOSED. QoS >= 1 publishes are queued by
    paho while not connected and sent after the CONNACK.
    """

    def __init__(self, pool: MqttPool, config: MqttConfig) -> None:
        super().__init__(config.client_id)
        self._pool = pool
        self._config = config
        self._attempts = 0
        self._unacked = Unacked()
        self._settled = threading.Condition()  # signals the CONNACK or the close
        self._refusal: str | None = None
        self._on_connected: Callable[[PooledTransport], None] | None = None
        self._client = self._make_client()

    @property
    def subscribing(self) -> bool:
        """True while a SUBSCRIBE of this connection awaits its SUBACK."""
        return self._subscriptions.is_due

    @property
    def refusal(self) -> str | None:
        """Why the broker refused this client for good (None: it did not)."""
        return self._refusal

    def open(
        self, on_connected: Callable[[PooledTransport], None] | None = None
    ) -> None:
        """Start connecting without waiting (loop thread); retried until accepted.

        `on_connected` runs on the loop's thread after every accepted CONNACK.
        """
        if self._state is not TransportState.NEW:
            raise TransportError(f"open() in state {self._state}; make a new one")
        self._on_connected = on_connected
        self._state = TransportState.CONNECTING
        start_connect(self._client, self._config, now=False)
        self._attempt()

    def connect(self) -> None:
        """Connect and wait for the CONNACK (not from the loop's thread).

        Raises:
            BrokerRefusedError: bad credentials or not authorised.
            TransportTimeoutError: not accepted within `timeout_s`.
            TransportError: called on the loop's thread, or not NEW.
        """
        if self._pool.in_loop():
            raise TransportError("connect() would block the loop: use open()")
        if self._state is not TransportState.NEW:
            raise TransportError(f"connect() in state {self._state}; make a new one")
        self._pool.call_soon(self.open)
        with self._settled:
            done = self._settled.wait_for(
                lambda: self._connections > 0 or self._state is TransportState.CLOSED,
                self._config.timeout_s,
            )
        if self._refusal is not None:
            raise BrokerRefusedError(
                f"broker refused {self.client_id}: {self._refusal}"
            )
        if not done or self._connections == 0:
            self.close()
            raise TransportTimeoutError(
                f"{self.client_id}: no CONNACK within {self._config.timeout_s} s"
            )

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Hand `payload` to paho (queued until connected for QoS >= 1).

        Raises:
            PayloadTooLargeError: above `max_payload_bytes` (nothing sent).
            NotConnectedError: closed, or QoS 0 while not connected.
        """
        self._check_paho_publish(topic, payload, qos, self._config.max_payload_bytes)
        data = bytes(payload)
        if not self._pool.in_loop():
            self._unacked.hand_off()
            self._pool.call_soon(lambda: self._publish_logged(topic, data, qos, retain))
            self._counter.count_sent(len(data))
            return
        self._publish_now(topic, data, qos, retain)
        self._counter.count_sent(len(data))

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe to `pattern` (renewed on every connection; no wait for SUBACK)."""
        if self._state is TransportState.CLOSED:
            raise NotConnectedError(f"{self.client_id} is closed")
        self._subscriptions.add(pattern, qos)
        if self.is_connected:
            self._on_loop(lambda: self._send_subscribe([(pattern, qos)]))

    def unsubscribe(self, pattern: str) -> None:
        """Forget `pattern`."""
        self._subscriptions.remove(pattern)
        if self.is_connected:
            self._on_loop(lambda: self._client.unsubscribe(pattern))

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait for every PUBACK; on the loop's thread it cannot wait, and returns."""
        if not self._pool.in_loop():
            self._unacked.wait(timeout_s, self.client_id)

    def close(self) -> None:
        """Send DISCONNECT (the broker drops the will); idempotent."""
        if self._state is TransportState.CLOSED:
            return
        self._state = TransportState.CLOSED
        self._on_loop(self._client.disconnect)
        self._unacked.close()
        self._wake_waiters()

    def drop(self) -> None:
        """Close the socket without DISCONNECT, so the will fires (tests, teardown)."""
        self._state = TransportState.CLOSED
        sock = self._client.socket()
        if isinstance(sock, socket.socket):
            self._pool.unwatch(sock)
            sock.close()
        self._unacked.close()
        self._wake_waiters()

    # --- the loop's side -----------------------------------------------------

    def on_readable(self) -> None:
        """The socket has bytes: paho reads packets (callbacks follow)."""
        self._client.loop_read()

    def on_writable(self) -> None:
        """The socket takes bytes: paho writes what it queued."""
        self._client.loop_write()

    def on_misc(self) -> None:
        """Keepalive: PINGREQ when due, a dead link noticed."""
        if self._state is not TransportState.CLOSED and self._client.socket():
            self._client.loop_misc()

    def deliver(self, topic: str, payload: bytes) -> None:
        """Hand one received message to the handler (errors logged)."""
        if self._state is not TransportState.CLOSED:
            call_handler(self._handler, topic, payload)

    def _on_loop(self, fn: Callable[[], object]) -> None:
        def call() -> None:
            fn()

        if self._pool.in_loop():
            call()
        else:
            self._pool.call_soon(call)

    def _publish_logged(self, topic: str, data: bytes, qos: int, retain: bool) -> None:
        try:
            self._publish_now(topic, data, qos, retain)
        except TransportError as exc:
            logger.error("%s: publish to %s failed: %s", self.client_id, topic, exc)
        finally:
            self._unacked.handed()

    def _publish_now(self, topic: str, data: bytes, qos: int, retain: bool) -> None:
        info = self._client.publish(topic, data, qos=qos, retain=retain)
        check_publish_rc(info.rc)
        self._unacked.published(info.mid, qos)  # its ack is read here, later

    def _attempt(self) -> None:
        """One connection attempt; a failure schedules the next."""
        if self._state is TransportState.CLOSED:
            return
        try:
            self._client.reconnect()
        except (OSError, ValueError) as exc:
            logger.debug("%s: connect failed: %s", self.client_id, exc)
            self._retry()

    def _retry(self) -> None:
        cfg = self._config
        delay = self._pool.backoff_s(
            self._attempts, cfg.reconnect_min_delay_s, cfg.reconnect_max_delay_s
        )
        self._attempts += 1
        self._pool.call_later(delay, self._attempt)

    def _wake_waiters(self) -> None:
        with self._settled:
            self._settled.notify_all()

    def _make_client(self) -> paho.Client:
        client = new_client(self._config)
        # No cap on paho's queue: nothing drains it while a handler runs (on
        # the loop's thread), so one handler's burst (an agent sealing a key
        # to every device) would overrun `max_queued_messages`.
        client.max_queued_messages_set(0)
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        return client

    # paho callbacks (loop thread): record, queue, return.

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._pool.watch(sock, self, client.want_write())

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._pool.unwatch(sock)

    def _on_register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._pool.watch(sock, self, True)

    def _on_unregister_write(
        self, client: paho.Client, userdata: Any, sock: Any
    ) -> None:
        if client.socket() is sock:
            self._pool.watch(sock, self, False)

    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self._state is TransportState.CLOSED:
            return
        if reason_code.is_failure:
            # paho closes the socket and calls `_on_disconnect`, which retries
            text = str(reason_code)
            if text in _FATAL_REFUSALS:
                logger.error("%s: broker refused: %s", self.client_id, text)
                self._refusal = text
                self._state = TransportState.CLOSED
                self._unacked.close()
                self._wake_waiters()
            else:
                logger.info("%s: CONNACK %s; retrying", self.client_id, text)
            return
        self._state = TransportState.CONNECTED
        self._connections += 1
        self._subscriptions.new_connection()
        self._attempts = 0
        filters = self._subscriptions.filters()
        if filters:
            self._send_subscribe(filters)
        self._wake_waiters()
        if self._on_connected is not None:
            callback = self._on_connected
            self._pool.call_soon(lambda: callback(self))

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if self._state in (TransportState.CLOSED, TransportState.RECONNECTING):
            return
        logger.warning(
            "%s: connection lost (%s); reconnecting", self.client_id, reason_code
        )
        self._state = TransportState.RECONNECTING
        self._retry()

    def _on_message(
        self, client: paho.Client, userdata: Any, message: paho.MQTTMessage
    ) -> None:
        payload = bytes(message.payload)
        self._counter.count_received(len(payload))
        self._pool.received(self, message.topic, payload)

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        self._unacked.acked(mid)

    def _send_subscribe(self, patterns: list[tuple[str, int]]) -> None:
        rc, mid = self._client.subscribe(patterns)
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
            self._subscriptions.sent(mid)

    def _on_subscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        self._subscriptions.acked(mid, [code.is_failure for code in reason_codes])
        if any(code.is_failure for code in reason_codes):
            logger.error("%s: broker refused a subscription", self.client_id)
