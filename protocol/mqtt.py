"""`MqttTransport`: the `Transport` over a real broker with paho-mqtt 2.x.

paho runs its network loop in its own thread (`loop_start`). Its callbacks
only decode, enqueue and return, inside a try/except (an exception would kill
that thread); our own delivery thread hands messages to the handler, so a slow
handler never stalls keepalives or acknowledgements. Subscriptions are kept in
a table and renewed in `on_connect`, so they survive reconnects with or
without a persistent session. paho does not cap payloads, and a QoS 1 message
above the broker's limit is retried forever after every reconnect, so
`publish` refuses anything above `MqttConfig.max_payload_bytes`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ursa.protocol.mqtt_config import DEFAULT_TIMEOUT_S, MqttConfig, TlsContext
from ursa.protocol.paho_client import check_publish_rc, new_client, start_connect
from ursa.protocol.transport import (
    BrokerRefusedError,
    NotConnectedError,
    QueueFullError,
    TransportError,
    TransportState,
    TransportTimeoutError,
    call_handler,
)
from ursa.protocol.transport_base import TransportBase
from ursa.protocol.unacked import Unacked

__all__ = ["MqttConfig", "MqttTransport"]  # MqttConfig re-exported for callers

logger = logging.getLogger(__name__)
_PAHO_THREAD = "paho-mqtt-client-"
"""The name paho gives its network thread (`Client.loop_start`)."""

_MQTT_OK = MQTTErrorCode.MQTT_ERR_SUCCESS


class _PahoNoise(logging.Filter):
    """Drop the error paho 2.2 logs after every clean disconnect.

    Its network loop polls once more after the socket is gone.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Client is not connected. Socket: None")


_PAHO_LOGGER = logging.getLogger(f"{__name__}.paho")
_PAHO_LOGGER.addFilter(_PahoNoise())


class MqttTransport(TransportBase):
    """A `Transport` over MQTT (paho-mqtt 2.x, `CallbackAPIVersion.VERSION2`).

    Lifecycle: NEW -> `connect()` -> CONNECTED <-> RECONNECTING -> `close()` /
    `kill()` -> CLOSED; a closed transport is not reused. While RECONNECTING,
    QoS >= 1 publishes are queued by paho (up to `max_queued_messages`) and
    sent after the reconnect; QoS 0 ones raise NotConnectedError.
    """

    def __init__(self, config: MqttConfig) -> None:
        super().__init__(config.client_id)
        self._config = config
        self._lock = threading.Condition()  # guards and signals the CONNACK
        self._inbox: queue.SimpleQueue[tuple[str, bytes, bool] | None] = (
            queue.SimpleQueue()
        )
        self._worker: threading.Thread | None = None
        self._connack: ReasonCode | None = None
        self._connect_sub: tuple[int, list[str]] | None = None
        self._unacked = Unacked()
        self._tls_context = TlsContext.from_config(config) if config.tls else None
        self._client = self._make_client()

    @property
    def config(self) -> MqttConfig:
        """The configuration this transport was made with."""
        return self._config

    def connect(self) -> None:
        """Open the connection and wait for CONNACK and the initial SUBACK.

        Raises:
            BrokerRefusedError: the broker refused (bad credentials, ACL).
            SubscriptionRefusedError: a filter subscribed before `connect()`
                was refused (the transport is closed again).
            TransportTimeoutError: no CONNACK or SUBACK within `timeout_s`.
            TransportError: the TCP or TLS connection failed.
        """
        if self._state is not TransportState.NEW:
            raise TransportError(f"connect() in state {self._state}; make a new one")
        self._state = TransportState.CONNECTING
        self._worker = threading.Thread(
            target=self._deliver_forever,
            name=f"ursa-mqtt-deliver-{self.client_id}",
            daemon=True,
        )
        self._worker.start()
        cfg = self._config
        try:
            start_connect(self._client, cfg, now=True)
        except (OSError, ValueError) as exc:
            self._abort()
            if self._tls_context is not None:
                self._tls_context.close_last_socket()
            raise TransportError(
                f"cannot connect to {cfg.host}:{cfg.port}: {exc}"
            ) from exc
        self._client.loop_start()
        with self._lock:
            got = self._lock.wait_for(lambda: self._connack is not None, cfg.timeout_s)
            connack = self._connack
        if not got or connack is None:
            self._abort()
            raise TransportTimeoutError(
                f"no CONNACK from {cfg.host}:{cfg.port} within {cfg.timeout_s} s"
            )
        if connack.is_failure:
            self._abort()
            raise BrokerRefusedError(
                f"{cfg.host}:{cfg.port} refused client {self.client_id}: {connack}"
            )
        renewal = self._connect_sub
        if renewal is not None:
            try:
                self._subscriptions.wait(*renewal, cfg.timeout_s)
            except TransportError:
                self._abort()
                raise

    def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Hand `payload` to paho; QoS >= 1 is kept until PUBACK (see `flush`).

        Raises:
            PayloadTooLargeError: above `max_payload_bytes` (nothing sent).
            NotConnectedError: closed, or QoS 0 while not connected.
            QueueFullError: `max_queued_messages` unacknowledged already.
        """
        self._check_paho_publish(topic, payload, qos, self._config.max_payload_bytes)
        try:
            info = self._client.publish(topic, bytes(payload), qos=qos, retain=retain)
        except ValueError as exc:
            raise TransportError(f"paho refused the publish: {exc}") from exc
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            raise QueueFullError(
                f"{self.client_id}: {self._config.max_queued_messages} messages "
                "already await acknowledgement"
            )
        check_publish_rc(info.rc)
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos == 0:
            raise NotConnectedError(f"{self.client_id} lost its connection")
        self._unacked.published(info.mid, qos)
        self._counter.count_sent(len(payload))

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe to `pattern` and, if connected, wait for the SUBACK.

        Raises:
            SubscriptionRefusedError: the broker refused (the filter is
                forgotten again).
            TransportTimeoutError: no SUBACK in time (the filter stays in the
                table and is renewed on the next reconnect).
        """
        if self._state is TransportState.CLOSED:
            raise NotConnectedError(f"{self.client_id} is closed")
        self._subscriptions.add(pattern, qos)
        if not self.is_connected:
            return
        rc, mid = self._client.subscribe(pattern, qos)
        if rc == _MQTT_OK and mid is not None:
            self._subscriptions.wait(mid, [pattern], self._config.timeout_s)

    def unsubscribe(self, pattern: str) -> None:
        """Forget `pattern` (no wait for the UNSUBACK)."""
        self._subscriptions.remove(pattern)
        if self.is_connected:
            self._client.unsubscribe(pattern)

    def flush(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until every QoS >= 1 publish so far has been acknowledged.

        Raises:
            NotConnectedError: closed before every PUBACK came.
            TransportTimeoutError: some unacknowledged after `timeout_s`.
        """
        self._unacked.wait(timeout_s, self.client_id)

    def close(self) -> None:
        """Send DISCONNECT (the broker drops the will) and stop; idempotent.

        QoS >= 1 publishes not yet acknowledged may be lost: `flush()` first.
        """
        if self._state is not TransportState.CLOSED:
            self._abort()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT, so the will fires (tests)."""
        if self._state is TransportState.CLOSED:
            return
        self._state = TransportState.CLOSED
        sock = self._client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._shutdown()

    def _shutdown(self) -> None:
        self._state = TransportState.CLOSED
        self._client.loop_stop()
        if not threading.current_thread().name.startswith(_PAHO_THREAD):
            # joined: close its wake-up socket pair now (paho has no public
            # call for it; left to Client.__del__, a garbage-collected cycle
            # may finalise the sockets first and warn of unclosed sockets)
            self._client._reset_sockets(sockpair_only=True)
        self._inbox.put(None)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        self._unacked.close()
        with self._lock:
            self._lock.notify_all()

    def _abort(self) -> None:
        """Give up a connection attempt (DISCONNECT also ends paho's retry wait)."""
        self._state = TransportState.CLOSED
        self._client.disconnect()
        self._shutdown()

    def _make_client(self) -> paho.Client:
        cfg = self._config
        client = new_client(cfg)
        client.enable_logger(_PAHO_LOGGER)
        if self._tls_context is not None:
            client.tls_set_context(self._tls_context)
        client.reconnect_delay_set(cfg.reconnect_min_delay_s, cfg.reconnect_max_delay_s)
        client.max_queued_messages_set(cfg.max_queued_messages)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        return client

    # paho callbacks: run on paho's network thread; record, enqueue, return.

    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        try:
            if not reason_code.is_failure and self._state is not TransportState.CLOSED:
                self._state = TransportState.CONNECTED
                self._connections += 1
                filters = self._subscriptions.filters()
                if filters:
                    _, mid = client.subscribe(filters)
                    if mid is not None:
                        self._connect_sub = (mid, [p for p, _ in filters])
                logger.info(
                    "%s connected (session present: %s)",
                    self.client_id,
                    flags.session_present,
                )
            elif reason_code.is_failure:
                logger.error("%s: broker refused: %s", self.client_id, reason_code)
            with self._lock:
                self._connack = reason_code
                self._lock.notify_all()
        except Exception:
            logger.exception("on_connect failed")

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        try:
            if self._state is TransportState.CONNECTED:
                self._state = TransportState.RECONNECTING
                logger.warning(
                    "%s lost its connection (%s); reconnecting",
                    self.client_id,
                    reason_code,
                )
        except Exception:
            logger.exception("on_disconnect failed")

    def _on_message(
        self, client: paho.Client, userdata: Any, message: paho.MQTTMessage
    ) -> None:
        try:
            payload = bytes(message.payload)
            self._counter.count_received(len(payload))
            self._inbox.put((message.topic, payload, bool(message.retain)))
        except Exception:
            logger.exception("on_message failed (topic not UTF-8?); message dropped")

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        try:
            self._unacked.acked(mid)
        except Exception:
            logger.exception("on_publish failed")

    def _on_subscribe(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_codes: list[ReasonCode],
        properties: Properties | None,
    ) -> None:
        try:
            self._subscriptions.acked(mid, [c.is_failure for c in reason_codes])
            if any(code.is_failure for code in reason_codes):
                logger.warning("%s: subscription refused", self.client_id)
        except Exception:
            logger.exception("on_subscribe failed")

    def _deliver_forever(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            topic, payload, retained = item
            call_handler(self._handler_for(retained), topic, payload)
