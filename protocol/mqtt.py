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

import collections
import contextlib
import logging
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ursa.protocol.mqtt_config import DEFAULT_TIMEOUT_S, MqttConfig, TlsContext
from ursa.protocol.transport import (
    BrokerRefusedError,
    MessageHandler,
    NotConnectedError,
    QueueFullError,
    SubscriptionRefusedError,
    TrafficCounter,
    TransportError,
    TransportState,
    TransportStats,
    TransportTimeoutError,
    call_handler,
    check_publish_args,
    validate_filter,
)

__all__ = ["MqttConfig", "MqttTransport"]  # MqttConfig re-exported for callers

logger = logging.getLogger(__name__)

_MQTT_OK = MQTTErrorCode.MQTT_ERR_SUCCESS
_SUBACK_MEMORY = 256  # SUBACK results kept for waiters (older ones age out)
_new_properties: Callable[[int], Properties] = Properties
"""`Properties(packet_type)`, whose ``__init__`` paho leaves unannotated."""


class _PahoNoise(logging.Filter):
    """Drop the error paho 2.2 logs after every clean disconnect.

    Its network loop polls once more after the socket is gone.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Client is not connected. Socket: None")


_PAHO_LOGGER = logging.getLogger(f"{__name__}.paho")
_PAHO_LOGGER.addFilter(_PahoNoise())


class MqttTransport:
    """A `Transport` over MQTT (paho-mqtt 2.x, `CallbackAPIVersion.VERSION2`).

    Lifecycle: NEW -> `connect()` -> CONNECTED <-> RECONNECTING -> `close()` /
    `kill()` -> CLOSED; a closed transport is not reused. While RECONNECTING,
    QoS >= 1 publishes are queued by paho (up to `max_queued_messages`) and
    sent after the reconnect; QoS 0 ones raise NotConnectedError.
    """

    def __init__(self, config: MqttConfig) -> None:
        self._config = config
        self._state = TransportState.NEW
        self._connections = 0
        self._lock = threading.Condition()
        self._handler: MessageHandler | None = None
        self._patterns: dict[str, int] = {}
        self._counter = TrafficCounter()
        self._inbox: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._connack: ReasonCode | None = None
        self._connect_sub_mid: int | None = None
        self._subacks: collections.OrderedDict[int, list[ReasonCode]] = (
            collections.OrderedDict()
        )
        self._unacked: set[int] = set()
        self._qos0_mids: set[int] = set()
        self._early_acks: set[int] = set()
        self._tls_context = TlsContext.from_config(config) if config.tls else None
        self._client = self._make_client()

    @property
    def client_id(self) -> str:
        """The MQTT client id."""
        return self._config.client_id

    @property
    def config(self) -> MqttConfig:
        """The configuration this transport was made with."""
        return self._config

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
        """Route every received message to `handler` (on the delivery thread)."""
        self._handler = handler

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
            if cfg.protocol == "5":
                props = _new_properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = (
                    0 if cfg.clean_start else cfg.session_expiry_s
                )
                self._client.connect(
                    cfg.host,
                    cfg.port,
                    cfg.keepalive_s,
                    clean_start=cfg.clean_start,
                    properties=props,
                )
            else:
                self._client.connect(cfg.host, cfg.port, cfg.keepalive_s)
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
        mid = self._connect_sub_mid
        if mid is not None:
            try:
                self._check_suback(mid, list(self._patterns))
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
        check_publish_args(topic, payload, qos, self._config.max_payload_bytes)
        if self._state in (TransportState.NEW, TransportState.CLOSED) or (
            qos == 0 and not self.is_connected
        ):
            raise NotConnectedError(f"{self.client_id} is {self._state}")
        try:
            info = self._client.publish(topic, bytes(payload), qos=qos, retain=retain)
        except ValueError as exc:
            raise TransportError(f"paho refused the publish: {exc}") from exc
        if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            raise QueueFullError(
                f"{self.client_id}: {self._config.max_queued_messages} messages "
                "already await acknowledgement"
            )
        if info.rc not in (
            MQTTErrorCode.MQTT_ERR_SUCCESS,
            MQTTErrorCode.MQTT_ERR_NO_CONN,
        ):
            raise TransportError(f"publish failed: {paho.error_string(info.rc)}")
        if info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos == 0:
            raise NotConnectedError(f"{self.client_id} lost its connection")
        with self._lock:
            if info.mid in self._early_acks:
                self._early_acks.discard(info.mid)
            elif qos > 0:
                self._unacked.add(info.mid)
            else:
                self._qos0_mids.add(info.mid)
        self._counter.count_sent(len(payload))

    def subscribe(self, pattern: str, qos: int = 1) -> None:
        """Subscribe to `pattern` and, if connected, wait for the SUBACK.

        Raises:
            SubscriptionRefusedError: the broker refused (the filter is
                forgotten again).
            TransportTimeoutError: no SUBACK in time (the filter stays in the
                table and is renewed on the next reconnect).
        """
        validate_filter(pattern)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, got {qos}")
        if self._state is TransportState.CLOSED:
            raise NotConnectedError(f"{self.client_id} is closed")
        self._patterns[pattern] = qos
        if not self.is_connected:
            return
        rc, mid = self._client.subscribe(pattern, qos)
        if rc == _MQTT_OK and mid is not None:
            self._check_suback(mid, [pattern])

    def unsubscribe(self, pattern: str) -> None:
        """Forget `pattern` (no wait for the UNSUBACK)."""
        self._patterns.pop(pattern, None)
        if self.is_connected:
            self._client.unsubscribe(pattern)

    def flush(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until every QoS >= 1 publish so far has been acknowledged."""
        closed = TransportState.CLOSED
        with self._lock:
            done = self._lock.wait_for(
                lambda: not self._unacked or self._state is closed, timeout_s
            )
            if self._unacked:
                if done:
                    raise NotConnectedError(f"{self.client_id} closed before PUBACKs")
                raise TransportTimeoutError(
                    f"{len(self._unacked)} publishes unacknowledged after {timeout_s} s"
                )

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
        self._inbox.put(None)
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        with self._lock:
            self._lock.notify_all()

    def _abort(self) -> None:
        """Give up a connection attempt (DISCONNECT also ends paho's retry wait)."""
        self._state = TransportState.CLOSED
        self._client.disconnect()
        self._shutdown()

    def _check_suback(self, mid: int, patterns: list[str]) -> None:
        timeout_s = self._config.timeout_s
        with self._lock:
            if not self._lock.wait_for(lambda: mid in self._subacks, timeout_s):
                raise TransportTimeoutError(
                    f"no SUBACK for {patterns} within {timeout_s} s"
                )
            codes = self._subacks.pop(mid)
        refused = [
            p for p, code in zip(patterns, codes, strict=False) if code.is_failure
        ]
        if refused:
            for pattern in refused:
                self._patterns.pop(pattern, None)
            raise SubscriptionRefusedError(f"broker refused the filter(s) {refused}")

    def _make_client(self) -> paho.Client:
        cfg = self._config
        v5 = cfg.protocol == "5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=cfg.client_id,
            clean_session=None if v5 else cfg.clean_start,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
        )
        client.enable_logger(_PAHO_LOGGER)
        if cfg.username is not None:
            password = cfg.password.get_secret_value() if cfg.password else None
            client.username_pw_set(cfg.username, password)
        if self._tls_context is not None:
            client.tls_set_context(self._tls_context)
        if cfg.will_topic is not None:
            client.will_set(
                cfg.will_topic, cfg.will_payload, cfg.will_qos, cfg.will_retain
            )
        client.reconnect_delay_set(cfg.reconnect_min_delay_s, cfg.reconnect_max_delay_s)
        client.max_inflight_messages_set(cfg.max_inflight_messages)
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
                patterns = list(self._patterns.items())
                if patterns:
                    _, mid = client.subscribe(patterns)
                    self._connect_sub_mid = mid
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
            self._inbox.put((message.topic, payload))
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
            with self._lock:
                if mid in self._unacked:
                    self._unacked.discard(mid)
                    self._lock.notify_all()
                elif mid in self._qos0_mids:
                    self._qos0_mids.discard(mid)
                else:
                    self._early_acks.add(mid)
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
            with self._lock:
                self._subacks[mid] = list(reason_codes)
                while len(self._subacks) > _SUBACK_MEMORY:
                    self._subacks.popitem(last=False)
                self._lock.notify_all()
            if any(code.is_failure for code in reason_codes):
                logger.warning("%s: subscription refused", self.client_id)
        except Exception:
            logger.exception("on_subscribe failed")

    def _deliver_forever(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            call_handler(self._handler, *item)
