"""What `ursa demo`'s device processes get and give back: picklable specs, reports."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.protocol.trust_config import TrustConfig

__all__ = ["DeviceReport", "DeviceSpec", "FleetSpec"]


@dataclass(frozen=True)
class DeviceSpec:
    """One device: its id, its local training data and its seed."""

    device_id: str
    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    seed: int


@dataclass(frozen=True)
class FleetSpec:
    """What a device process runs (picklable)."""

    federation: str
    broker_url: str
    state_root: Path
    devices: tuple[DeviceSpec, ...]
    architecture: Literal["mlp", "cnn"]
    model_config: dict[str, Any]
    train: dict[str, Any]
    climb: dict[str, Any] | None = None
    feddisk: dict[str, Any] | None = None
    """`FeddiskSettings` fields when the run uses FedDisk."""
    wire_dtype: Literal["float32", "float16"] = "float32"
    selection: str = "dubhe"
    """The selection method's ``[[methods]]`` kind (``dubhe`` or ``random``)."""
    draw: str = "paper"
    """Dubhe's volunteer draw (``paper`` or ``stratified``)."""
    obfuscator_pool_size: int = 4
    eval_fraction: float = 0.0
    """Samples each device holds out for federated evaluation."""
    allow_plain_aggregation: bool = False
    """The devices send plain updates if the coordinator sums in the clear."""
    insecure_test_keys: bool = False
    """The devices accept the run's Paillier keys under 2048 bits (--key-bits)."""
    log_level: int = logging.WARNING
    extra: dict[str, Any] = field(default_factory=dict)
    trust: dict[str, TrustConfig] = field(default_factory=dict)
    """Each device's ``[trust]``: the demo certifies every device (none: tofu)."""


@dataclass(frozen=True)
class DeviceReport:
    """A device's figures at the end of the demo (no private data)."""

    device_id: str
    crypto_s: float
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    train_s: float
    rounds_trained: int
    update_bytes: int
    dual_steps: int
    selected_rounds: tuple[int, ...]
    error: str | None = None
    flicker: dict[str, Any] | None = None
    final_model_saved: bool = False
    """Whether the device saved the federation's final model (`FederationEnd`)."""
    round_train_s: tuple[tuple[int, float], ...] = ()
    """(round, local training seconds) of each round it trained."""
    peak_rss_bytes: int | None = None
    """Its process's peak resident set size (None where the OS does not say)."""
