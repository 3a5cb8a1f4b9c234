"""The example's torch-free model: softmax regression trained with NumPy.

``initial_weights`` is the factory both configs name
(``softmax_model:initial_weights``): it returns the weights as a list of
arrays, so the coordinator needs no torch either. `SoftmaxTrainer` is the
device's `ursa.edge_sdk.ArrayTrainer`: ``fit`` runs mini-batch gradient
descent from the global weights for ``plan.epochs`` epochs, weighting each
sample's loss by ``plan.sample_weights`` when a method set them (FedDisk).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk import ArrayTrainer, FitPlan, FitResult

MODEL_OPTIONS = {"features": 64, "classes": 10}
"""The keyword arguments both configs give ``initial_weights``."""

Weights = list[NDArray[Any]]


def initial_weights(features: int = 64, classes: int = 10) -> Weights:
    """``[W (features x classes), b (classes)]``, all zeros (a convex model)."""
    return [
        np.zeros((features, classes), dtype=np.float32),
        np.zeros(classes, dtype=np.float32),
    ]


def _probabilities(
    x: NDArray[np.float32], w: NDArray[Any], b: NDArray[Any]
) -> NDArray[np.float64]:
    logits = x.astype(np.float64) @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    probs: NDArray[np.float64] = exp / exp.sum(axis=1, keepdims=True)
    return probs


class SoftmaxTrainer(ArrayTrainer):
    """Softmax regression on this device's samples (NumPy only)."""

    def __init__(
        self,
        x: NDArray[np.float32],
        y: NDArray[np.int64],
        *,
        features: int = 64,
        classes: int = 10,
        lr: float = 0.5,
        batch_size: int = 32,
    ) -> None:
        self.x, self.y = x.reshape(len(x), -1).astype(np.float32), y.astype(np.int64)
        self.features, self.classes = features, classes
        self.lr, self.batch_size = lr, batch_size

    def use_data(self, x: NDArray[Any], y: NDArray[np.int64]) -> None:
        """Train on FLICKER's resampled data from now on."""
        self.x, self.y = x.reshape(len(x), -1).astype(np.float32), y.astype(np.int64)

    def initial_weights(self) -> Sequence[NDArray[Any]]:
        """This device's model: the federation's must have the same shapes."""
        return initial_weights(self.features, self.classes)

    def fit(self, weights: Weights, plan: FitPlan) -> FitResult:
        """Mini-batch gradient descent from ``weights``; new weights and figures."""
        w, b = (np.asarray(a, dtype=np.float64) for a in weights)
        n = len(self.y)
        sample_w = np.ones(n) if plan.sample_weights is None else plan.sample_weights
        onehot = np.eye(self.classes)[self.y]
        rng = np.random.default_rng(plan.seed)
        for _ in range(plan.epochs):
            for start in range(0, n, self.batch_size):
                idx = rng.permutation(n)[start : start + self.batch_size]
                err = (_probabilities(self.x[idx], w, b) - onehot[idx]) * sample_w[
                    idx, None
                ]
                w -= self.lr * self.x[idx].T @ err / len(idx)
                b -= self.lr * err.mean(axis=0)
        figures = self.evaluate([w, b])
        return FitResult([w.astype(np.float32), b.astype(np.float32)], n, figures)

    def evaluate(self, weights: Weights) -> Mapping[str, float]:
        """Mean cross-entropy (``loss``, what CLIMB needs) and accuracy here."""
        probs = _probabilities(self.x, weights[0], weights[1])
        picked = probs[np.arange(len(self.y)), self.y]
        return {
            "loss": float(-np.log(np.clip(picked, 1e-12, None)).mean()),
            "accuracy": float((probs.argmax(axis=1) == self.y).mean()),
        }
