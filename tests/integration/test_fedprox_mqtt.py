"""FedProx over a real Mosquitto: mu signed in the key epoch, devices train with it."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.mu_recording_trainer import MuRecordingTrainer
from ursa.coordinator.config import TrainingSection
from ursa.coordinator.methods_config import DubheSpec, FedProxSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingPlugin
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk.methods_config import DubheDeviceSpec as DeviceDubheSpec
from ursa.edge_sdk.methods_config import FedProxDeviceSpec as DeviceFedProxSpec
from ursa.edge_sdk.training import TrainConfig
from ursa.protocol.envelope import signing_bytes
from ursa.tools import compose
from ursa.tools.data.loaders import load_digits

from .conftest import polling

pytestmark = pytest.mark.integration

N, K, ROUNDS = 4, 2, 2
MU = 0.3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}


def test_fedprox_rounds_over_mosquitto_train_with_the_signed_mu(
    mqtt_federation: Any,
) -> None:
    fed = mqtt_federation("prox")
    config = fed.coordinator_config(
        N,
        k=K,
        tries=3,
        rounds=ROUNDS,
        methods=(DubheSpec(), FedProxSpec(mu=MU)),
        training=TrainingSection.model_validate(
            {"architecture": "mlp", "model_options": MODEL, "update_timeout_s": 30}
        ),
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    service = CoordinatorService(
        config,
        plugin=compose.training_plugin(config),
        steps=compose.before_training_steps(config),
    )
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    data = load_digits()
    x, y = data.flat(), data.y
    parts = np.array_split(np.argsort(y, kind="stable"), N)
    clients, trainers = [], []
    for i, device_id in enumerate(fed.device_ids(N)):
        trainer = MuRecordingTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=1, batch_size=16, lr=0.1),
            seed=i,
        )
        trainers.append(trainer)
        clients.append(
            fed.start_device(
                device_id,
                y[parts[i]],
                seed=i,
                trainer=trainer,
                method_specs=(DeviceDubheSpec(), DeviceFedProxSpec()),
            )
        )
    try:
        with polling(clients):
            deadline = time.monotonic() + 60
            while not service.is_done and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        service.stop()
        loop.join(5)

    assert service.is_done, f"rounds done: {[r.round for r in plugin.history]}"
    assert plugin.version == ROUNDS
    assert all(len(r.contributed) == K for r in plugin.history)
    notices = [m for _, m in fed.capture.messages("key_epoch_start")]
    assert notices
    for notice in notices:
        verify_signature(service.identity, signing_bytes(notice), notice.signature)
        assert notice.method_setting("fedprox", "mu") == MU
    assert sorted(mu for t in trainers for mu in t.mus.values()) == [MU] * K * ROUNDS
