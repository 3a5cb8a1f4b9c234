"""`LocalDataset`: the labels a device registers and the trainer that holds its samples.

The labels never leave the device: the key epoch computes the registry slot
from their histogram, methods read their distribution, and a balancing
method (FLICKER) may replace them (and the trainer's samples) once, before
the device first registers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.data_check import (
    DataFacts,
    DataProblem,
    FederationFacts,
    data_problems,
)
from ursa.edge_sdk.method import LocalData
from ursa.edge_sdk.trainer import ModelTrainer, NoOpTrainer, Trainer

__all__ = ["LocalDataset"]

logger = logging.getLogger("ursa.edge_sdk")


class LocalDataset:
    """The device's labels (class indices) and its trainer.

    Raises:
        ValueError: ``labels`` are not a 1-D array of non-negative integers.
    """

    def __init__(
        self,
        device_id: str,
        labels: Sequence[int] | NDArray[np.integer],
        trainer: Trainer | None,
    ) -> None:
        array = np.asarray(labels)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError("labels must be a 1-D array of class indices")
        if array.size and array.min() < 0:
            raise ValueError("labels must be non-negative class indices")
        self.device_id = device_id
        self.labels: NDArray[np.int64] = array.astype(np.int64)
        self.trainer: Trainer = trainer or NoOpTrainer(int(array.size))

    @property
    def model_trainer(self) -> ModelTrainer | None:
        """The trainer, if it trains a model (else the device only selects)."""
        trainer = self.trainer
        return trainer if isinstance(trainer, ModelTrainer) else None

    def distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """The label distribution over `num_classes`, or None if labels do not fit."""
        labels = self.labels
        if labels.size == 0 or int(labels.max()) >= num_classes:
            return None
        counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
        distribution: NDArray[np.float64] = counts / counts.sum()
        return distribution

    def problems(self, num_classes: int) -> tuple[DataProblem, ...]:
        """How the labels do not fit a federation of ``num_classes`` classes."""
        federation = FederationFacts(num_classes=num_classes)
        return tuple(data_problems(DataFacts.of(self.labels), federation))

    def use(self, by: str, data: LocalData) -> None:
        """Labels (and the trainer's samples) as method ``by`` left them."""
        if len(data.labels) == 0:
            logger.error("%s: %s left no samples; keeping mine", self.device_id, by)
            return
        before = len(self.labels)
        if data.x is not None:
            try:
                self.trainer.use_data(data.x, data.labels)
            except (NotImplementedError, ValueError) as exc:
                logger.error("%s: %s's data not used: %s", self.device_id, by, exc)
                return
        self.labels = data.labels
        if isinstance(self.trainer, NoOpTrainer):
            self.trainer.num_examples = len(data.labels)
        logger.info(
            "%s: %s done: %d samples (%d before)",
            self.device_id,
            by,
            len(data.labels),
            before,
        )
