"""paho_client: a paho client made and pointed at a broker from an MqttConfig."""

from __future__ import annotations

import pytest
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from ursa.protocol.mqtt_config import MqttConfig
from ursa.protocol.paho_client import check_publish_rc, new_client, start_connect
from ursa.protocol.transport import TransportError


@pytest.mark.parametrize(
    ("protocol", "expected"),
    [("3.1.1", MQTTProtocolVersion.MQTTv311), ("5", MQTTProtocolVersion.MQTTv5)],
)
def test_new_client_takes_protocol_credentials_and_inflight_cap(
    protocol: str, expected: MQTTProtocolVersion
) -> None:
    config = MqttConfig.model_validate(
        {
            "client_id": "d1",
            "username": "d1",
            "password": "pw",
            "protocol": protocol,
            "max_inflight_messages": 7,
        }
    )

    client = new_client(config)

    assert client.protocol is expected
    assert (client.username, client.password) == ("d1", "pw")
    assert client.max_inflight_messages == 7


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
def test_start_connect_later_records_the_broker_without_connecting(
    protocol: str,
) -> None:
    config = MqttConfig.model_validate(
        {"client_id": "d1", "host": "192.0.2.1", "port": 1884, "protocol": protocol}
    )
    client = new_client(config)

    start_connect(client, config, now=False)

    assert (client.host, client.port, client.keepalive) == (
        "192.0.2.1",
        1884,
        config.keepalive_s,
    )
    assert client.socket() is None


@pytest.mark.parametrize(
    "rc", [MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN]
)
def test_a_publish_paho_took_passes(rc: MQTTErrorCode) -> None:
    check_publish_rc(rc)


@pytest.mark.parametrize(
    "rc", [MQTTErrorCode.MQTT_ERR_QUEUE_SIZE, MQTTErrorCode.MQTT_ERR_PAYLOAD_SIZE]
)
def test_any_other_publish_code_is_a_transport_error(rc: MQTTErrorCode) -> None:
    with pytest.raises(TransportError, match="publish failed"):
        check_publish_rc(rc)
