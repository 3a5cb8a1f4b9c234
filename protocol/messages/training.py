"""A round of training: the announce, the signed selection, models and updates."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    MAX_TRIES,
    MODEL,
    ROUND,
    BaseMessage,
    Blob,
    Count,
    DeviceList,
    Id,
    Name,
    Positive,
    Sha256Hex,
)

MAX_UPDATE_METRICS = 16
"""Most metrics one `ModelUpdate` carries."""


def _unique_names(
    pairs: tuple[tuple[str, float], ...],
) -> tuple[tuple[str, float], ...]:
    if len({name for name, _ in pairs}) != len(pairs):
        raise ValueError("metric names must be unique")
    return pairs


class RoundAnnounce(BaseMessage):
    """Coordinator to all (retained): a round opens with its K, H and deadline."""

    kind: Literal["round_announce"] = "round_announce"
    topic: ClassVar[str] = ROUND
    retained: ClassVar[bool] = True
    epoch: Count
    k: Positive
    tries: Annotated[int, Field(ge=1, le=MAX_TRIES)] = 1
    deadline_s: Annotated[float, Field(gt=0.0)]
    model: Name = "classifier"
    model_version: Count | None = None
    model_transfer_id: Id | None = None
    explicit_replies: bool = False
    """Every online registered device answers, all-no draws included, so the
    coordinator closes the window once all have (a fleet under the
    coordinator's ``[selection] explicit_replies_below``); False: silence
    means no."""


class SelectionResult(BaseMessage):
    """Coordinator to all: the round's exactly-K participants, signed."""

    kind: Literal["selection_result"] = "selection_result"
    selected: DeviceList
    try_index: Count | None = None


class ModelAvailable(BaseMessage):
    """Coordinator to all: a global model version, fetched by its transfer.

    ``sha256`` is the version's bytes' digest, signed with the notice: a
    device trains round ``round`` only from exactly those bytes, whoever sent
    the chunks.
    """

    kind: Literal["model_available"] = "model_available"
    topic: ClassVar[str] = MODEL
    retained: ClassVar[bool] = True
    model: Name
    model_version: Count
    transfer_id: Id
    sha256: Sha256Hex
    format: Literal["state_dict", "onnx"] = "state_dict"


class ModelUpdate(BaseMessage):
    """Device to coordinator: a trained delta, inline or as a transfer."""

    kind: Literal["model_update"] = "model_update"
    model: Name = "classifier"
    base_version: Count
    num_examples: Count
    delta_scaled: bool = False
    transfer_id: Id | None = None
    weights: Blob | None = None
    metrics: Annotated[
        tuple[tuple[Name, float], ...],
        Field(max_length=MAX_UPDATE_METRICS),
        AfterValidator(_unique_names),
    ] = ()
    """What the device says of its training, as (name, value) pairs (``loss``,
    ``samples``, ``train_s``, ...); the coordinator averages them per round."""

    @_model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.transfer_id is None) == (self.weights is None):
            raise ValueError("give exactly one of transfer_id and weights")
        return self
