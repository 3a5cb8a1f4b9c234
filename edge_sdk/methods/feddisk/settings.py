"""FedDisk's device settings, torch-free so a config can be checked without torch.

`ursa.edge_sdk.methods.feddisk.trainer.FeddiskTrainer` runs them; the device's
``[[methods]]`` table ``kind = "feddisk"`` holds them
(`ursa.edge_sdk.methods_config.FeddiskDeviceSpec`).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from typing_extensions import Self

from ursa.edge_sdk.methods.feddisk.made_loss import MadeLossCodec
from ursa.protocol.messages import NAME_PATTERN

__all__ = [
    "DEFAULT_CROSSFIT_FOLDS",
    "DEFAULT_MADE_HIDDEN_SIZES",
    "DEFAULT_WEIGHT_CLIP",
    "FeddiskSettings",
]

DEFAULT_WEIGHT_CLIP = (0.1, 10.0)
"""The band sample weights are clipped to
(`ursa.edge_sdk.methods.feddisk.sample_weights` says why).

Here, not beside the torch code that applies it, so a config is checked without
torch.
"""
DEFAULT_CROSSFIT_FOLDS = 2
"""Parts the density-ratio classifier is cross-fitted over
(`ursa.edge_sdk.methods.feddisk.sample_weights`).

Each part's samples are weighted by a classifier fitted on the other parts; 2
keeps the classifier's cost of the single fit it replaces (two fits on halves).
"""
DEFAULT_MADE_HIDDEN_SIZES = (64,)
"""The MADE's hidden widths; ``ursa model init --model made`` uses them too."""


class FeddiskSettings(BaseModel):
    """FedDisk's device settings (frozen; defaults as in the simulator)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    made_model: str = Field(default="made", pattern=NAME_PATTERN)
    """The MADE's wire name (`ModelAvailable.model` in phase 1)."""
    made_hidden_sizes: tuple[PositiveInt, ...] = Field(
        default=DEFAULT_MADE_HIDDEN_SIZES, min_length=1
    )
    """The MADE's hidden layer widths (the coordinator's MADE must match)."""
    made_lr: float = Field(default=1e-2, gt=0.0)
    """Learning rate of the federated MADE's local rounds."""
    made_batch_size: PositiveInt = 16
    """Batch size of the federated MADE's local rounds."""
    made_epochs_per_round: PositiveInt = 1
    """Local epochs per federated MADE round."""
    val_fraction: float = Field(default=0.15, gt=0.0, lt=1.0)
    """Share of the local data held out for the MADEs' validation NLL."""
    local_made_epochs_per_check: PositiveInt = 5
    """The local MADE trains this many epochs between validation checks."""
    local_made_max_epochs: PositiveInt = 500
    """The local MADE's most epochs."""
    local_made_patience: PositiveInt = 2
    """Checks without improvement that stop the local MADE."""
    made_patience: PositiveInt = 1
    """Rises of the fleet's validation NLL in a row that end phase 1."""
    classifier_hidden: int = Field(default=100, ge=0)
    """Hidden width of the density-ratio classifier (0: logistic regression)."""
    classifier_epochs: PositiveInt = 50
    """Epochs of the density-ratio classifier (global vs local samples)."""
    classifier_lr: float = Field(default=0.01, gt=0.0)
    """Its learning rate."""
    classifier_batch_size: PositiveInt = 32
    """Its batch size."""
    crossfit_folds: int = Field(default=DEFAULT_CROSSFIT_FOLDS, ge=2)
    """Parts the density-ratio classifier is cross-fitted over."""
    clip: tuple[float, float] = DEFAULT_WEIGHT_CLIP
    """Sample weights are clipped to this band before the mean-1 normalisation."""
    loss: MadeLossCodec = Field(default_factory=MadeLossCodec)
    """Bounds of the encrypted loss report's fixed-point codec."""

    @model_validator(mode="after")
    def _check_clip(self) -> Self:
        low, high = self.clip
        if not 0.0 < low <= high or not math.isfinite(high):
            raise ValueError(
                f"clip must satisfy 0 < low <= high < inf, got {self.clip}"
            )
        return self

    def made_model_config(self, input_dim: int) -> dict[str, Any]:
        """The MADE's config (`ursa.models.registry`) for ``input_dim`` features."""
        return {"input_dim": input_dim, "hidden_sizes": list(self.made_hidden_sizes)}
