"""Training rounds over a real Mosquitto (password file + ACL): torch devices, CLIMB."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec, DubheSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.climb import ClimbConfig
from ursa.edge_sdk.methods.climb import Climb
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.training import TrainConfig, evaluate
from ursa.models.registry import initial_arrays
from ursa.models.weights import arrays_to_bytes
from ursa.tools.data.loaders import load_digits

pytestmark = pytest.mark.integration

N, K, ROUNDS = 5, 3, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [32]}


def test_three_climb_rounds_over_mosquitto_improve_the_global_model(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("learn")
    data = load_digits()
    x, y = data.flat(), data.y
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    test, train = order[:300], order[300:]
    parts = np.array_split(train[np.argsort(y[train], kind="stable")], N)
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))
    scores: list[float] = []

    def score(round_index: int, version: int, arrays: Any) -> dict[str, float]:
        accuracy = evaluate("mlp", MODEL, arrays, x[test], y[test]).accuracy
        scores.append(accuracy)
        return {"accuracy": accuracy}

    config = fed.coordinator_config(
        N, k=K, tries=3, rounds=ROUNDS, methods=(DubheSpec(), ClimbSpec())
    )
    plugin = TrainingPlugin(
        federation="learn",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
        evaluate=score,
        before_training=[ClimbDualStep(ClimbSpec(dual_timeout_s=15))],
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    service = CoordinatorService(config, plugin=plugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    climb = ClimbConfig()
    clients = []
    for i, device_id in enumerate(fed.device_ids(N)):
        trainer = TorchTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=2, batch_size=8, lr=0.1),
            climb=climb,
            wire_dtype="float16" if i % 2 else "float32",
            seed=i,
        )
        clients.append(
            fed.start_device(device_id, y[parts[i]], seed=i, trainer=trainer)
        )
    stop = threading.Event()

    def poll() -> None:  # what EdgeClient.run does for each device
        while not stop.wait(0.5):
            for client in clients:
                client.poll()

    threading.Thread(target=poll, daemon=True).start()
    try:
        deadline = time.monotonic() + 50
        while not service.is_done and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        service.stop()
        loop.join(5)

    assert service.is_done, f"rounds done: {[r.round for r in plugin.history]}"
    assert plugin.version == ROUNDS
    assert [r.before_training for r in plugin.history] == [{"climb": N}] * ROUNDS
    assert all(len(r.contributed) == K and not r.dropped for r in plugin.history)
    assert scores[-1] > 0.3, scores
    lambdas = [c.method(Climb).lam for c in clients]
    assert all(0 <= v <= climb.lambda_max for v in lambdas)
    assert max(lambdas) > 0, "the dual steps should move some lambda"
    sums = fed.capture.messages("mean_sum")
    assert {m.purpose for _, m in sums} == {"climb.dual"}
    assert {m.round for _, m in sums} == set(range(1, ROUNDS + 1))
    trained = sum(c.training_stats.rounds_trained for c in clients)
    assert trained == K * ROUNDS
