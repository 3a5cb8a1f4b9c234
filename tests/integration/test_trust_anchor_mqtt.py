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

from .conftest import KEY_BITS, device_labels

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
            lambda: all(c.epoch == 1 and c.epoch_view.secret_key for c in clients),
            60,
            "key epoch 1 on every device",
        )
        real = fed.capture.messages("key_epoch_start")[-1][1]
        coordinator = DeviceIdentity.load_or_create(config.state_dir, COORDINATOR)
        recipients = {c.device_id: c.link.identity.public() for c in clients}
        transport = service.transport
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


def test_every_ring_member_refuses_a_swapped_member_over_mosquitto(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    """FLICKER's signed ``ring_start`` with one member's keys swapped, to all."""
    pytest.importorskip("tenseal")
    from ursa.coordinator.methods_config import DubheSpec, FlickerSpec
    from ursa.edge_sdk import methods_config as device_methods
    from ursa.protocol.envelope import decode, encode
    from ursa.tests.adversarial.test_trust_anchor import signed

    fed = mqtt_federation("itring")
    operator = OperatorProvisioning(tmp_path / "operator", "itring")
    config = fed.coordinator_config(
        N,
        k=2,
        tries=2,
        rounds=1,
        methods=(DubheSpec(), FlickerSpec(reply_deadline_s=30.0)),
        trust=operator.coordinator(tmp_path / "coordinator"),
    )
    ids = fed.device_ids(N)
    fed.device_trust = {d: operator.device(tmp_path / d, d) for d in ids}
    service = CoordinatorService(config)
    service.start()
    transport = service.transport
    assert transport is not None
    coordinator = DeviceIdentity.load_or_create(config.state_dir, COORDINATOR)
    fake = DeviceIdentity.generate(ids[1])
    genuine = transport.publish

    def departing(topic: str, payload: bytes, **kwargs: Any) -> None:
        """The coordinator's outbox turned hostile: every ring_start swapped."""
        message = decode(payload) if payload and "/down/" in topic else None
        if message is not None and message.kind == "ring_start":  # type: ignore[attr-defined]
            public = fake.public()
            members = tuple(
                k.model_copy(
                    update={
                        "x25519_public": public.x25519_public,
                        "ed25519_public": public.ed25519_public,
                    }
                )
                if k.device_id == ids[1]
                else k
                for k in message.members  # type: ignore[attr-defined]
            )
            forged = message.model_copy(update={"members": members, "signature": b""})
            payload = encode(signed(coordinator, forged))
        genuine(topic, payload, **kwargs)

    transport.publish = departing  # type: ignore[method-assign]
    threading.Thread(target=service.run, name="coordinator", daemon=True).start()
    try:
        specs = (device_methods.DubheDeviceSpec(), device_methods.FlickerDeviceSpec())
        clients = [
            fed.start_device(d, device_labels(i), seed=i, method_specs=specs)
            for i, d in enumerate(ids)
        ]

        def refused(device: str) -> bool:
            return any(
                m.sender == device and m.code == UNTRUSTED
                for _, m in fed.capture.messages("error")
            )

        def members() -> set[str]:  # the devices the swapped ring_starts went to
            starts = fed.capture.messages("ring_start")
            return {t.split("/dev/")[1].split("/")[0] for t, _ in starts}

        fed.capture.wait_for(
            lambda: len(members()) >= 3 and all(refused(d) for d in members()),
            60,
            "every ring member's untrusted_identity",
        )
        assert len(clients) == N
    finally:
        fed.stop()
        service.stop()
