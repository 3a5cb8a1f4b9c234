"""TransportBase: the read-only surface every transport shares."""

from __future__ import annotations

import pytest

from ursa.bench.mqtt_pool import MqttPool
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.mqtt import MqttConfig, MqttTransport
from ursa.protocol.transport import (
    NotConnectedError,
    PayloadTooLargeError,
    Transport,
    TransportState,
    TransportStats,
)
from ursa.protocol.transport_base import TransportBase


def test_a_new_base_is_unconnected_with_no_traffic() -> None:
    base = TransportBase("d1")

    assert base.client_id == "d1"
    assert base.state is TransportState.NEW
    assert not base.is_connected
    assert base.connections == 0
    assert base.stats == TransportStats()


def test_every_transport_is_a_transport_base_and_a_transport() -> None:
    config = MqttConfig(client_id="d1")
    pool = MqttPool()
    try:
        transports = [
            MqttTransport(config),
            pool.transport(config),
            InMemoryTransport(InMemoryBus(), "d1"),
        ]
        for transport in transports:
            assert isinstance(transport, TransportBase)
            assert isinstance(transport, Transport)
            assert transport.client_id == "d1"
    finally:
        pool.close()


def test_connections_and_state_follow_the_in_memory_bus() -> None:
    bus = InMemoryBus()
    transport = InMemoryTransport(bus, "d1")
    got: list[tuple[str, bytes]] = []
    transport.set_handler(lambda topic, payload: got.append((topic, payload)))
    transport.subscribe("t")
    transport.connect()
    transport.publish("t", b"x")

    assert transport.is_connected and transport.connections == 1
    assert got == [("t", b"x")]
    assert transport.stats == TransportStats(1, 1, 1, 1)
    transport.close()
    assert transport.state is TransportState.CLOSED


@pytest.mark.parametrize(
    ("state", "qos", "allowed"),
    [
        (TransportState.NEW, 1, False),
        (TransportState.CONNECTING, 1, True),  # paho queues it
        (TransportState.CONNECTED, 0, True),
        (TransportState.RECONNECTING, 1, True),  # paho queues it
        (TransportState.RECONNECTING, 0, False),  # paho would drop it
        (TransportState.CLOSED, 1, False),
    ],
)
def test_a_paho_publish_needs_a_link_that_can_take_it(
    state: TransportState, qos: int, allowed: bool
) -> None:
    base = TransportBase("d1")
    base._state = state

    if allowed:
        base._check_paho_publish("t", b"x", qos, max_payload_bytes=1)
    else:
        with pytest.raises(NotConnectedError, match=f"d1 is {state}"):
            base._check_paho_publish("t", b"x", qos, max_payload_bytes=1)


def test_a_paho_publish_above_the_cap_is_refused_first() -> None:
    base = TransportBase("d1")
    with pytest.raises(PayloadTooLargeError):
        base._check_paho_publish("t", b"xy", 1, max_payload_bytes=1)
