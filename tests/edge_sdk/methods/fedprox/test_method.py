"""FedProx's device half: the signed mu into the plan, the proximal term in training."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ursa.edge_sdk.array_trainer import ArrayModelTrainer, ArrayTrainer, FitPlan
from ursa.edge_sdk.method import TrainPlan
from ursa.edge_sdk.methods.fedprox import FedProx, ProximalUnsupportedError
from ursa.edge_sdk.module_trainer import ModuleTrainer
from ursa.edge_sdk.torch_trainer import TorchTrainer, round_seed
from ursa.edge_sdk.trainer import NoOpTrainer
from ursa.edge_sdk.training import TrainConfig, TrainingError, train_local
from ursa.models.registry import build_model, initial_arrays
from ursa.models.weights import Arrays
from ursa.protocol.fedprox import FedProxMuError
from ursa.protocol.messages import KeyEpochStart, MethodSetting
from ursa.protocol.router import Router

MODEL = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [16]}
TRAIN = TrainConfig(epochs=5, batch_size=4, lr=0.2)


def _data(n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 8)).astype(np.float32) + 2 * y[:, None]
    return x, y


def _norm(delta: Arrays) -> float:
    return math.sqrt(
        sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in delta.values())
    )


def _train(mu: float) -> Arrays:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    return train_local(
        "mlp", MODEL, arrays, x, y, config=TRAIN.model_copy(update={"seed": 4}),
        proximal_mu=mu,
    ).delta  # fmt: skip


def test_a_large_mu_pulls_the_local_weights_toward_the_global_model() -> None:
    fedavg, small, large = _train(0.0), _train(0.1), _train(5.0)
    assert _norm(large) < 0.5 * _norm(fedavg)
    assert _norm(large) < _norm(small) < _norm(fedavg)


def test_mu_zero_is_fedavg_exactly() -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    config = TRAIN.model_copy(update={"seed": 4})
    plain = train_local("mlp", MODEL, arrays, x, y, config=config)
    zero = train_local("mlp", MODEL, arrays, x, y, config=config, proximal_mu=0.0)
    for name, value in plain.delta.items():
        np.testing.assert_array_equal(value, zero.delta[name])
    assert plain.mean_train_loss == zero.mean_train_loss


@pytest.mark.parametrize("mu", [-0.1, float("nan"), float("inf")])
def test_training_refuses_a_negative_or_non_finite_mu(mu: float) -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    with pytest.raises(TrainingError, match="proximal_mu"):
        train_local("mlp", MODEL, arrays, x, y, config=TRAIN, proximal_mu=mu)


def test_torch_and_module_trainers_apply_the_plans_mu() -> None:
    x, y = _data()
    arrays = initial_arrays("mlp", MODEL, seed=1)
    torch_trainer = TorchTrainer(x, y, model_config=MODEL, train=TRAIN, seed=5)
    assert torch_trainer.proximal
    planned = torch_trainer.train_planned(3, arrays, delta_scale=1.0, proximal_mu=2.0)
    expected = train_local(
        "mlp", MODEL, arrays, x, y,
        config=TRAIN.model_copy(update={"seed": round_seed(5, 3)}), proximal_mu=2.0,
    )  # fmt: skip
    for name, value in planned.delta.items():
        np.testing.assert_array_equal(value, expected.delta[name])
    unplanned = torch_trainer.train_planned(3, arrays, delta_scale=1.0, proximal_mu=0)
    fedavg = torch_trainer.train_delta(3, arrays, delta_scale=1.0)
    for name, value in unplanned.delta.items():
        np.testing.assert_array_equal(value, fedavg.delta[name])

    module = build_model("mlp", MODEL, seed=0)
    module_trainer = ModuleTrainer(module, x, y, train=TRAIN, seed=5)
    assert module_trainer.proximal
    pulled = module_trainer.train_planned(3, arrays, delta_scale=1.0, proximal_mu=5.0)
    free = module_trainer.train_planned(3, arrays, delta_scale=1.0, proximal_mu=0.0)
    assert _norm(pulled.delta) < _norm(free.delta)


class Echo(ArrayTrainer):
    """An app trainer that returns the weights it was given."""

    def fit(self, weights: Any, plan: FitPlan) -> Any:
        return list(weights), 4, {}

    def evaluate(self, weights: Any) -> dict[str, float]:
        return {"loss": 0.0}


@pytest.mark.parametrize(
    "trainer", [ArrayModelTrainer(Echo()), NoOpTrainer(4)], ids=["array", "no-op"]
)
def test_a_trainer_without_the_term_refuses_fedprox_when_built(
    trainer: Any, new_context: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    ctx = new_context()
    ctx.trainer = trainer
    with pytest.raises(ProximalUnsupportedError, match="proximal term"):
        FedProx(ctx)
    assert "refusing FedProx" in caplog.text


def _epoch(*settings: MethodSetting) -> KeyEpochStart:
    return KeyEpochStart.model_construct(  # as signed: model_construct lets NaN in
        epoch=2, methods=("dubhe", "fedprox"), method_settings=settings
    )


def _attached(new_context: Callable[[], Any], epoch: KeyEpochStart) -> FedProx:
    x, y = _data()
    ctx = new_context()
    ctx.trainer = TorchTrainer(x, y, model_config=MODEL, train=TRAIN)
    ctx.epoch = epoch
    method = FedProx(ctx)
    method.register(Router("d0"))
    return method


def test_the_plan_carries_the_epochs_signed_mu(new_context: Any) -> None:
    mu = MethodSetting(method="fedprox", name="mu", value=0.25)
    method = _attached(new_context, _epoch(mu))
    plan = method.plan(TrainPlan(round=4, delta_scale=0.5))
    assert plan == TrainPlan(round=4, delta_scale=0.5, proximal_mu=0.25)


@pytest.mark.parametrize("value", [10.5, -1.0, float("nan"), float("inf")])
def test_a_signed_mu_outside_0_to_10_is_refused_with_a_log_line(
    new_context: Any, value: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    bad = MethodSetting.model_construct(method="fedprox", name="mu", value=value)
    method = _attached(new_context, _epoch(bad))
    with pytest.raises(FedProxMuError, match=r"finite and in \[0, 10.0\]"):
        method.plan(TrainPlan(round=4))
    assert "d0: refusing to train round 4: FedProx mu must be" in caplog.text


def test_an_epoch_without_mu_is_refused(new_context: Any) -> None:
    method = _attached(new_context, _epoch())
    with pytest.raises(FedProxMuError, match="signs no FedProx mu"):
        method.plan(TrainPlan(round=1))
