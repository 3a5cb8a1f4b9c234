"""`FeddiskConfig`: how the coordinator runs FedDisk's phase 1.

Its own module because both halves of FedDisk's rounds read it: the phase
machine (`ursa.coordinator.methods.feddisk.plugin`: MADE rounds, the switch) and the
judgement it inherits (`ursa.coordinator.methods.feddisk.judging`: the loss step's
deadline and party cap, the verdict's deadline).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ursa.protocol.messages import NAME_PATTERN
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES

__all__ = ["FeddiskConfig"]


class FeddiskConfig(BaseModel):
    """How the coordinator runs FedDisk's phase 1 (frozen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    made_model: str = Field(default="made", pattern=NAME_PATTERN, max_length=24)
    max_made_rounds: int = Field(default=50, ge=1)
    """MADE training rounds at most; then the switch, whatever the loss does."""
    loss_timeout_s: float = Field(default=60.0, gt=0.0)
    """Loss reports are not waited for after this long (from the request)."""
    verdict_timeout_s: float = Field(default=30.0, gt=0.0)
    """The agent's verdict is not waited for after this long (from the sum)."""
    max_parties: int = Field(default=DEFAULT_MAX_PARTIES, ge=1)
    """Most loss reports in one sum (the devices' codec bound too)."""
