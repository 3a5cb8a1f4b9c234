"""How the coordinator sums model updates: ``[aggregation]`` in its config."""

from __future__ import annotations

import logging
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_TRIM_FRACTION", "MIN_THRESHOLD", "AggregationConfig"]

logger = logging.getLogger("ursa.coordinator.secure_aggregation")

MIN_THRESHOLD = 2
"""A sum over fewer devices than this is one device's update: never unmasked."""

DEFAULT_TRIM_FRACTION = 0.1
"""``trimmed_mean`` drops ``ceil(0.1 K)`` values per side and coordinate: one
hostile device in every ten selected is trimmed away, while four fifths of the
honest values still count (a 10 % trimmed mean keeps about 94 % of the mean's
efficiency on Gaussian data: Huber & Ronchetti, Robust Statistics, §3.3)."""


class AggregationConfig(BaseModel):
    """Secure aggregation (the default) or plain sums, and their bounds.

    ``mode = "secure"``: every round sums masked contributions; the coordinator
    learns the sum over at least ``threshold`` devices and nothing of any one
    of them. ``mode = "plain"`` is for debugging: the coordinator sees every
    update (it logs a WARNING at start), and devices send one only if their
    own config allows it. Both modes bound what one device adds: its delta to
    ``clip_norm`` (L2) and its FedAvg weight to ``max_examples`` (secure: the
    devices clip and the coordinator checks the unmasked sum; plain: the
    coordinator clips each update itself, docs/bounded_influence.md).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["secure", "plain"] = "secure"
    """``secure``: masked sums only; ``plain``: the coordinator sees each update."""
    threshold: int | None = Field(default=None, ge=MIN_THRESHOLD)
    """Fewest surviving devices whose sum may be unmasked (None: ceil(2K/3))."""
    sparse_above: int = Field(default=32, ge=2)
    """Above this many selected devices, mask over a sparse neighbour graph
    (SecAgg+): per-device cost grows as log K instead of K."""
    clip_norm: float = Field(default=10.0, gt=0.0, allow_inf_nan=False)
    """Devices clip their delta to this L2 norm (it bounds what one adds)."""
    max_examples: int = Field(default=10_000, ge=1)
    """The largest FedAvg weight a device may give its update."""
    aggregation_rule: Literal["mean", "trimmed_mean", "median"] = "mean"
    """How the round combines its updates: a (weighted) mean, or, plain mode
    only, a coordinate-wise trimmed mean or median of the clipped deltas."""
    trim_fraction: float = Field(default=DEFAULT_TRIM_FRACTION, ge=0.0, lt=0.5)
    """``trimmed_mean``: the share of values dropped at each end, per coordinate
    (``ceil(trim_fraction * K)``, always leaving at least one)."""
    noise_multiplier: float = Field(default=0.0, ge=0.0)
    """Distributed DP: the summed noise's std over the sensitivity (0: off)."""
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    """The DP delta epsilon is reported at."""
    keys_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long each of the two key steps waits for the selected devices."""
    unmask_timeout_s: float = Field(default=30.0, gt=0.0)
    """How long the unmasking waits for the survivors' shares."""

    @model_validator(mode="after")
    def _rule_fits_mode(self) -> AggregationConfig:
        """A masked sum gives the coordinator only the sum: no median of it."""
        if self.secure and self.aggregation_rule != "mean":
            raise ValueError(
                f'aggregation_rule = "{self.aggregation_rule}" needs the single '
                "updates: secure aggregation gives only their sum, so mode = "
                '"secure" supports "mean" only (use mode = "plain" for a robust rule)'
            )
        return self

    @property
    def secure(self) -> bool:
        """Whether rounds sum under masks."""
        return self.mode == "secure"

    def threshold_for(self, selected: int) -> int:
        """The round's threshold for ``selected`` devices (may exceed it: no sum)."""
        wanted = self.threshold or math.ceil(2 * selected / 3)
        return max(MIN_THRESHOLD, min(wanted, selected) if selected else wanted)
