"""Counters a device keeps of its own work, for demos, benchmarks and tests."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeviceStats", "TrainingStats"]


@dataclass
class DeviceStats:
    """Crypto seconds, and the rounds this device was selected in and answered."""

    crypto_s: float = 0.0
    selected_rounds: list[int] = field(default_factory=list)
    answered_rounds: list[int] = field(default_factory=list)


@dataclass
class TrainingStats:
    """Counters of the training side (for demos and benchmarks)."""

    train_s: float = 0.0
    rounds_trained: int = 0
    update_bytes: int = 0
    models_downloaded: int = 0
    dual_steps: int = 0
