"""`TorchTrainer`: train_local per round with derived seeds, f_i, weight checks."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.edge_sdk.torch_trainer import TorchTrainer, round_seed
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.edge_sdk.training import TrainConfig, evaluate_loss, train_local
from ursa.models.registry import initial_arrays

MODEL = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [6]}
TRAIN = TrainConfig(epochs=2, batch_size=4, lr=0.1)


def _data(n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 8)).astype(np.float32) + y[:, None]
    return x, y


def test_train_delta_is_train_local_with_the_round_seed_and_scale() -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    trainer = TorchTrainer(x, y, model_config=MODEL, train=TRAIN, seed=5)

    got = trainer.train_delta(4, arrays, delta_scale=0.5)

    expected = train_local(
        "mlp",
        MODEL,
        arrays,
        x,
        y,
        config=TRAIN.model_copy(update={"seed": round_seed(5, 4)}),
        delta_scale=0.5,
    )
    assert got.num_examples == len(y) == expected.num_examples
    for name, value in got.delta.items():
        np.testing.assert_array_equal(value, expected.delta[name])
    assert got.metrics["mean_train_loss"] == expected.mean_train_loss


def test_rounds_get_different_seeds_and_scale_zero_gives_no_delta() -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    trainer = TorchTrainer(x, y, model_config=MODEL, train=TRAIN, seed=5)

    first = trainer.train_delta(1, arrays, delta_scale=1.0).delta
    second = trainer.train_delta(2, arrays, delta_scale=1.0).delta
    zero = trainer.train_delta(1, arrays, delta_scale=0.0).delta

    assert round_seed(5, 1) != round_seed(5, 2)
    assert any(not np.array_equal(first[k], second[k]) for k in first)
    assert all(not np.any(v) for v in zero.values())


def test_local_loss_is_the_mean_cross_entropy_at_the_model() -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=2)
    trainer = TorchTrainer(x, y, model_config=MODEL)

    assert isinstance(trainer, ModelTrainer)
    assert trainer.local_loss(arrays) == evaluate_loss("mlp", MODEL, arrays, x, y)


def test_weights_of_another_model_are_refused() -> None:
    x, y = _data()
    trainer = TorchTrainer(x, y, model_config=MODEL)
    trainer.check_arrays(initial_arrays("mlp", MODEL, seed=0))

    other = initial_arrays("mlp", {**MODEL, "hidden_sizes": [7]}, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        trainer.check_arrays(other)


def test_bad_local_data_is_refused() -> None:
    x, y = _data()
    with pytest.raises(ValueError, match="samples and labels"):
        TorchTrainer(x[:3], y, model_config=MODEL)
    with pytest.raises(ValueError, match="samples and labels"):
        TorchTrainer(x[:0], y[:0], model_config=MODEL)


def test_the_generic_train_entry_point_is_not_used() -> None:
    x, y = _data()
    with pytest.raises(RuntimeError, match="train_delta"):
        TorchTrainer(x, y, model_config=MODEL).train(1)


def test_features_of_the_data_and_of_the_federations_mlp() -> None:
    x, y = _data()
    trainer = TorchTrainer(x, y, model_config=MODEL)
    wider = initial_arrays("mlp", {**MODEL, "input_dim": 64}, seed=0)

    assert trainer.features == 8
    assert trainer.model_features(initial_arrays("mlp", MODEL, seed=0)) == 8
    assert trainer.model_features(wider) == 64  # whatever the device's config says


def test_features_of_a_cnn_are_its_input_shape_when_the_weights_fit() -> None:
    config = {"input_shape": [1, 12, 12], "num_classes": 3}
    x = np.zeros((4, 1, 12, 12), np.float32)
    trainer = TorchTrainer(x, np.arange(4) % 3, architecture="cnn", model_config=config)
    other = {**config, "input_shape": [3, 12, 12]}

    assert trainer.features == 144
    assert trainer.model_features(initial_arrays("cnn", config, seed=0)) == 144
    assert trainer.model_features(initial_arrays("cnn", other, seed=0)) is None
