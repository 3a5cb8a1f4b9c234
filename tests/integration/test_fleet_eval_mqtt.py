"""Federated evaluation over a real Mosquitto: encrypted counts equal the plaintext."""

from __future__ import annotations

import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import EvaluationConfig
from ursa.coordinator.fleet_eval import FleetEvaluation
from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.fleet_eval import split_for_evaluation
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.training import TrainConfig
from ursa.models.registry import initial_arrays
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.tools.data.loaders import load_digits

pytestmark = pytest.mark.integration

N, K, ROUNDS = 4, 2, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}


def test_fleet_accuracy_is_the_sum_of_the_devices_counts_and_no_device_is_seen(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("feval")
    data = load_digits()
    x, y = data.flat()[:800], data.y[:800]
    parts = np.array_split(np.argsort(y, kind="stable"), N)  # skewed devices
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))
    models: dict[int, Arrays] = {}

    def keep(round_index: int, version: int, arrays: Arrays) -> dict[str, float]:
        models[version] = dict(arrays)
        return {}

    config = fed.coordinator_config(
        N,
        k=K,
        tries=1,
        rounds=ROUNDS,
        methods=(DubheSpec(), FedAvgSpec()),
        evaluation=EvaluationConfig(every=1, timeout_s=20),
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    build = partial(
        TrainingPlugin,
        federation="feval",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
        evaluate=keep,
    )
    service = CoordinatorService(
        config,
        plugin=build,
        steps=[
            FleetEvaluation.later(
                config.evaluation,
                num_classes=10,
                max_parties=config.registry.max_parties,
            )
        ],
    )
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    assert plugin.methods() == ("fedavg",)  # evaluation is not a signed method
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    trainers: list[TorchTrainer] = []
    clients: list[EdgeClient] = []
    for i, device_id in enumerate(fed.device_ids(N)):
        fraction = 0.0 if i == 0 else 0.25  # device 0 holds out nothing
        xt, yt, xe, ye = split_for_evaluation(
            x[parts[i]], y[parts[i]], fraction, seed=i
        )
        trainer = TorchTrainer(
            xt,
            yt,
            model_config=MODEL,
            train=TrainConfig(epochs=1, batch_size=16, lr=0.1),
            seed=i,
            eval_x=xe if len(ye) else None,
            eval_y=ye if len(ye) else None,
        )
        trainers.append(trainer)
        clients.append(fed.start_device(device_id, yt, seed=i, trainer=trainer))
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.3):
            for client in clients:
                client.poll()

    threading.Thread(target=poll, daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while not service.is_done and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        service.stop()
        loop.join(5)

    assert service.is_done, f"rounds done: {[r.round for r in plugin.history]}"
    evaluated = [r for r in plugin.history if "federated_eval" in r.metrics]
    assert [r.round for r in evaluated] == [2, 3]
    for record in evaluated:
        result = record.metrics["federated_eval"]
        version = result["version"]
        assert version == record.base_version and result["parties"] == N
        counts = [t.class_counts(models[version]) for t in trainers if t.evaluates]
        correct = np.sum([c.correct for c in counts], axis=0)
        total = np.sum([c.total for c in counts], axis=0)
        assert result["samples"] == int(total.sum())
        assert result["accuracy"] == pytest.approx(correct.sum() / total.sum())
        expected = [
            None if t == 0 else c / t for c, t in zip(correct, total, strict=True)
        ]
        assert result["per_class"] == pytest.approx(expected)
    last = evaluated[-1].metrics["federated_eval"]
    for client in clients:  # every device decrypted the same figures
        seen = client.evaluation.last
        assert seen is not None and seen.round == evaluated[-1].round
        assert seen.accuracy == pytest.approx(last["accuracy"])
    for record in plugin.history:  # the devices' own metrics, per round
        said = record.metrics["devices"]
        assert said["reporting"] == len(record.contributed) == K
        assert said["samples"] == sum(
            trainers[i].num_examples
            for i, d in enumerate(fed.device_ids(N))
            if d in record.contributed
        )
        assert said["train_s"] > 0 and np.isfinite(said["loss"])
    # the coordinator never saw a device's counts: only sums and the agent's result
    reports = fed.capture.messages("mean_report")
    assert reports and all(m.purpose == "eval.classes" for _, m in reports)
    results = fed.capture.messages("mean_result")
    assert {m.round for _, m in results} == {2, 3}
