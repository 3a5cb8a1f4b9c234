"""Training without torch: an app's `ArrayTrainer` over a list of NumPy arrays.

A device app that trains with its own code (NumPy, scikit-learn, anything)
implements two methods, as a Flower ``NumPyClient`` does::

    class MyTrainer(ArrayTrainer):
        def fit(self, weights, plan):        # list[ndarray], FitPlan
            ...                              # train plan.epochs from weights
            return new_weights, n_samples, {"loss": 0.31}
        def evaluate(self, weights):
            return {"loss": 0.29, "accuracy": 0.91}

    client = EdgeClient(config, labels, trainer=ArrayModelTrainer(MyTrainer()))

The weights are the global model's arrays in the coordinator's order (its
initial weights file, or the ``[training] architecture`` factory); the names
stay with the runtime, which maps the list back to them. `fit` returns the
new weights (or, with ``FitResult(is_delta=True)``, the change); the runtime
computes the delta, applies CLIMB's client weight (``plan.client_weight``,
already decided by the method: the app must not scale again) and uploads it.
The `FitPlan` carries what the methods decided for the round: its index and
seed, the epochs, CLIMB's weight, and FedDisk's per-sample weights when a
FedDisk phase 2 set them (`sample_weights`: one per local sample, mean 1; the
app should weight its per-sample loss by them). CLIMB's ``f_i`` is
``evaluate(weights)["loss"]`` (mean per-sample loss), so an app in a CLIMB
federation must report ``"loss"``.

`ArrayModelTrainer` checks each downloaded model against the app's
`ArrayTrainer.initial_weights` when it gives them (count, shapes, dtypes):
a device with another model refuses it (`model_mismatch`) before it trains.
Nothing here imports torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.torch_trainer import round_seed
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.spec import ModelMismatchError, check_fits
from ursa.models.weights import Arrays, FloatArray

__all__ = ["ArrayModelTrainer", "ArrayTrainer", "FitPlan", "FitResult"]

Weights = list[npt.NDArray[Any]]


@dataclass(frozen=True)
class FitPlan:
    """What the methods decided for one local training round.

    Attributes:
        round: The round being trained.
        seed: A per-round seed (the device's seed and the round).
        epochs: Local epochs (the trainer's setting).
        client_weight: CLIMB's ``w_i`` (1 without CLIMB); the runtime scales
            the delta by it, the app only reads it.
        sample_weights: FedDisk's per-sample weights in its phase 2 (mean 1,
            one per local sample, in the app's sample order), else None.
    """

    round: int
    seed: int
    epochs: int = 1
    client_weight: float = 1.0
    sample_weights: npt.NDArray[np.float64] | None = None


@dataclass(frozen=True)
class FitResult:
    """What `ArrayTrainer.fit` returns (a 3-tuple ``(weights, n, metrics)`` too).

    Attributes:
        weights: The new weights, or their change when ``is_delta``.
        num_examples: The FedAvg weight (samples trained on).
        metrics: Free-form figures (e.g. ``loss``), kept in the device's log.
        is_delta: Whether ``weights`` are already ``new - global``.
    """

    weights: Sequence[npt.NDArray[Any]]
    num_examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    is_delta: bool = False


class ArrayTrainer(ABC):
    """The app's torch-free training code (see the module docstring)."""

    @abstractmethod
    def fit(
        self, weights: Weights, plan: FitPlan
    ) -> FitResult | tuple[Sequence[npt.NDArray[Any]], int, Mapping[str, float]]:
        """Train from ``weights``; return the new weights, samples and metrics."""

    @abstractmethod
    def evaluate(self, weights: Weights) -> Mapping[str, float]:
        """Figures of ``weights`` on the local data; ``"loss"`` for CLIMB."""

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Train on these samples from now on (FLICKER's resampled data).

        Raises:
            NotImplementedError: the app keeps its own data (the default).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot change its data")

    def initial_weights(self) -> Sequence[npt.NDArray[Any]] | None:
        """The app's model as arrays (shapes and dtypes checked); None: unchecked."""
        return None


class ArrayModelTrainer(ModelTrainer):
    """Runs an `ArrayTrainer` as the device's `ModelTrainer`.

    Args:
        app: The app's trainer.
        num_features: Features per local sample, compared with the model's
            when known (None: not checked).
        epochs: Local epochs per round (`FitPlan.epochs`).
        model: The wire name of the model (the coordinator's ``[training] model``).
        wire_dtype: Upload precision.
        seed: The device's seed; round seeds derive from it.
    """

    def __init__(
        self,
        app: ArrayTrainer,
        *,
        num_features: int | None = None,
        epochs: int = 1,
        model: str = "classifier",
        wire_dtype: Literal["float32", "float16"] = "float32",
        seed: int = 0,
    ) -> None:
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        self.app = app
        self.epochs = epochs
        self.model = model
        self.wire_dtype = wire_dtype
        self.seed = seed
        self._features = num_features
        self.sample_weights: npt.NDArray[np.float64] | None = None
        """FedDisk's per-sample weights (set by its phase 2), passed in the plan."""
        self.last_metrics: Mapping[str, float] = {}
        """The metrics of the latest `fit` (for the app's progress display)."""

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """`fit` from the global arrays; the delta times ``delta_scale``.

        Raises:
            ValueError: the app returned arrays that do not fit the model, a
                non-finite delta or a bad sample count.
        """
        names = list(global_arrays)
        plan = FitPlan(
            round=round_index,
            seed=round_seed(self.seed, round_index),
            epochs=self.epochs,
            client_weight=delta_scale,
            sample_weights=self.sample_weights,
        )
        result = _as_result(self.app.fit(_as_list(global_arrays), plan))
        if len(result.weights) != len(names):
            raise ValueError(
                f"fit returned {len(result.weights)} arrays; the model has {len(names)}"
            )
        returned = {
            n: np.asarray(a) for n, a in zip(names, result.weights, strict=True)
        }
        check_fits(_native(global_arrays), _native(returned))
        delta: Arrays = {}
        for name in names:
            base = np.asarray(global_arrays[name])
            change = returned[name] if result.is_delta else returned[name] - base
            if base.dtype.kind in "iu":
                delta[name] = np.asarray(change, dtype=np.int64)
            else:
                delta[name] = (np.asarray(change, np.float64) * delta_scale).astype(
                    np.float32
                )
            if not np.all(np.isfinite(delta[name])):
                raise ValueError(f"fit returned non-finite values in {name!r}")
        if result.num_examples < 1:
            raise ValueError(f"fit reported {result.num_examples} examples")
        self.last_metrics = dict(result.metrics)
        return LocalDelta(delta, int(result.num_examples), self.last_metrics)

    def local_loss(self, global_arrays: Arrays) -> float:
        """CLIMB's ``f_i``: ``evaluate(...)["loss"]``.

        Raises:
            ValueError: the app reported no finite ``"loss"``.
        """
        metrics = self.app.evaluate(_as_list(global_arrays))
        loss = metrics.get("loss")
        if loss is None or not np.isfinite(loss):
            raise ValueError("CLIMB needs evaluate(weights)['loss'] (mean loss)")
        return float(loss)

    def evaluate(self, global_arrays: Arrays) -> Mapping[str, float]:
        """The app's figures of the global model on its local data."""
        return self.app.evaluate(_as_list(global_arrays))

    def check_arrays(self, global_arrays: Arrays) -> None:
        """Raise `ModelMismatchError` unless the model fits the app's own.

        The app's `initial_weights` are named by position, as the model's
        arrays are taken; names of the global model do not matter here.
        """
        own = self.app.initial_weights()
        if own is None:
            return
        theirs = list(global_arrays.values())  # no copy: a signed spec's views
        if len(own) != len(theirs):
            raise ModelMismatchError(
                str(min(len(own), len(theirs))),
                f"the app's model has {len(own)} arrays, the federation's "
                f"{len(theirs)}",
            )
        names = list(global_arrays)
        check_fits(
            {n: np.asarray(a) for n, a in zip(names, own, strict=True)},
            _native(global_arrays),
        )

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Hand FLICKER's resampled data to the app (`ArrayTrainer.use_data`)."""
        self.app.use_data(x, y)

    @property
    def features(self) -> int | None:
        """Features per local sample, if the app said."""
        return self._features


def _as_list(arrays: Mapping[str, FloatArray]) -> Weights:
    return [np.array(a, copy=True) for a in arrays.values()]


def _native(arrays: Mapping[str, FloatArray]) -> Arrays:
    return {name: np.asarray(a) for name, a in arrays.items()}


def _as_result(value: object) -> FitResult:
    if isinstance(value, FitResult):
        return value
    if isinstance(value, tuple) and len(value) == 3:
        weights, n, metrics = value
        return FitResult(list(weights), int(n), dict(metrics))
    raise ValueError("fit must return a FitResult or (weights, num_examples, metrics)")
