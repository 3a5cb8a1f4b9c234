"""Training rounds over a real Mosquitto (password file + ACL): torch devices, CLIMB."""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec, DubheSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk import methods_config as device_specs
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.trainer import LocalDelta
from ursa.edge_sdk.training import TrainConfig, evaluate
from ursa.models.registry import initial_arrays
from ursa.models.weights import arrays_to_bytes
from ursa.tools.data.loaders import load_digits

pytestmark = pytest.mark.integration

N, K, ROUNDS = 5, 3, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [32]}


class RecordingTrainer(TorchTrainer):
    """A TorchTrainer that keeps each round's delta (what must never leave it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deltas: dict[int, LocalDelta] = {}

    def train_delta(
        self, round_index: int, global_arrays: Any, *, delta_scale: float
    ) -> LocalDelta:
        result = super().train_delta(
            round_index, global_arrays, delta_scale=delta_scale
        )
        self.deltas[round_index] = result
        return result


def _needles(delta: LocalDelta) -> list[bytes]:
    """Runs of a delta's bytes as float32 and float16 (any encoding the SDK uses)."""
    out = []
    for dtype in ("float32", "float16"):
        raw = arrays_to_bytes(delta.delta, dtype=dtype)  # type: ignore[arg-type]
        step = len(raw) // 16  # past the header (names and shapes): values only
        runs = [raw[i : i + 32] for i in range(step, len(raw) - 32, step)]
        out += [r for r in runs if len(set(r)) >= 16]  # not a run of zeros
    return out


def test_three_climb_rounds_over_mosquitto_improve_the_global_model(
    mqtt_federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
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
    build = partial(
        TrainingPlugin,
        federation="learn",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
        evaluate=score,
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    service = CoordinatorService(
        config, plugin=build, steps=[ClimbDualStep.later(ClimbSpec(dual_timeout_s=15))]
    )
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    climb = ClimbConfig()
    clients = []
    for i, device_id in enumerate(fed.device_ids(N)):
        trainer = RecordingTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=2, batch_size=8, lr=0.1),
            wire_dtype="float16" if i % 2 else "float32",
            seed=i,
        )
        clients.append(
            fed.start_device(
                device_id,
                y[parts[i]],
                seed=i,
                trainer=trainer,
                method_specs=(
                    device_specs.DubheDeviceSpec(),
                    device_specs.ClimbDeviceSpec(),
                ),
            )
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
    fleet = plugin.history[-1].metrics["devices"]  # out of the same secure sum
    assert fleet["reporting"] == K and fleet["loss"] > 0 and fleet["train_s"] > 0

    # No single update reached the coordinator: not in the traffic, its store,
    # its checkpoints or its log, and no masked vector decodes to a delta.
    assert not fed.capture.messages("model_update")
    with fed.capture.lock:
        traffic = b"\x00".join(p for _, p in fed.capture.items)
    stored = b"\x00".join(
        f.read_bytes() for f in config.state_dir.rglob("*") if f.is_file()
    )
    haystacks = {"traffic": traffic, "store": stored, "log": caplog.text.encode()}
    masked = {(m.sender, m.round): m for _, m in fed.capture.messages("masked_update")}
    assert len(masked) == K * ROUNDS
    for client in clients:
        trainer = client.data.trainer
        assert isinstance(trainer, RecordingTrainer)
        for round_index, delta in trainer.deltas.items():
            needles = _needles(delta)
            assert len(needles) >= 8  # enough of the delta to find it
            for where, data in haystacks.items():
                for needle in needles:
                    assert needle not in data, (client.device_id, round_index, where)
            vector = masked[(client.device_id, round_index)].vector
            assert vector is not None  # inline: this model fits one message
            sent = np.frombuffer(vector, dtype="<u4")[: _values(delta)]
            signed = sent.astype(np.int64) - (sent >= 2**31) * 2**32
            plain = np.concatenate([np.ravel(a) for a in delta.delta.values()])
            correlation = np.corrcoef(signed.astype(np.float64), plain)[0, 1]
            assert abs(correlation) < 0.2, (client.device_id, correlation)


def _values(delta: LocalDelta) -> int:
    return sum(int(np.size(a)) for a in delta.delta.values())
