"""Stand-in model trainers for the device's tests (no torch)."""

from __future__ import annotations

import numpy as np

from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.spec import check_fits
from ursa.models.weights import Arrays


class PlainTrainer(ModelTrainer):
    """A model trainer without CLIMB settings of its own; it accepts any model."""

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        return LocalDelta(dict(global_arrays), 3)

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.5


class ShapedTrainer(PlainTrainer):
    """A trainer whose own model is one float tensor ``w`` of ``shape``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.own = {"w": np.zeros(shape, dtype=np.float32)}

    def check_arrays(self, global_arrays: Arrays) -> None:
        check_fits(self.own, global_arrays)
