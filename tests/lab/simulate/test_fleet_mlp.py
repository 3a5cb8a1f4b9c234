from __future__ import annotations

import numpy as np
import pytest
import torch

from ursa.edge_sdk.training import TrainConfig, evaluate_loss, train_local
from ursa.lab.simulate.fleet_mlp import (
    FleetTrainingError,
    cross_entropy,
    forward,
    train_fleet,
)
from ursa.models.registry import build_model, initial_arrays, load_arrays
from ursa.tools.data.federation import DeviceData

torch.set_num_threads(1)
MLP = {"input_dim": 12, "num_classes": 4, "hidden_sizes": [16, 8]}


def _devices(sizes: list[int], weighted: bool, seed: int = 0) -> list[DeviceData]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(sizes):
        x = rng.random((n, 12)).astype(np.float32)
        y = rng.integers(0, 4, n)
        w = rng.uniform(0.1, 3.0, n) if weighted and i % 2 == 0 else None
        out.append(DeviceData(x, y, w))
    return out


@pytest.mark.parametrize(
    ("config", "sizes", "weighted"),
    [
        (TrainConfig(epochs=3, batch_size=4, lr=0.1), [9, 9, 9], False),
        (TrainConfig(epochs=2, batch_size=3, lr=0.05, momentum=0.9), [5, 11, 7], True),
        (
            TrainConfig(epochs=2, batch_size=4, lr=0.1, weight_decay=1e-2),
            [6, 13, 4, 8],
            True,
        ),
        (
            TrainConfig(
                epochs=2, batch_size=3, lr=0.1, momentum=0.5, weight_decay=1e-3
            ),
            [3, 10],
            False,
        ),
        (TrainConfig(epochs=2, batch_size=4, lr=0.1, loss="focal"), [7, 12], True),
        (TrainConfig(epochs=2, batch_size=5, lr=0.1, fedvc_samples=16), [4, 30], False),
    ],
)
def test_matches_train_local_device_by_device(
    config: TrainConfig, sizes: list[int], weighted: bool
) -> None:
    start = initial_arrays("mlp", MLP, seed=3)
    devices = _devices(sizes, weighted)
    seeds = [11 + i for i in range(len(devices))]
    scales = [1.0, -0.5, 2.0, 1.0][: len(devices)]

    fleet = train_fleet(start, devices, config=config, seeds=seeds, delta_scales=scales)

    for dev, seed, scale, got in zip(devices, seeds, scales, fleet, strict=True):
        want = train_local(
            "mlp", MLP, start, dev.x, dev.y,
            config=config.model_copy(update={"seed": seed}),
            sample_weights=dev.sample_weights, delta_scale=scale,
        )  # fmt: skip
        assert got.num_examples == want.num_examples
        assert got.num_steps == want.num_steps
        assert got.mean_train_loss == pytest.approx(want.mean_train_loss, rel=1e-5)
        for name in want.delta:
            np.testing.assert_allclose(got.delta[name], want.delta[name], atol=2e-6)


def test_forward_and_cross_entropy_match_torch() -> None:
    arrays = initial_arrays("mlp", MLP, seed=1)
    x = np.random.default_rng(0).random((20, 12)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 4, 20)
    model = build_model("mlp", MLP)
    load_arrays(model, arrays)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()

    np.testing.assert_allclose(forward(arrays, x), logits, atol=1e-6)
    assert cross_entropy(forward(arrays, x), y).mean() == pytest.approx(
        evaluate_loss("mlp", MLP, arrays, x, y), rel=1e-5
    )


def test_unsupported_inputs_raise() -> None:
    start = initial_arrays("mlp", MLP, seed=0)
    devices = _devices([4, 4], weighted=False)
    with pytest.raises(FleetTrainingError, match="SGD"):
        train_fleet(start, devices, config=TrainConfig(optimizer="adam"), seeds=[0, 1])
    with pytest.raises(FleetTrainingError, match="seed"):
        train_fleet(start, devices, config=TrainConfig(), seeds=[0])
    empty = DeviceData(np.zeros((0, 12), np.float32), np.zeros(0, np.int64))
    with pytest.raises(FleetTrainingError, match="no samples"):
        train_fleet(start, [empty], config=TrainConfig(), seeds=[0])
    with pytest.raises(FleetTrainingError, match="MLP"):
        forward({"conv.weight": np.zeros((2, 2, 3, 3))}, np.zeros((1, 4)))
