"""Forged coordinator notices over a real Mosquitto (issue 29, item 3).

The coordinator (`ursa coordinator serve`'s service, in a thread) trains a
numpy model with three devices under masked sums. Once every device holds
key epoch 1, someone with the coordinator's broker login but not its
identity key publishes on the coordinator's topics: a `model_available` and
its manifest and chunks for a made-up version 7 (signed with another key),
an unsigned `round_announce`, and the real `registry_sum` re-published
without its signature. Every device refuses each (``bad_signature``), and
the federation trains on to the coordinator's own model.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.model_transfer import model_notice, model_purpose
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.client import EdgeClient
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.chunking import split
from ursa.protocol.envelope import encode, signing_bytes
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import COORDINATOR, BaseMessage, RoundAnnounce
from ursa.protocol.topics import global_topic, name_for
from ursa.tests.coordinator.test_training import INITIAL, LinearTrainer

pytestmark = pytest.mark.integration

N, ROUNDS, FORGED_VERSION = 3, 2, 7
FED = "itforge"
FORGED_KINDS = (
    "model_available",
    "transfer_manifest",
    "round_announce",
    "registry_sum",
)


def _signed(key: DeviceIdentity, message: BaseMessage) -> BaseMessage:
    return message.model_copy(update={"signature": key.sign(signing_bytes(message))})


def _forgeries(run: str, registry_sum: BaseMessage) -> list[BaseMessage]:
    """What the forger publishes: a poisoned version 7, an announce, a stripped sum."""
    forger = DeviceIdentity.generate(COORDINATOR)
    poison = arrays_to_bytes(
        {k: np.full(np.shape(v), 100.0, np.float32) for k, v in INITIAL.items()}
    )
    manifest, chunks = split(
        poison,
        purpose=model_purpose("classifier", FORGED_VERSION),
        federation=FED,
        round=1,
        sender=COORDINATOR,
        transfer_id=model_transfer_id(FED, "classifier", FORGED_VERSION),
    )
    notice = model_notice(
        FED, "classifier", 1, FORGED_VERSION, hashlib.sha256(poison).hexdigest()
    )
    announce = RoundAnnounce(
        federation=FED, round=9, sender=COORDINATOR, epoch=1, k=N, deadline_s=1
    )
    stamped = [
        m.model_copy(update={"run": run}) for m in (notice, manifest, *chunks, announce)
    ]
    notice, manifest, *chunks, announce = stamped
    return [
        _signed(forger, notice),
        _signed(forger, manifest),
        *chunks,
        announce,
        registry_sum.model_copy(update={"signature": b""}),
    ]


def test_every_device_refuses_forged_notices_over_mosquitto(
    mqtt_federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ursa.edge_sdk")
    fed = mqtt_federation(FED)
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(INITIAL))
    config = fed.coordinator_config(
        N, k=N, tries=1, rounds=ROUNDS, methods=(DubheSpec(), FedAvgSpec())
    )
    build = partial(
        TrainingPlugin,
        federation=FED,
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
    )
    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, name="coordinator", daemon=True)
    loop.start()
    clients: list[EdgeClient] = [
        fed.start_device(d, np.arange(10).repeat(3), seed=i, trainer=LinearTrainer(i))
        for i, d in enumerate(fed.device_ids(N))
    ]
    try:
        fed.capture.wait_for(
            lambda: (
                all(c.epoch == 1 for c in clients)
                and fed.capture.messages("registry_sum")
            ),
            60,
            "key epoch 1 and its registry sum on every device",
        )
        registry_sum = fed.capture.messages("registry_sum")[-1][1]
        transport = service.transport
        assert transport is not None
        for message in _forgeries(service.run_id, registry_sum):
            topic = global_topic(FED, name_for(message.kind))  # type: ignore[attr-defined]
            transport.publish(topic, encode(message), qos=1)

        def refused(client: EdgeClient, kind: str) -> bool:
            needle = f"{client.device_id}: refused {kind}: bad_signature"
            return any(needle in r.getMessage() for r in caplog.records)

        fed.capture.wait_for(
            lambda: all(refused(c, k) for c in clients for k in FORGED_KINDS),
            30,
            "every device's bad_signature for each forged kind",
        )
        deadline = time.monotonic() + 60
        while not service.is_done and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        fed.stop()
        service.stop()
        loop.join(5)

    assert service.is_done
    assert plugin.version == ROUNDS
    final = plugin.global_arrays  # one clipped step a round from INITIAL, not 100s
    assert all(np.max(np.abs(final[k])) < 1.0 for k in final)
    for client in clients:
        assert client.training_stats.rounds_trained == ROUNDS
        assert client.model_version in (ROUNDS - 1, ROUNDS)  # never FORGED_VERSION
        held = client.model_arrays
        assert held is not None and np.max(np.abs(held["w"])) < 1.0
