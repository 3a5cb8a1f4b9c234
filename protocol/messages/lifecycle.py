"""The end of a federation: the coordinator's signed, retained `FederationEnd`.

Published once, when the coordinator has run its rounds, on its own global
topic (``end``) and retained, so a device offline at the end learns it when
it reconnects. It names the final model (its version and transfer id, the
same id the model's chunks carry, `model_transfer_id`) and the coordinator's
evaluation figures of it. A final model that fits one chunk travels inline
too, so a late device needs nothing but the broker; a larger one is fetched
by its transfer (chunk requests, answered while the coordinator still serves).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    BaseMessage,
    Blob,
    Count,
    Id,
    Name,
)

END = "end"
"""The global topic name of `FederationEnd` (retained)."""

MAX_END_METRICS = 32
"""Most evaluation figures one `FederationEnd` carries."""


class FederationEnd(BaseMessage):
    """Coordinator to all (signed, retained): the federation is over, its model."""

    kind: Literal["federation_end"] = "federation_end"
    topic: ClassVar[str] = END
    retained: ClassVar[bool] = True
    rounds: Count
    """Rounds completed."""
    model: Name | None = None
    """The final model's wire name (None: the federation trained no model)."""
    model_version: Count | None = None
    transfer_id: Id | None = None
    weights: Blob | None = None
    """The final model's weights file inline, when it fits one chunk."""
    metrics: Annotated[dict[Name, float], Field(max_length=MAX_END_METRICS)] = Field(
        default_factory=dict
    )
    """The coordinator's evaluation of the final model (e.g. ``accuracy``)."""

    @_model_validator(mode="after")
    def _model_named_whole(self) -> Self:
        named = (self.model, self.model_version, self.transfer_id)
        if any(v is None for v in named) and any(v is not None for v in named):
            raise ValueError("give model, model_version and transfer_id together")
        if self.weights is not None and self.model is None:
            raise ValueError("weights without a model")
        return self
