"""`PhasedTrainer`: what FedDisk's device half needs of its trainer (no torch here).

A protocol, not a base class: `FedDisk` is chosen by the ``kind = "feddisk"``
table (`ursa.edge_sdk.methods.registry`) and checks that the device's
`ModelTrainer` also has these two phases; the torch one is
`ursa.edge_sdk.methods.feddisk.trainer.FeddiskTrainer`. Its own module so the
phase-1 steps, the state files and the torch-backed trainer share it without
importing one another.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
from ursa.models.weights import Arrays

__all__ = ["Phase", "PhasedTrainer"]

Phase = Literal["made", "classifier"]


@runtime_checkable
class PhasedTrainer(Protocol):
    """A trainer with FedDisk's two phases.

    Attributes:
        phase: ``"made"`` (trains the global MADE, `model` is the MADE's name)
            or ``"classifier"`` (phase 2, the classifier with sample weights).
        settings: FedDisk's settings (MADE name, patience, loss codec, ...).
        model: The wire name of the model the current phase trains.
    """

    phase: Phase
    settings: FeddiskSettings
    model: str

    def validation_loss(self, made_arrays: Arrays) -> tuple[float, int]:
        """The MADE's mean NLL on the validation split, and the split's size."""
        ...

    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        """Compute the sample weights from the global MADE; enter phase 2.

        ``None`` (no global MADE reached this device) gives uniform weights.
        Returns a summary for reports (no per-sample data).
        """
        ...

    def restore_weights(self, weights: npt.NDArray[np.float64] | None) -> None:
        """Enter phase 2 with persisted sample weights (None: uniform)."""
        ...

    @property
    def sample_weights(self) -> npt.NDArray[np.float64] | None:
        """The phase-2 sample weights (None before the switch or if uniform)."""
        ...
