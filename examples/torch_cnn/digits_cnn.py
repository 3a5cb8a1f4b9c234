"""The example's own model: a small CNN with BatchNorm for 8x8 digit images.

Named in both configs by its import path, ``digits_cnn:build``, with
``MODEL_OPTIONS`` as its keyword arguments (the coordinator builds version 0
from it and checks every tensor; the devices train it).
"""

from __future__ import annotations

import torch
from torch import nn

MODEL_OPTIONS = {"num_classes": 10, "channels": 8}
"""The keyword arguments both configs give ``build``."""


class DigitsCnn(nn.Module):
    """conv-BN-ReLU x2, max-pool, linear: 1x8x8 images to class logits."""

    def __init__(self, num_classes: int, channels: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.BatchNorm2d(2 * channels),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 16, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(n, num_classes)`` for ``(n, 1, 8, 8)`` images."""
        out: torch.Tensor = self.head(self.features(x.reshape(-1, 1, 8, 8)))
        return out


def build(num_classes: int = 10, channels: int = 8) -> DigitsCnn:
    """The factory ``digits_cnn:build`` both configs name."""
    return DigitsCnn(num_classes, channels)
