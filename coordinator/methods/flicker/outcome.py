"""Types of the coordinator's FLICKER run: phase, config and outcome.

`ursa.coordinator.methods.flicker.session` runs the protocol with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ursa._compat import StrEnum
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.redundancy import DEFAULT_MAX_PRODUCT_CIPHERTEXTS
from ursa.protocol.messages import DEFAULT_CHUNK_SIZE, ID_PATTERN

__all__ = [
    "DEFAULT_HOP_DEADLINE_S",
    "DEFAULT_NABLA_CLIENT",
    "DEFAULT_REDUNDANCY_DEADLINE_S",
    "DEFAULT_REPLY_DEADLINE_S",
    "FlickerOutcome",
    "FlickerPhase",
    "FlickerServiceConfig",
]

DEFAULT_NABLA_CLIENT = 0.05
"""Target local imbalance sent to the dominant device (the FLICKER paper, §4.1)."""
DEFAULT_HOP_DEADLINE_S = 30.0
DEFAULT_REPLY_DEADLINE_S = 60.0
DEFAULT_REDUNDANCY_DEADLINE_S = 30.0
"""Time peers get to answer a global redundancy test (then skipped)."""


class FlickerPhase(StrEnum):
    """Where the coordinator's FLICKER run stands."""

    IDLE = "idle"
    RING = "ring"
    LOCALISE = "localise"
    RESAMPLE = "resample"
    DONE = "done"
    FAILED = "failed"


class FlickerServiceConfig(BaseModel):
    """How the coordinator runs FLICKER (frozen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    federation: str = Field(pattern=ID_PATTERN)
    num_classes: int = Field(ge=2, le=4096)
    nabla: float = Field(default=fl.DEFAULT_NABLA, gt=0.0, lt=1.0)
    nabla_client: float = Field(default=DEFAULT_NABLA_CLIENT, gt=0.0, le=1.0)
    hop_deadline_s: float = Field(default=DEFAULT_HOP_DEADLINE_S, gt=0.0)
    reply_deadline_s: float = Field(default=DEFAULT_REPLY_DEADLINE_S, gt=0.0)
    max_updates: int = Field(default=fl.DEFAULT_MAX_UPDATES, ge=1)
    redundancy_deadline_s: float = Field(default=DEFAULT_REDUNDANCY_DEADLINE_S, gt=0.0)
    max_product_ciphertexts: int = Field(
        default=DEFAULT_MAX_PRODUCT_CIPHERTEXTS, ge=1, le=4096
    )
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=1024)


@dataclass(frozen=True)
class FlickerOutcome:
    """What a run produced (the coordinator's view: no device's own counts).

    ``run_id`` is the ring id every message of the run carries ("" before
    the first run).
    """

    phase: FlickerPhase
    ring_order: tuple[str, ...]
    contributors: tuple[str, ...]
    skipped: tuple[str, ...]
    gd_before: tuple[int, ...] | None
    state: fl.FlickerState | None
    failure: str | None
    log: tuple[dict[str, Any], ...] = ()
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able summary."""
        return {
            "run_id": self.run_id,
            "phase": str(self.phase),
            "ring_order": list(self.ring_order),
            "contributors": list(self.contributors),
            "skipped": list(self.skipped),
            "gd_before": None if self.gd_before is None else list(self.gd_before),
            "state": None if self.state is None else self.state.to_dict(),
            "failure": self.failure,
            "steps": list(self.log),
        }
