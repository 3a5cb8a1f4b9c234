"""The signed model spec judged by the device's own trainer, before it registers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.edge_sdk.trainers import ShapedTrainer
from ursa.edge_sdk.array_trainer import ArrayModelTrainer, ArrayTrainer
from ursa.edge_sdk.model_fit import spec_problems
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.models.registry import initial_arrays
from ursa.models.spec import spec_arrays, tensor_spec
from ursa.models.weights import Arrays
from ursa.protocol.messages import ModelSpec

MLP = {"input_dim": 8, "num_classes": 3, "hidden_sizes": [4]}
LABELS = np.array([0, 1, 2, 1], dtype=np.int64)


def _spec(options: dict[str, object], model: str = "classifier") -> ModelSpec:
    return ModelSpec.of(model, tensor_spec(initial_arrays("mlp", options, seed=0)))


def _trainer(options: dict[str, object]) -> TorchTrainer:
    x = np.zeros((4, int(options["input_dim"])), dtype=np.float32)  # type: ignore[call-overload]
    return TorchTrainer(x, LABELS, model_config=options, seed=0)


def test_the_federations_own_model_fits() -> None:
    assert spec_problems(_trainer(MLP), _spec(MLP), LABELS) == ()


def test_another_class_count_is_named_by_its_first_tensor() -> None:
    wide = {**MLP, "num_classes": 10}
    (problem,) = spec_problems(_trainer(MLP), _spec(wide), LABELS) or ()
    assert problem.model
    assert "the federation's model classifier does not fit" in problem.what
    assert "(3, 4)" in problem.what and "(10, 4)" in problem.what
    assert problem.what.count("tensor ") == 1


def test_other_features_per_sample_are_a_data_problem() -> None:
    (problem,) = (
        spec_problems(_trainer(MLP), _spec({**MLP, "input_dim": 16}), LABELS) or ()
    )
    assert not problem.model
    assert problem.what == (
        "samples have 8 features; the federation's model classifier takes 16"
    )


def test_nothing_is_judged_without_a_model_a_spec_or_one_of_its_own_model() -> None:
    trainer = _trainer(MLP)
    assert spec_problems(None, _spec(MLP), LABELS) is None
    assert spec_problems(trainer, None, LABELS) is None
    assert (
        spec_problems(trainer, _spec({**MLP, "num_classes": 10}, "made"), LABELS)
        is None
    )


class _App(ArrayTrainer):
    def __init__(self, shapes: list[tuple[int, ...]] | None) -> None:
        self.shapes = shapes

    def initial_weights(self) -> list[np.ndarray] | None:  # type: ignore[override]
        if self.shapes is None:
            return None
        return [np.zeros(s, dtype=np.float32) for s in self.shapes]

    def fit(self, weights: Any, plan: Any) -> Any:
        raise AssertionError("not trained")

    def evaluate(self, weights: Any) -> dict[str, float]:
        return {}


@pytest.mark.parametrize(
    ("shapes", "fits"), [([(3, 4), (3,)], True), ([(2, 4), (2,)], False), (None, True)]
)
def test_an_array_app_is_judged_by_its_initial_weights_by_position(
    shapes: list[tuple[int, ...]] | None, fits: bool
) -> None:
    spec = ModelSpec.of("classifier", (("w", (3, 4), "float"), ("b", (3,), "float")))
    trainer = ArrayModelTrainer(_App(shapes))
    problems = spec_problems(trainer, spec, LABELS)
    assert (problems == ()) is fits


def test_a_spec_of_a_huge_model_is_judged_without_allocating_it() -> None:
    spec = ModelSpec.of("classifier", (("w", (2**16, 2**16), "float"),))
    (array,) = spec_arrays(spec.triples()).values()
    assert array.shape == (2**16, 2**16) and array.nbytes > 2**33
    assert array.base is not None and array.base.size == 1  # one value, shared


class _NeedsRealWeights(ShapedTrainer):
    """An app trainer whose check writes into the arrays it is given."""

    def check_arrays(self, global_arrays: Arrays) -> None:
        for array in global_arrays.values():
            array[...] = 0  # a read-only view: numpy refuses


def test_a_trainer_that_cannot_judge_views_is_judged_at_the_download(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = ModelSpec.of("classifier", (("w", (3, 4), "float"),))
    assert spec_problems(_NeedsRealWeights((3, 4)), spec, LABELS) is None
    assert "the trainer cannot judge the signed spec of model classifier" in (
        caplog.text
    )
