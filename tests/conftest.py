"""Shared fixtures: private Mosquitto brokers with ursa's password file and ACL.

Integration tests (marked `@pytest.mark.integration`) use:

    mosquitto            session-wide broker; users DEVICE_IDS, "coordinator"
                         (readwrite ursa/v1/#) and "observer" (read ursa/v1/#);
                         `mosquitto.mqtt_config(user)` gives an MqttConfig.
    mosquitto_factory    `mosquitto_factory(devices=..., tls=..., persistence=...)`
                         starts a fresh broker, stopped after the test.
    connect_mqtt         `connect_mqtt(broker, user, subscriptions=..., handler=...,
                         update={...})` returns a connected MqttTransport with
                         short timeouts, closed after the test.

They skip only when the mosquitto binary is absent, with the reason in the
`-ra` summary; set URSA_REQUIRE_MOSQUITTO=1 (CI does) to fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.transport import MessageHandler
from ursa.tools.broker.mosquitto import MosquittoBroker, find_mosquitto

DEVICE_IDS: tuple[str, ...] = tuple(f"dev{i:03d}" for i in range(64))
COORDINATOR = "coordinator"
OBSERVER = "observer"

MosquittoFactory = Callable[..., MosquittoBroker]
ConnectMqtt = Callable[..., MqttTransport]


@pytest.fixture(scope="session")
def mosquitto_binary() -> Path:
    """The mosquitto executable; skips (or fails in CI) when it is absent."""
    found = find_mosquitto()
    if found is None:
        reason = "mosquitto binary not found (apt install mosquitto): broker tests"
        if os.environ.get("URSA_REQUIRE_MOSQUITTO") == "1":
            pytest.fail(f"{reason} required by URSA_REQUIRE_MOSQUITTO=1")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def mosquitto(
    mosquitto_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MosquittoBroker]:
    """One Mosquitto for the whole session, with DEVICE_IDS and the ACL."""
    broker = MosquittoBroker(
        devices=DEVICE_IDS,
        readers=[OBSERVER],
        coordinator_user=COORDINATOR,
        binary=mosquitto_binary,
        work_dir=tmp_path_factory.mktemp("mosquitto"),
    )
    with broker:
        yield broker


@pytest.fixture
def mosquitto_factory(
    mosquitto_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MosquittoFactory]:
    """Start fresh brokers (own users, TLS, persistence); stopped after the test."""
    brokers: list[MosquittoBroker] = []

    def make(
        *,
        devices: Iterable[str] | Mapping[str, str] = DEVICE_IDS,
        readers: Iterable[str] = (OBSERVER,),
        tls: bool = False,
        persistence: bool = False,
    ) -> MosquittoBroker:
        broker = MosquittoBroker(
            devices=devices,
            readers=readers,
            coordinator_user=COORDINATOR,
            tls=tls,
            persistence=persistence,
            binary=mosquitto_binary,
            work_dir=tmp_path_factory.mktemp("mosquitto"),
        )
        brokers.append(broker)
        return broker.start()

    yield make
    for broker in brokers:
        broker.stop()


@pytest.fixture
def connect_mqtt() -> Iterator[ConnectMqtt]:
    """Connect MqttTransports with short timeouts; all closed after the test."""
    transports: list[MqttTransport] = []

    def connect(
        broker: MosquittoBroker,
        user: str,
        *,
        subscriptions: Iterable[str] = (),
        handler: MessageHandler | None = None,
        update: Mapping[str, Any] | None = None,
    ) -> MqttTransport:
        config = broker.mqtt_config(user).model_copy(
            update={"keepalive_s": 5, "timeout_s": 5.0, **(update or {})}
        )
        transport = MqttTransport(config)
        transports.append(transport)
        transport.set_handler(handler)
        for pattern in subscriptions:
            transport.subscribe(pattern)
        transport.connect()
        return transport

    yield connect
    for transport in transports:
        transport.close()
