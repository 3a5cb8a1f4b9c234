"""A flood under one device's credentials over a real Mosquitto (issue 14, item 6)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ursa.coordinator.service import CoordinatorService
from ursa.protocol.admission_limits import AdmissionLimits, DropReason
from ursa.protocol.envelope import encode
from ursa.protocol.messages import Heartbeat
from ursa.protocol.topics import up_topic
from ursa.protocol.transport import TransportError

pytestmark = pytest.mark.integration

FED = "itflood"
HONEST = 5
FLOODER = "dev005"
BATCH = 200
"""Messages published back to back, then 0.1 s of rest: ~2000/s, 100x the limit."""


def test_a_flood_from_one_devices_credentials_leaves_the_others_rounds_alone(
    mqtt_federation: Any, connect_mqtt: Any
) -> None:
    fed = mqtt_federation(FED)
    limits = AdmissionLimits(messages_per_s=20.0, burst=100)
    config = fed.coordinator_config(HONEST, k=3, tries=3, rounds=3, admission=limits)
    service = CoordinatorService(config)
    service.start()
    done = threading.Event()
    runner = threading.Thread(target=service.run, name="coordinator", daemon=True)
    runner.start()
    flooder = connect_mqtt(fed.broker, FLOODER)  # its own topics: the ACL allows
    sent = 0

    def flood() -> None:
        nonlocal sent
        topic = up_topic(FED, FLOODER, "control")
        while not done.is_set():
            beat = Heartbeat(federation=FED, round=1, sender=FLOODER, seq=sent)
            try:
                flooder.publish(topic, encode(beat), qos=0)
            except TransportError:
                done.wait(0.01)  # paho's queue is full: let it drain
                continue
            sent += 1
            if sent % BATCH == 0:
                done.wait(0.1)

    flooding = threading.Thread(target=flood, name="flood", daemon=True)
    flooding.start()
    try:
        fed.start_devices(HONEST)
        runner.join(timeout=120)
    finally:
        done.set()
        flooding.join(timeout=10)

    assert service.is_done, f"stuck at {service.state}"
    for round_index in (1, 2, 3):
        chosen = [
            device
            for device, client in fed.clients.items()
            if round_index in client.stats.selected_rounds
        ]
        assert len(chosen) == 3, (round_index, chosen)
    stats = service.admission_stats()
    assert set(stats.dropped_by_sender) == {FLOODER}
    assert stats.dropped[DropReason.RATE] > 10 * limits.burst
    assert sent > stats.dropped[DropReason.RATE]
