"""How the coordinator sums model updates: ``[aggregation]`` in its config."""

from __future__ import annotations

import logging
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MIN_THRESHOLD", "AggregationConfig"]

logger = logging.getLogger("ursa.coordinator.secure_aggregation")

MIN_THRESHOLD = 2
"""A sum over fewer devices than this is one device's update: never unmasked."""


class AggregationConfig(BaseModel):
    """Secure aggregation (the default) or plain sums, and their bounds.

    ``mode = "secure"``: every round sums masked contributions; the coordinator
    learns the sum over at least ``threshold`` devices and nothing of any one
    of them. ``mode = "plain"`` is for debugging: the coordinator sees every
    update (it logs a WARNING at start), and devices send one only if their
    own config allows it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["secure", "plain"] = "secure"
    threshold: int | None = Field(default=None, ge=MIN_THRESHOLD)
    """Fewest surviving devices whose sum may be unmasked (None: ceil(2K/3))."""
    sparse_above: int = Field(default=32, ge=2)
    """Above this many selected devices, mask over a sparse neighbour graph
    (SecAgg+): per-device cost grows as log K instead of K."""
    clip_norm: float = Field(default=10.0, gt=0.0)
    """Devices clip their delta to this L2 norm (it bounds what one adds)."""
    max_examples: int = Field(default=10_000, ge=1)
    """The largest FedAvg weight a device may give its update."""
    noise_multiplier: float = Field(default=0.0, ge=0.0)
    """Distributed DP: the summed noise's std over the sensitivity (0: off)."""
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    """The DP delta epsilon is reported at."""
    keys_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long each of the two key steps waits for the selected devices."""
    unmask_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long the unmasking waits for the survivors' shares."""

    @property
    def secure(self) -> bool:
        """Whether rounds sum under masks."""
        return self.mode == "secure"

    def threshold_for(self, selected: int) -> int:
        """The round's threshold for ``selected`` devices (may exceed it: no sum)."""
        wanted = self.threshold or math.ceil(2 * selected / 3)
        return max(MIN_THRESHOLD, min(wanted, selected) if selected else wanted)
