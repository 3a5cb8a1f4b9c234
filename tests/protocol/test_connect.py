"""connect_patiently: boot before the broker, retry with jittered backoff."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ursa.protocol.connect import (
    ConnectAbortedError,
    backoff_delays,
    connect_patiently,
)
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.mqtt import MqttTransport
from ursa.protocol.transport import BrokerRefusedError, Transport, TransportError
from ursa.tools.broker.mosquitto import MosquittoBroker


class Unreachable(InMemoryTransport):
    """A transport whose broker is not there (yet)."""

    def __init__(self, bus: InMemoryBus, client_id: str, error: TransportError):
        super().__init__(bus, client_id)
        self.error = error

    def connect(self) -> None:
        raise self.error


class Flaky:
    """Builds transports whose first ``failures`` connects raise ``error``."""

    def __init__(self, failures: int, error: TransportError) -> None:
        self.failures, self.error, self.made = failures, error, 0
        self.bus = InMemoryBus()

    def __call__(self) -> Transport:
        self.made += 1
        if self.made <= self.failures:
            return Unreachable(self.bus, f"c{self.made}", self.error)
        return InMemoryTransport(self.bus, f"c{self.made}")


def test_backoff_doubles_to_the_ceiling_with_jitter_in_its_upper_half() -> None:
    delay = backoff_delays(1.0, 8.0, random.Random(0))
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        for _ in range(20):
            assert ceiling / 2 <= delay(attempt) <= ceiling


def test_retries_until_the_broker_answers_with_a_log_line_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make = Flaky(3, TransportError("cannot connect to 127.0.0.1:1: refused"))
    caplog.set_level(logging.INFO, logger="ursa.protocol")

    transport = connect_patiently(
        make, what="device d1", min_delay_s=0.001, max_delay_s=0.004
    )

    assert transport.is_connected and make.made == 4
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert [f"attempt {i}:" in r.getMessage() for i, r in enumerate(retries, 1)] == [
        True
    ] * 3
    assert "device d1: connected after 4 attempts" in caplog.text


def test_a_refusal_is_not_retried_and_a_stop_aborts_the_wait() -> None:
    refused = Flaky(5, BrokerRefusedError("bad password"))
    with pytest.raises(BrokerRefusedError):
        connect_patiently(refused, what="d", min_delay_s=0.001)
    assert refused.made == 1

    stop = threading.Event()
    stop.set()
    with pytest.raises(ConnectAbortedError):
        connect_patiently(Flaky(5, TransportError("down")), what="d", stop=stop)
    with pytest.raises(TransportError, match="down"):
        connect_patiently(
            Flaky(5, TransportError("down")),
            what="d",
            min_delay_s=0.001,
            max_attempts=2,
        )


def test_a_client_started_before_mosquitto_connects_once_it_is_up(
    mosquitto_binary: Path, tmp_path: Path
) -> None:
    broker = MosquittoBroker(
        devices=["d1"], binary=mosquitto_binary, work_dir=tmp_path / "broker"
    )  # its files are written; it is not running yet
    config = broker.mqtt_config("d1").model_copy(update={"timeout_s": 2.0})
    got: dict[str, Any] = {}

    def boot() -> None:
        try:
            got["transport"] = connect_patiently(
                lambda: MqttTransport(config),
                what="device d1",
                min_delay_s=0.2,
                max_delay_s=0.5,
                max_attempts=100,
            )
        except TransportError as exc:
            got["error"] = exc

    thread = threading.Thread(target=boot, daemon=True)
    thread.start()
    time.sleep(1.0)  # a few refused attempts
    assert "transport" not in got and "error" not in got
    with broker:
        thread.join(timeout=30)
        transport = got.get("transport")
        assert transport is not None, got.get("error")
        try:
            assert transport.is_connected
            transport.publish("ursa/x/up/d1/status", b"", qos=1)
        finally:
            transport.close()
