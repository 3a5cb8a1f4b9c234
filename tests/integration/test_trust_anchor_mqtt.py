"""The made-up-agent attack over a real Mosquitto (issue 29, item 1).

The coordinator (`ursa coordinator serve`'s service, in a thread) and four
devices hold operator certificates. Once the fleet has adopted key epoch 1,
the coordinator departs from the protocol on its own broker connection: a
signed `key_epoch_start` naming a made-up agent, that agent's signed public
key and a sealed box "from" it to every device. Every device refuses with
``untrusted_identity`` and keeps epoch 1's key.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.test_trust_anchor import (
    UNTRUSTED,
    forge_agent,
    holds,
    no_certificate,
)
from ursa.coordinator.service import CoordinatorService
from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.messages import COORDINATOR
from ursa.tools.operator_provisioning import OperatorProvisioning

from .conftest import KEY_BITS

pytestmark = pytest.mark.integration

N = 4


def test_every_device_refuses_a_made_up_agent_over_mosquitto(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("ittrust")
    operator = OperatorProvisioning(tmp_path / "operator", "ittrust")
    config = fed.coordinator_config(
        N, k=2, tries=2, rounds=0, trust=operator.coordinator(tmp_path / "coordinator")
    )
    fed.device_trust = {d: operator.device(tmp_path / d, d) for d in fed.device_ids(N)}
    service = CoordinatorService(config)
    service.start()
    threading.Thread(target=service.run, name="coordinator", daemon=True).start()
    try:
        clients = fed.start_devices(N)
        fed.capture.wait_for(
            lambda: all(c.epoch == 1 and c._secret_key for c in clients),
            60,
            "key epoch 1 on every device",
        )
        real = fed.capture.messages("key_epoch_start")[-1][1]
        coordinator = DeviceIdentity.load_or_create(config.state_dir, COORDINATOR)
        recipients = {c.device_id: c._identity.public() for c in clients}
        transport = service._transport
        assert transport is not None

        epoch, secret_key = forge_agent(
            lambda topic, payload: transport.publish(topic, payload, qos=1),
            real,
            coordinator,
            recipients,
            "ghost",
            no_certificate,
            key_bits=KEY_BITS,
        )

        def refused(device: str) -> bool:
            return any(
                m.sender == device and m.code == UNTRUSTED
                for _, m in fed.capture.messages("error")
            )

        fed.capture.wait_for(
            lambda: all(refused(c.device_id) for c in clients),
            30,
            "every device's untrusted_identity",
        )
        for client in clients:
            assert client.epoch == 1 != epoch
            assert not holds(client, secret_key)
    finally:
        fed.stop()
        service.stop()
