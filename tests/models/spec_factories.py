"""Model factories named by import path in the spec tests (NumPy only)."""

from __future__ import annotations

import numpy as np


def softmax(features: int, classes: int) -> list[np.ndarray]:
    return [np.zeros((features, classes)), np.zeros(classes)]


def named() -> dict[str, np.ndarray]:
    return {"w": np.ones(3), "steps": np.array(0)}


def wrong() -> str:
    return "not a model"
