"""One open training round on the coordinator, and the training settings.

`OpenRound` holds a round's participants, phase, deadline, running weighted
sum (`ursa.coordinator.aggregation`), the devices' uploads in flight and
updates waiting for their chunks. Its methods check one device message and
raise `RejectedError` (code and reason, answered as an `ErrorReply` by the
service) when it must be refused; `ursa.coordinator.training` drives it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ursa._compat import StrEnum
from ursa.coordinator.aggregation import (
    AggregationError,
    AggregationState,
    DeviceDelta,
    UpdateOutcome,
    Weighting,
    apply_update,
)
from ursa.coordinator.model_store import DEFAULT_KEEP_VERSIONS
from ursa.coordinator.model_transfer import (
    DEFAULT_MAX_CHUNK_REQUESTS,
    TransferRejectedError,
    Uploads,
)
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.models.weights import Arrays, WeightsError, arrays_from_bytes
from ursa.protocol.messages import (
    NAME_PATTERN,
    Chunk,
    ChunkRequest,
    ErrorCode,
    MaskedUpdate,
    TransferManifest,
)
from ursa.protocol.messages import ModelUpdate as UpdateMessage
from ursa.protocol.router import RejectedError

__all__ = ["WRONG_VERSION", "OpenRound", "RoundPhase", "TrainingConfig"]

logger = logging.getLogger("ursa.coordinator.training")

WRONG_VERSION = "wrong_version"
"""`ErrorReply.code` for an update trained from another global version."""


class TrainingConfig(BaseModel):
    """How the coordinator runs the training phase (frozen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="classifier", pattern=NAME_PATTERN, max_length=24)
    weighting: Weighting = Weighting.FEDAVG
    """FedAvg or equal; a before-training step may say otherwise (CLIMB)."""
    server_lr: float = Field(default=1.0, gt=0.0)
    update_timeout_s: float = Field(default=300.0, gt=0.0)
    """Updates after this long (from ModelAvailable) are not waited for."""
    chunk_size: int = Field(default=256 * 1024, ge=1024, le=1024 * 1024)
    retry_s: float = Field(default=5.0, gt=0.0)
    max_update_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """One device's upload in a round (it has one); the round's total is this
    times the selected devices."""
    max_chunk_requests: int = Field(default=DEFAULT_MAX_CHUNK_REQUESTS, ge=1)
    """Chunk re-requests answered per device and model version."""
    keep_versions: int = Field(default=DEFAULT_KEEP_VERSIONS, ge=1)
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    """How updates are summed: under masks (the default) or in the clear."""

    @field_validator("weighting")
    @classmethod
    def _not_climb(cls, weighting: Weighting) -> Weighting:
        if weighting is Weighting.CLIMB:
            raise ValueError(
                "CLIMB's weighting comes with its dual step: pass a "
                "ursa.coordinator.methods.climb.ClimbDualStep to the TrainingPlugin"
            )
        return weighting


class RoundPhase(StrEnum):
    """Where an open round is."""

    BEFORE = "before_training"
    """The runtime's before-training steps run (`ursa.coordinator.step_runner`),
    then secure aggregation's key steps."""
    TRAIN = "train"
    UNMASK = "unmask"
    """Secure aggregation: the survivors' shares remove the masks from the sum."""
    DONE = "done"


@dataclass
class OpenRound:
    """The round being trained (see the module docstring)."""

    index: int
    model: str
    base_version: int
    base_arrays: Arrays
    selected: tuple[str, ...]
    phase: RoundPhase
    deadline_at: float
    aggregation: AggregationState
    uploads: Uploads
    started_at: float
    keys_opened: bool = False
    """Secure aggregation's key steps opened (after the runtime's steps)."""
    pending: dict[str, tuple[UpdateMessage | MaskedUpdate, float]] = field(
        default_factory=dict
    )
    device_metrics: dict[str, Mapping[str, float]] = field(default_factory=dict)
    """What each counted device said of its training (`ModelUpdate.metrics`)."""
    failed: set[str] = field(default_factory=set)
    """Selected devices that reported their training failed (not waited for)."""
    refused: set[str] = field(default_factory=set)
    """Selected devices whose update was refused as unusable (not waited for:
    the violator's round is over, the honest fleet's goes on)."""

    def check_participant(self, device: str) -> None:
        """Refuse a device that may not send updates (or upload) now."""
        if self.phase is RoundPhase.DONE:
            raise RejectedError(
                ErrorCode.LATE, f"round {self.index} is already aggregated"
            )
        if device not in self.selected:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not selected in round {self.index}"
            )
        if self.phase is not RoundPhase.TRAIN:
            raise RejectedError(
                ErrorCode.LATE, f"round {self.index} is still in a before-training step"
            )

    def receive(
        self,
        device: str,
        message: UpdateMessage | MaskedUpdate,
        now: float,
        counted: Set[str],
    ) -> bytes | None:
        """Take an update, plain or masked: its payload, or None while it uploads.

        ``counted``: the devices whose update is already in the round's sum.
        The caller adds the payload (`apply` for a plain delta).
        """
        self.check_participant(device)
        if message.model != self.model:
            raise RejectedError(
                ErrorCode.MALFORMED, f"model {message.model!r}, training {self.model!r}"
            )
        if message.base_version != self.base_version:
            raise RejectedError(
                WRONG_VERSION,
                f"update from version {message.base_version}; round {self.index} "
                f"trains version {self.base_version}",
            )
        if device in self.refused:
            raise RejectedError(
                ErrorCode.LATE,
                f"this device's update for round {self.index} was refused already",
            )
        if device in counted or device in self.pending:
            raise RejectedError(
                ErrorCode.LATE,
                f"a second update for round {self.index} is ignored (the first counts)",
            )
        inline = (
            message.weights if isinstance(message, UpdateMessage) else message.vector
        )
        if inline is not None:
            return inline
        assert message.transfer_id is not None
        payload = self.uploads.payload(device, message.transfer_id)
        if payload is None:
            self.pending[device] = (message, now)  # its chunks are still coming
            return None
        self.uploads.forget(message.transfer_id)
        return payload

    def receive_upload(
        self, device: str, message: TransferManifest | Chunk
    ) -> tuple[UpdateMessage | MaskedUpdate, bytes] | None:
        """Take an upload manifest or chunk: the update it completed, and its bytes."""
        self.check_participant(device)
        try:
            if isinstance(message, TransferManifest):
                self.uploads.on_manifest(device, message)
                return None
            if not self.uploads.on_chunk(device, message):
                return None
        except TransferRejectedError as exc:
            raise RejectedError(ErrorCode.TRANSFER_FAILED, str(exc)) from None
        pending = self.pending.get(device)
        if pending is None or pending[0].transfer_id != message.transfer_id:
            return None
        payload = self.uploads.payload(device, message.transfer_id)
        assert payload is not None
        del self.pending[device]
        self.uploads.forget(message.transfer_id)
        return pending[0], payload

    def apply(self, device: str, message: UpdateMessage, payload: bytes) -> bool:
        """Add a delta to the running sum; False for a device's repeat."""
        try:
            delta = arrays_from_bytes(payload, self.base_arrays)
            update = DeviceDelta(device, delta, message.num_examples)
            self.aggregation, outcome = apply_update(self.aggregation, update)
        except (WeightsError, AggregationError) as exc:
            self.refused.add(device)
            raise RejectedError(
                ErrorCode.MALFORMED, f"unusable update: {exc}"
            ) from None
        return outcome is UpdateOutcome.ACCEPTED

    def waiting(
        self,
        online: Set[str] | None,
        *,
        expected: Set[str] | None = None,
        answered: Set[str] | None = None,
    ) -> set[str]:
        """Selected devices (online ones, if known) whose update has not counted.

        O(K): only the selected devices are looked up in ``online``. A secure
        round passes ``expected`` (who shared keys) and ``answered`` (whose
        masked vector is in the sum).
        """
        if answered is None:
            answered = self.aggregation.device_ids
        return {
            d
            for d in (self.selected if expected is None else expected)
            if (online is None or d in online)
            and d not in answered
            and d not in self.failed
            and d not in self.refused
        }

    def fail(self, device: str) -> bool:
        """A selected device's training failed: True if it was still waited for."""
        if device not in self.selected or device in self.aggregation.device_ids:
            return False
        if device in self.failed or device in self.pending:
            return False
        self.failed.add(device)
        return True

    def stale_uploads(
        self, now: float, retry_s: float, federation: str
    ) -> list[tuple[str, ChunkRequest]]:
        """Re-requests for pending updates whose chunks are overdue."""
        out = []
        for device, (message, asked_at) in list(self.pending.items()):
            if message.transfer_id is None or now - asked_at < retry_s:
                continue
            self.pending[device] = (message, now)
            request = self.uploads.missing_request(
                device,
                message.transfer_id,
                federation=federation,
                round_index=self.index,
            )
            if request is not None:
                out.append((device, request))
        return out

    def close(self) -> None:
        """Mark the round done and drop what is still in flight."""
        self.phase = RoundPhase.DONE
        self.pending.clear()
        for tid in self.uploads.transfer_ids():
            self.uploads.forget(tid)


def summarise_device_metrics(
    reported: Mapping[str, Mapping[str, float]],
) -> dict[str, float]:
    """One round's device metrics, averaged over the devices that reported them.

    ``samples`` is summed (a fleet total); ``reporting`` counts the devices.
    """
    summary: dict[str, float] = {"reporting": float(len(reported))}
    names = sorted({name for metrics in reported.values() for name in metrics})
    for name in names:
        values = [m[name] for m in reported.values() if name in m]
        total = float(sum(values))
        summary[name] = total if name == "samples" else total / len(values)
    return summary
