"""A torch model factory named by import path in the compose tests."""

from __future__ import annotations

from torch import nn


def tiny(features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))
