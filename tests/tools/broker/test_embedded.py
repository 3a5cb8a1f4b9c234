"""The embedded amqtt broker: start on a free port, carry MqttTransport traffic."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator

import pytest

from ursa.protocol.mqtt import MqttTransport
from ursa.tools.broker.embedded import EmbeddedBroker, EmbeddedBrokerError

pytest.importorskip(
    "amqtt", reason="amqtt not installed (pip install 'ursa-fl[broker]')"
)

WAIT_S = 5.0


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


def _connect(broker: EmbeddedBroker, client_id: str) -> MqttTransport:
    config = broker.mqtt_config(client_id).model_copy(
        update={"keepalive_s": 5, "timeout_s": WAIT_S}
    )
    transport = MqttTransport(config)
    return transport


def test_port_zero_picks_a_listening_port(broker: EmbeddedBroker) -> None:
    assert broker.is_running
    assert broker.port > 0
    socket.create_connection((broker.host, broker.port), timeout=WAIT_S).close()
    assert broker.url == f"mqtt://127.0.0.1:{broker.port}"


def test_paho_round_trip_through_amqtt(broker: EmbeddedBroker) -> None:
    got = threading.Event()
    received: list[tuple[str, bytes]] = []

    def on_message(topic: str, payload: bytes) -> None:
        received.append((topic, payload))
        got.set()

    receiver = _connect(broker, "dev1")
    receiver.set_handler(on_message)
    receiver.subscribe("ursa/v1/f/dev/dev1/down/#")
    receiver.connect()
    sender = _connect(broker, "coordinator")
    sender.connect()
    try:
        sender.publish("ursa/v1/f/dev/dev1/down/cmd", b"\x00\x01bytes", qos=1)
        sender.flush(WAIT_S)
        assert got.wait(WAIT_S)
        assert received == [("ursa/v1/f/dev/dev1/down/cmd", b"\x00\x01bytes")]
    finally:
        sender.close()
        receiver.close()


def test_will_fires_when_a_client_is_killed(broker: EmbeddedBroker) -> None:
    got = threading.Event()
    observer = _connect(broker, "observer")
    observer.set_handler(lambda topic, payload: got.set())
    observer.subscribe("ursa/v1/f/dev/dev2/status")
    observer.connect()
    config = broker.mqtt_config("dev2").model_copy(
        update={
            "will_topic": "ursa/v1/f/dev/dev2/status",
            "will_payload": b"offline",
            "will_retain": False,
            "timeout_s": WAIT_S,
        }
    )
    device = MqttTransport(config)
    device.connect()
    try:
        device.kill()
        assert got.wait(WAIT_S)
    finally:
        observer.close()


def test_stop_closes_the_port_and_is_idempotent() -> None:
    broker = EmbeddedBroker().start()
    port = broker.port
    broker.stop()
    broker.stop()
    assert not broker.is_running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
    with pytest.raises(EmbeddedBrokerError):
        _ = broker.port


def test_a_taken_port_fails_with_a_clear_error(broker: EmbeddedBroker) -> None:
    with pytest.raises(EmbeddedBrokerError, match="did not start"):
        EmbeddedBroker(port=broker.port).start()


def test_missing_amqtt_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "amqtt.broker", None)  # import fails
    with pytest.raises(EmbeddedBrokerError, match=r"pip install 'ursa-fl\[broker\]'"):
        EmbeddedBroker().start()
