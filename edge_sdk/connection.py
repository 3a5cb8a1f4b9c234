"""`DeviceConnection`: the device's broker connection, outbox and retained status.

Client id = username = device id; the retained ``online`` status, with the
last will ``offline`` (`device_will`). Everything the device sends is queued
in the outbox under the client's lock and published outside it (`flush`).
A broker that stops publishes every client's will, so after a reconnect the
device says ``online`` again (`announce_after_reconnect`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.device_link import DeviceLink
from ursa.protocol.connect import connect_patiently
from ursa.protocol.envelope import encode
from ursa.protocol.messages import Status
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import device_subscriptions, status_topic
from ursa.protocol.transport import Transport, TransportError

__all__ = ["DeviceConnection", "device_will"]

logger = logging.getLogger("ursa.edge_sdk")

Handler = Callable[[str, bytes], None]


def device_will(config: DeviceConfig) -> tuple[str, bytes]:
    """A device's retained last will: `Status(online=False)` on its status topic."""
    offline = _status(config, online=False)
    return status_topic(config.federation, config.device_id), encode(offline)


def _status(config: DeviceConfig, *, online: bool) -> Status:
    return Status(
        federation=config.federation,
        round=0,
        sender=config.device_id,
        online=online,
        state="online" if online else "offline",
    )


class DeviceConnection:
    """The transport (given, or built from ``[broker]``) and the outbox.

    Args:
        link: The device (its config; the run its status is stamped with).
        outbox: Where everything sent waits for `flush`.
        transport: A transport (tests: in-memory); None builds an
            `MqttTransport` on `open`.
    """

    def __init__(
        self, link: DeviceLink, outbox: Outbox, transport: Transport | None
    ) -> None:
        self._link = link
        self._outbox = outbox
        self._transport = transport
        self._was_connected = False
        self._connections = 0
        """`Transport.connections` when the device last said it is online."""

    @property
    def transport(self) -> Transport | None:
        """The transport (after `open`, or as given)."""
        return self._transport

    def open(self, handler: Handler, stop: threading.Event | None) -> None:
        """Connect (waiting for a broker that is not up yet, until ``stop``)."""
        config = self._link.config
        if self._transport is None:
            self._transport = connect_patiently(
                lambda: self._make_transport(handler),
                what=f"device {config.device_id}",
                min_delay_s=config.broker.reconnect_min_delay_s,
                max_delay_s=config.broker.reconnect_max_delay_s,
                stop=stop,
            )
        else:
            self._subscribe(self._transport, handler)
            if not self._transport.is_connected:
                self._transport.connect()

    def _make_transport(self, handler: Handler) -> Transport:
        from ursa.protocol.mqtt import MqttTransport

        config = self._link.config
        will = device_will(config)
        transport = MqttTransport(
            config.broker.mqtt_config(config.device_id, will=will)
        )
        self._subscribe(transport, handler)
        return transport

    def _subscribe(self, transport: Transport, handler: Handler) -> None:
        transport.set_handler(handler)
        link = self._link
        for pattern in device_subscriptions(link.federation, link.device_id):
            transport.subscribe(pattern)

    def publish_status(self, *, online: bool) -> None:
        """Queue the retained status (stamped with the joined run)."""
        link = self._link
        topic = status_topic(link.federation, link.device_id)
        status = link.in_run(_status(link.config, online=online))
        self._outbox.put(topic, encode(status), 1, retain=True)

    def went_online(self) -> None:
        """The device said it is online on the current connection."""
        self._was_connected = True
        if self._transport is not None:
            self._connections = self._transport.connections

    def announce_after_reconnect(self, *, running: bool) -> None:
        """Publish ``online`` again once the connection is back after a loss.

        Without this the coordinator counts the device as gone for good
        (issue 14). The transport's connection count catches a reconnect
        shorter than a poll.
        """
        transport = self._transport
        if transport is None:
            return
        connected = transport.is_connected
        count = transport.connections  # also a reconnect between two polls
        back = not self._was_connected or count != self._connections
        if connected and back and running:
            logger.info("%s: reconnected; publishing online", self._link.device_id)
            self.publish_status(online=True)
        self._was_connected = connected
        if connected:
            self._connections = count

    def flush(self) -> None:
        """Publish what the outbox holds (outside the client's lock)."""
        self._outbox.flush(self._transport)

    def close(self, lock: threading.RLock) -> None:
        """Publish offline, drain the outbox and disconnect."""
        transport = self._transport
        if transport is None or not transport.is_connected:
            return
        try:
            with lock:
                self.publish_status(online=False)
            self._outbox.drain(transport, 5.0)
            transport.flush(5.0)
        except TransportError as exc:
            logger.warning("%s: could not flush on stop: %s", self._link.device_id, exc)
        self._outbox.close()  # a handler answering meanwhile: dropped quietly
        transport.close()
