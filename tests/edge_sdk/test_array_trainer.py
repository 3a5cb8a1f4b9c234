"""`ArrayModelTrainer`: an app's torch-free `ArrayTrainer` in the device runtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from ursa.edge_sdk import ArrayModelTrainer, ArrayTrainer, FitPlan, FitResult
from ursa.models.spec import ModelMismatchError

GLOBAL = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}


class Recording(ArrayTrainer):
    """Adds 1 to every weight; remembers the plans it was given."""

    def __init__(self, *, delta: bool = False, loss: float | None = 0.7) -> None:
        self.plans: list[FitPlan] = []
        self.delta = delta
        self.loss = loss

    def fit(self, weights: list[np.ndarray], plan: FitPlan) -> Any:
        self.plans.append(plan)
        if self.delta:
            return FitResult([np.ones_like(w) for w in weights], 9, is_delta=True)
        return [w + 1.0 for w in weights], 9, {"loss": 0.5}

    def evaluate(self, weights: list[np.ndarray]) -> Mapping[str, float]:
        return {} if self.loss is None else {"loss": self.loss}

    def initial_weights(self) -> Sequence[np.ndarray]:
        return [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]


@pytest.mark.parametrize("as_delta", [False, True])
def test_the_delta_is_scaled_by_the_client_weight(as_delta: bool) -> None:
    app = Recording(delta=as_delta)
    trainer = ArrayModelTrainer(app, epochs=3, seed=5)

    result = trainer.train_delta(4, GLOBAL, delta_scale=0.25)

    assert list(result.delta) == ["w", "b"] and result.num_examples == 9
    np.testing.assert_allclose(result.delta["w"], 0.25)
    (plan,) = app.plans
    assert (plan.round, plan.epochs, plan.client_weight) == (4, 3, 0.25)
    assert plan.sample_weights is None


def test_feddisk_sample_weights_reach_the_plan() -> None:
    app = Recording()
    trainer = ArrayModelTrainer(app)
    trainer.sample_weights = np.array([0.5, 1.5])

    trainer.train_delta(1, GLOBAL, delta_scale=1.0)

    np.testing.assert_array_equal(app.plans[0].sample_weights, [0.5, 1.5])


def test_a_model_of_other_shapes_is_refused_naming_the_tensor() -> None:
    trainer = ArrayModelTrainer(Recording())
    trainer.check_arrays(GLOBAL)
    with pytest.raises(ModelMismatchError) as caught:
        trainer.check_arrays({"w": np.ones((2, 4), np.float32), "b": GLOBAL["b"]})
    assert caught.value.tensor == "w"
    with pytest.raises(ModelMismatchError, match="has 2 arrays"):
        trainer.check_arrays({"w": GLOBAL["w"]})


def test_wrong_returns_and_missing_losses_are_errors() -> None:
    class Short(Recording):
        def fit(self, weights: list[np.ndarray], plan: FitPlan) -> Any:
            return [weights[0]], 1, {}

    with pytest.raises(ValueError, match="returned 1 arrays"):
        ArrayModelTrainer(Short()).train_delta(1, GLOBAL, delta_scale=1.0)
    assert ArrayModelTrainer(Recording()).local_loss(GLOBAL) == 0.7
    with pytest.raises(ValueError, match="CLIMB needs"):
        ArrayModelTrainer(Recording(loss=None)).local_loss(GLOBAL)
