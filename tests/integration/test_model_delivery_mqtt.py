"""Model delivery over a real Mosquitto (password file + ACL): only who needs it.

A round's model goes to its selected devices' down topics; a device never
selected receives none of its bytes (counted on each device's own link and
by an observer of every topic), yet every device ends with the final model.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.weights import Arrays, arrays_to_bytes

from .conftest import polling

pytestmark = pytest.mark.integration

N, K, ROUNDS = 6, 3, 3
WEIGHTS = 8192
"""float32 values of the model: 32 KiB (less on the wire: ``planes_zlib``)."""


class ShrinkTrainer(ModelTrainer):
    """A numpy stand-in: every round moves the weights a little toward zero."""

    num_examples = 20

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        delta = {
            k: (-0.1 * delta_scale * np.asarray(v, np.float32)).astype(np.float32)
            for k, v in global_arrays.items()
        }
        return LocalDelta(delta, self.num_examples)

    def local_loss(self, global_arrays: Arrays) -> float:
        return float(np.abs(global_arrays["w"]).mean())


def test_a_never_selected_device_receives_no_model_bytes_but_the_final(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("deliver")
    initial = tmp_path / "initial.ursw"
    rng = np.random.default_rng(0)  # random values: they barely compress
    start: Arrays = {"w": rng.normal(0, 1, WEIGHTS).astype(np.float32)}
    initial.write_bytes(arrays_to_bytes(start))
    model_bytes = len(arrays_to_bytes(start))
    config = fed.coordinator_config(
        N, k=K, tries=3, rounds=ROUNDS, methods=(DubheSpec(), FedAvgSpec())
    )
    build = partial(
        TrainingPlugin,
        federation="deliver",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    clients = [
        fed.start_device(
            device_id, np.arange(10).repeat(3), seed=i, trainer=ShrinkTrainer()
        )
        for i, device_id in enumerate(fed.device_ids(N))
    ]
    try:
        with polling(clients):  # what EdgeClient.run does for each device
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (
                service.is_done and all(c.finished.is_set() for c in clients)
            ):
                time.sleep(0.2)
    finally:
        service.stop()
        loop.join(5)

    assert service.is_done and plugin.version == ROUNDS
    assert all(c.finished.is_set() for c in clients)  # the final model, inline
    chosen = {
        m.round: set(m.selected) for _, m in fed.capture.messages("selection_result")
    }
    pushed: dict[str, list[int]] = {}  # device -> versions pushed to it
    pushed_bytes: dict[str, int] = {}
    transfers = [
        *fed.capture.messages("transfer_manifest"),
        *fed.capture.messages("chunk"),
    ]
    for topic, message in transfers:
        assert "/global/" not in topic, "no round's model is broadcast here"
        if message.sender != "coordinator" or "/down/" not in topic:
            continue
        device = topic.split("/")[4]
        if message.kind == "transfer_manifest":
            pushed.setdefault(device, []).append(int(message.purpose.split(".v")[1]))
        else:
            pushed_bytes[device] = pushed_bytes.get(device, 0) + len(message.data)
    for client in clients:
        device = client.device_id
        rounds_in = [r for r in range(1, ROUNDS + 1) if device in chosen[r]]
        assert pushed.get(device, []) == [r - 1 for r in rounds_in], device
        assert client.transport is not None
        stats = client.transport.stats
        # its pushes and the final model inline; the rest is small messages
        least = pushed_bytes.get(device, 0) + model_bytes
        assert least <= stats.bytes_received < least + model_bytes, device
    never = [c for c in clients if not any(c.device_id in s for s in chosen.values())]
    for client in never:
        assert client.training_stats.models_downloaded == 0
