"""The training hook an `EdgeClient` calls when its device is selected.

The selection protocol (this package's client) decides *whether* a device
trains in a round; a `Trainer` decides *how*. `NoOpTrainer` trains nothing
and reports its sample count. A `ModelTrainer` trains from the global model
the coordinator publishes and returns a delta: the client then downloads the
model, lets the methods its ``[[methods]]`` table names plan the round
(CLIMB's dual steps and scaled delta, FedProx's term) and uploads the delta
(``edge_sdk/training_rounds.py``, ``edge_sdk/methods/registry.py``); the torch one is
``edge_sdk/torch_trainer.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Protocol

import numpy as np
import numpy.typing as npt

from ursa.models.weights import Arrays

__all__ = [
    "ClassCounts",
    "LocalDelta",
    "ModelTrainer",
    "NoOpTrainer",
    "Trainer",
    "TrainingReport",
]


@dataclass(frozen=True)
class TrainingReport:
    """What one local training run produced (weights travel separately)."""

    round: int
    num_examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)


class Trainer(Protocol):
    """Local training when the device is among a round's K participants.

    A protocol, not a base: a `ModelTrainer` is one without standing on it
    (it trains through `ModelTrainer.train_delta`), so no trainer is more
    than one ursa class deep.
    """

    @abstractmethod
    def train(self, round_index: int) -> TrainingReport:
        """Train for `round_index` and report (called once per selected round)."""

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Train on these samples from now on (FLICKER's resampled data).

        Raises:
            NotImplementedError: this trainer cannot change its data (the
                default, for a subclass that does not override it).
        """
        _fixed_data(self)


class NoOpTrainer(Trainer):
    """Trains nothing: a selection-only device (reports its sample count)."""

    def __init__(self, num_examples: int) -> None:
        """Report `num_examples` for every round."""
        if num_examples < 0:
            raise ValueError(f"num_examples must be >= 0, got {num_examples}")
        self.num_examples = num_examples
        self.rounds: list[int] = []

    def train(self, round_index: int) -> TrainingReport:
        """Record the round and report the sample count."""
        self.rounds.append(round_index)
        return TrainingReport(round_index, self.num_examples)


@dataclass(frozen=True)
class ClassCounts:
    """Per-class correct predictions and samples on a local evaluation split."""

    correct: npt.NDArray[np.int64]
    total: npt.NDArray[np.int64]


@dataclass(frozen=True)
class LocalDelta:
    """One round's local training result: the (scaled) delta and its weight."""

    delta: Arrays
    num_examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)


class ModelTrainer(ABC):
    """Trains from the global model the coordinator publishes; returns deltas.

    A `Trainer` by shape (`train`, `use_data`), not by inheritance.

    Attributes:
        model: The wire name of the model it trains (`ModelAvailable.model`).
        wire_dtype: Precision of the uploaded delta.
        proximal: Whether `train_proximal` adds FedProx's term to the loss
            (FedProx refuses a trainer without it when the device is built).
    """

    model: str = "classifier"
    wire_dtype: Literal["float32", "float16"] = "float32"
    proximal: bool = False

    @abstractmethod
    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """Train locally from ``global_arrays``; the delta times ``delta_scale``."""

    def train_proximal(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float, mu: float
    ) -> LocalDelta:
        """`train_delta` with ``(mu / 2) * ||w - w_global||^2`` added to the loss.

        Raises:
            NotImplementedError: the trainer has no proximal term (`proximal`).
        """
        raise NotImplementedError(
            f"{type(self).__name__} cannot add FedProx's proximal term"
        )

    def train_planned(
        self,
        round_index: int,
        global_arrays: Arrays,
        *,
        delta_scale: float,
        proximal_mu: float,
    ) -> LocalDelta:
        """A round as the methods planned it (`TrainPlan`): proximal if mu > 0."""
        if proximal_mu > 0.0:
            return self.train_proximal(
                round_index, global_arrays, delta_scale=delta_scale, mu=proximal_mu
            )
        return self.train_delta(round_index, global_arrays, delta_scale=delta_scale)

    @abstractmethod
    def local_loss(self, global_arrays: Arrays) -> float:
        """CLIMB's ``f_i``: the mean per-sample loss at ``global_arrays`` (nats)."""

    @property
    def evaluates(self) -> bool:
        """Whether `class_counts` has a local evaluation split (default: no)."""
        return False

    def class_counts(self, global_arrays: Arrays) -> ClassCounts | None:
        """Per-class counts of the model at ``global_arrays`` on the eval split.

        Federated evaluation (`ursa.edge_sdk.fleet_eval`); None: no split.
        """
        return None

    def check_arrays(self, global_arrays: Arrays) -> None:
        """Raise ValueError if the arrays do not fit the model (default: accept).

        Called with each downloaded version and, before the device registers,
        with the key epoch's signed spec as read-only zero-size views (only
        their names, shapes and dtypes are real). At the key epoch only a
        `ModelMismatchError` (`ursa.models.spec.check_fits` raises it, naming
        the tensor) sits the device out; another error there defers the
        judgement to the first download.
        """
        return None

    @property
    def features(self) -> int | None:
        """Features per local sample (default: unknown, nothing is checked)."""
        return None

    def onnx(self, arrays: Arrays) -> bytes | None:
        """The model at ``arrays`` as ONNX bytes; None: the trainer cannot export.

        Saved beside the final weights (``model.onnx``) so an inference-only
        device serves the federation's model with onnxruntime.
        """
        return None

    def model_features(self, global_arrays: Arrays) -> int | None:
        """Features per sample the model of ``global_arrays`` takes (None: unknown).

        The client compares it with `features` before the device takes part
        (`ursa.edge_sdk.data_check`).
        """
        return None

    def use_data(self, x: npt.NDArray[Any], y: npt.NDArray[np.int64]) -> None:
        """Refuse: this trainer's data is fixed (FLICKER needs one that is not)."""
        _fixed_data(self)

    def train(self, round_index: int) -> TrainingReport:
        """Not used: the client calls `train_delta` with the downloaded model."""
        raise RuntimeError("a ModelTrainer trains through train_delta")


def _fixed_data(trainer: object) -> NoReturn:
    raise NotImplementedError(f"{type(trainer).__name__} cannot change its data")
