"""`PhasedTrainer`: the trainer interface of FedDisk's two phases (no torch here).

Its own module so the phase-1 steps (`ursa.edge_sdk.methods.feddisk`), the
state files (`ursa.edge_sdk.methods.feddisk.state`) and the torch-backed
`ursa.edge_sdk.methods.feddisk.trainer` share it without importing one another.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Literal

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.models.weights import Arrays

__all__ = ["Phase", "PhasedTrainer"]

Phase = Literal["made", "classifier"]


class PhasedTrainer(ModelTrainer):
    """A `ModelTrainer` with FedDisk's two phases (no torch here).

    Attributes:
        phase: ``"made"`` (trains the global MADE, `model` is the MADE's name)
            or ``"classifier"`` (phase 2, the classifier with sample weights).
        settings: FedDisk's settings (MADE name, patience, loss codec, ...).
    """

    phase: Phase
    settings: FeddiskSettings

    @abstractmethod
    def validation_loss(self, made_arrays: Arrays) -> tuple[float, int]:
        """The MADE's mean NLL on the validation split, and the split's size."""

    @abstractmethod
    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        """Compute the sample weights from the global MADE; enter phase 2.

        ``None`` (no global MADE reached this device) gives uniform weights.
        Returns a summary for reports (no per-sample data).
        """

    @abstractmethod
    def restore_weights(self, weights: npt.NDArray[np.float64] | None) -> None:
        """Enter phase 2 with persisted sample weights (None: uniform)."""

    @property
    @abstractmethod
    def sample_weights(self) -> npt.NDArray[np.float64] | None:
        """The phase-2 sample weights (None before the switch or if uniform)."""
