"""A paho-mqtt 2.x client made from an `MqttConfig`: creation, CONNECT, publish codes.

`MqttTransport` (paho's own network thread) and `MqttPool` (one selector loop
for many clients) drive paho differently but make, connect and publish with
it alike; the differences (TLS, queue cap, reconnect delays, callbacks) stay
with the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ursa.protocol.mqtt_config import MqttConfig
from ursa.protocol.transport import TransportError

__all__ = ["check_publish_rc", "new_client", "start_connect"]

_new_properties: Callable[[int], Properties] = Properties
"""`Properties(packet_type)`, whose ``__init__`` paho leaves unannotated."""


def new_client(config: MqttConfig) -> paho.Client:
    """A client with the config's id, protocol, credentials, will and inflight cap."""
    v5 = config.protocol == "5"
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=config.client_id,
        clean_session=None if v5 else config.clean_start,
        protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
    )
    if config.username is not None:
        password = config.password.get_secret_value() if config.password else None
        client.username_pw_set(config.username, password)
    if config.will_topic is not None:
        client.will_set(
            config.will_topic, config.will_payload, config.will_qos, config.will_retain
        )
    client.max_inflight_messages_set(config.max_inflight_messages)
    return client


def start_connect(client: paho.Client, config: MqttConfig, *, now: bool) -> None:
    """Connect now (TCP and CONNECT) or, with `now` False, only record where to.

    MQTT 5 sends the session expiry the config asks for (0 with a clean start).

    Raises:
        OSError, ValueError: as paho's ``connect`` (never with ``now=False``).
    """
    connect = client.connect if now else client.connect_async
    if config.protocol == "5":
        props = _new_properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = (
            0 if config.clean_start else config.session_expiry_s
        )
        connect(
            config.host,
            config.port,
            config.keepalive_s,
            clean_start=config.clean_start,
            properties=props,
        )
    else:
        connect(config.host, config.port, config.keepalive_s)


def check_publish_rc(rc: MQTTErrorCode) -> None:
    """Raise unless paho took the publish (sent, or queued while not connected).

    Raises:
        TransportError: any other return code of ``Client.publish``.
    """
    if rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
        raise TransportError(f"publish failed: {paho.error_string(rc)}")
