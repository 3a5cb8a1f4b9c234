"""FedDisk over a real Mosquitto: MADE rounds, encrypted loss sums, switch, weights."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods_config import DubheSpec, FeddiskSpec
from ursa.coordinator.plugin import NoSteps, PluginContext
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk import methods_config as device_specs
from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings, FeddiskTrainer
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.training import TrainConfig, evaluate
from ursa.models.registry import initial_arrays
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.envelope import signing_bytes
from ursa.tools.data.loaders import load_digits

pytestmark = pytest.mark.integration

N, K, MAX_MADE, CLASSIFIER_ROUNDS = 5, 3, 3, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [32]}
SETTINGS = FeddiskSettings(
    made_hidden_sizes=(16,),
    local_made_max_epochs=20,
    classifier_epochs=5,
)
DEVICE_METHODS = (
    device_specs.DubheDeviceSpec(),
    device_specs.FeddiskDeviceSpec.model_validate(SETTINGS.model_dump()),
)
"""The devices' ``[[methods]]``: FedDisk is chosen by its table."""


def test_feddisk_trains_the_made_then_the_weighted_classifier_over_mosquitto(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("disk")
    data = load_digits()
    x, y = data.flat(), data.y
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    test, train = order[:300], order[300:]
    parts = np.array_split(train[np.argsort(y[train], kind="stable")], N)
    initial, made_initial = tmp_path / "initial.ursw", tmp_path / "made.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))
    made_config = SETTINGS.made_model_config(64)
    made_initial.write_bytes(
        arrays_to_bytes(initial_arrays("made", made_config, seed=0))
    )
    scores: list[float] = []

    def score(round_index: int, version: int, arrays: Any) -> dict[str, float]:
        accuracy = evaluate("mlp", MODEL, arrays, x[test], y[test]).accuracy
        scores.append(accuracy)
        return {"accuracy": accuracy}

    config = fed.coordinator_config(
        N,
        k=K,
        tries=3,
        rounds=MAX_MADE + CLASSIFIER_ROUNDS,
        methods=(DubheSpec(), FeddiskSpec()),
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 90})}
    )
    timeouts = TrainingConfig(update_timeout_s=40)
    switches: list[tuple[int, int]] = []

    def build(ctx: PluginContext) -> FeddiskPlugin:
        return FeddiskPlugin(
            ctx.view,
            federation="disk",
            made=TrainingPlugin(
                PluginContext(ctx.view, NoSteps()),
                federation="disk",
                state_dir=config.state_dir,
                config=timeouts.model_copy(update={"model": "made"}),
                initial_weights=made_initial,
            ),
            classifier=TrainingPlugin(
                ctx,
                federation="disk",
                state_dir=config.state_dir,
                config=timeouts,
                initial_weights=initial,
                evaluate=score,
            ),
            config=FeddiskSpec(
                max_made_rounds=MAX_MADE, loss_timeout_s=15, verdict_timeout_s=15
            ),
            on_switch=lambda r, v: switches.append((r, v)),
        )

    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, FeddiskPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    clients = []
    for i, device_id in enumerate(fed.device_ids(N)):
        classifier = TorchTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=2, batch_size=8, lr=0.1),
            seed=i,
        )
        trainer = FeddiskTrainer(classifier, settings=SETTINGS, seed=i)
        clients.append(
            fed.start_device(
                device_id,
                y[parts[i]],
                seed=i,
                trainer=trainer,
                method_specs=DEVICE_METHODS,
            )
        )
    stop = threading.Event()

    def poll() -> None:  # what EdgeClient.run does for each device
        while not stop.wait(0.5):
            for client in clients:
                client.poll()

    threading.Thread(target=poll, daemon=True).start()
    try:
        deadline = time.monotonic() + 150
        while not service.is_done and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        service.stop()
        loop.join(5)

    assert service.is_done
    assert plugin.phase == "classifier"
    made_rounds = plugin.made_rounds
    assert 1 <= made_rounds <= MAX_MADE
    assert plugin.made.version == made_rounds
    assert switches == [(made_rounds + 1, plugin.best_version)]
    classifier_rounds = MAX_MADE + CLASSIFIER_ROUNDS - made_rounds
    assert plugin.classifier.version == classifier_rounds
    assert len(scores) == classifier_rounds and scores[-1] > 0.3, scores

    # the coordinator saw loss ciphertexts and sums, one signed verdict per sum
    sums = fed.capture.messages("mean_sum")
    assert {m.purpose for _, m in sums} == {"feddisk.made_loss"}
    verdicts = fed.capture.messages("made_verdict")
    assert [m.model_version for _, m in sums] == list(range(1, made_rounds + 1))
    assert all(m.num_parties == N for _, m in sums)
    assert [m.model_version for _, m in verdicts] == list(range(1, made_rounds + 1))
    agent = fed.clients[verdicts[-1][1].sender]
    identity = agent.link.identity.public()
    for _, verdict in verdicts:
        verify_signature(identity, signing_bytes(verdict), verdict.signature)
    (_, switch), *_again = fed.capture.messages("feddisk_switch")
    assert switch.made_version == plugin.best_version and switch.model == "classifier"

    # every device weights its samples (mean 1, inside the clip band)
    low, high = SETTINGS.clip
    for client, part in zip(clients, parts, strict=True):
        trainer = client.data.trainer
        assert isinstance(trainer, FeddiskTrainer) and trainer.phase == "classifier"
        weights = trainer.sample_weights
        assert weights is not None and len(weights) == len(part)
        assert weights.mean() == pytest.approx(1.0)
        assert weights.min() >= low / high - 1e-9 and weights.max() <= high / low
    trained = sum(c.training_stats.rounds_trained for c in clients)
    assert trained == K * (made_rounds + classifier_rounds)
