"""A `TorchTrainer` that keeps the FedProx ``mu`` of each round it trained."""

from __future__ import annotations

from typing import Any

from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.trainer import LocalDelta
from ursa.models.weights import Arrays


class MuRecordingTrainer(TorchTrainer):
    """Records ``mu`` per round (0 never shows: a round without mu is FedAvg's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mus: dict[int, float] = {}

    def train_proximal(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float, mu: float
    ) -> LocalDelta:
        """Record ``mu``, then train as `TorchTrainer` does."""
        self.mus[round_index] = mu
        return super().train_proximal(
            round_index, global_arrays, delta_scale=delta_scale, mu=mu
        )
