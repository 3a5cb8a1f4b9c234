"""Dubhe's wire contract: registration (Fig. 4) and multi-time selection (Fig. 3, 5).

The parameter search of §5.3.2 (sigma grid) has no messages: it ran in the
simulator only and, measured there, a fixed sigma did as well (README).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    MAX_TRIES,
    REGISTRY,
    BaseMessage,
    Blob,
    Count,
    Positive,
    Signature,
    TryIndices,
)


class Registration(BaseMessage):
    """Device to coordinator: its encrypted one-hot registry."""

    kind: Literal["registration"] = "registration"
    epoch: Count
    candidate: Count = 0
    registry: Blob


class RegistrySum(BaseMessage):
    """Coordinator to all: the encrypted overall registry and its party count."""

    kind: Literal["registry_sum"] = "registry_sum"
    topic: ClassVar[str] = REGISTRY
    retained: ClassVar[bool] = True
    epoch: Count
    candidate: Count = 0
    registry_sum: Blob
    num_parties: Positive


class Volunteer(BaseMessage):
    """Device to coordinator: one Bernoulli(P) draw per try (length = tries)."""

    kind: Literal["volunteer"] = "volunteer"
    draws: Annotated[tuple[bool, ...], Field(min_length=1, max_length=MAX_TRIES)]


class TryAssignment(BaseMessage):
    """Coordinator to a tentative member: the tries it is in; send its distribution."""

    kind: Literal["try_assignment"] = "try_assignment"
    try_indices: TryIndices


class EncryptedDistribution(BaseMessage):
    """Device to coordinator: its packed fixed-point label distribution.

    Sent once per round; the coordinator adds it into every try it is in.
    """

    kind: Literal["encrypted_distribution"] = "encrypted_distribution"
    distribution: Blob


class TrySums(BaseMessage):
    """Coordinator to agent: the encrypted distribution sum of each try."""

    kind: Literal["try_sums"] = "try_sums"
    sums: Annotated[tuple[Blob, ...], Field(min_length=1, max_length=MAX_TRIES)]
    member_counts: tuple[Positive, ...]

    @_model_validator(mode="after")
    def _same_length(self) -> Self:
        if len(self.member_counts) != len(self.sums):
            raise ValueError("member_counts needs one entry per sum")
        return self


class AgentAnswer(BaseMessage):
    """Agent to coordinator: only the index of the best try, signed."""

    kind: Literal["agent_answer"] = "agent_answer"
    best_try: Count
    signature: Signature = b""
