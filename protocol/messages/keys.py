"""The Paillier key epoch (Dubhe Fig. 4): the signed notice, sealing, the agent's key.

Infrastructure rather than a method: Dubhe's registry, CLIMB's dual step and
FedDisk's loss judging all encrypt under the epoch's key.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    EPOCH,
    PUBLIC_KEY,
    BaseMessage,
    Count,
    DeviceId,
    Fraction,
    Name,
    Positive,
    Relay,
    _Frozen,
    unique_entries,
)
from ursa.protocol.messages.session import DeviceKeys


class MethodSetting(_Frozen):
    """One numeric setting of a method the devices run (not a message).

    Signed with its `KeyEpochStart`, so the value a device trains with is the
    coordinator's (FedProx's ``mu``: `ursa.protocol.fedprox`).
    """

    method: Name
    name: Name
    value: float


class KeyEpochStart(BaseMessage):
    """Coordinator to all: a new key epoch, its agent and registry parameters.

    `agent_keys` are the agent's enrolled identity keys: devices verify the
    agent's signed `AgentPublicKey` and open its `SealedSecretKey` with them.
    `methods` names the methods the federation runs on its devices (signed
    with the rest), so a device configured for other ones refuses the epoch
    with `method_mismatch` instead of silently skipping their steps;
    `method_settings` carries the values those methods' device halves take
    from the coordinator (FedProx's ``mu``), signed with the rest.
    """

    kind: Literal["key_epoch_start"] = "key_epoch_start"
    topic: ClassVar[str] = EPOCH
    retained: ClassVar[bool] = True
    epoch: Count
    agent: DeviceId
    agent_keys: DeviceKeys
    num_classes: Annotated[int, Field(ge=2, le=4096)]
    groups: Annotated[tuple[Positive, ...], Field(min_length=1, max_length=16)]
    sigma: Annotated[tuple[Fraction, ...], Field(min_length=1, max_length=16)]
    max_parties: Positive
    key_bits: Annotated[int, Field(ge=512, le=8192)] = 2048
    methods: Annotated[
        tuple[Name, ...],
        Field(min_length=1, max_length=16),
        AfterValidator(unique_entries),
    ]
    method_settings: Annotated[tuple[MethodSetting, ...], Field(max_length=16)] = ()
    aggregation: Literal["secure", "plain"] = "secure"
    """How the rounds sum model updates: under masks, or in the clear (a device
    sends a plain update only if its own config allows it)."""

    @_model_validator(mode="after")
    def _registry_params(self) -> Self:
        if any(a >= b for a, b in zip(self.groups, self.groups[1:], strict=False)):
            raise ValueError("groups must be strictly increasing")
        if self.groups[-1] != self.num_classes:
            raise ValueError("groups must end with num_classes")
        if len(self.sigma) != len(self.groups) or self.sigma[-1] != 0.0:
            raise ValueError("sigma needs one threshold per group, the last 0")
        if self.agent_keys.device_id != self.agent:
            raise ValueError("agent_keys must be the keys of the agent")
        unique_entries(tuple((s.method, s.name) for s in self.method_settings))
        if not {s.method for s in self.method_settings} <= set(self.methods):
            raise ValueError("method_settings must belong to listed methods")
        return self

    def method_setting(self, method: str, name: str) -> float | None:
        """The signed value of ``method``'s setting ``name`` (None: not sent)."""
        for setting in self.method_settings:
            if (setting.method, setting.name) == (method, name):
                return setting.value
        return None


SEAL_PAGE_SIZE = 256
"""Most recipients in one `SealRequest` page and boxes in one `SealedKeys`.

At about 115 B per recipient a page is about 30 KiB, far below the 1 MiB
payload cap whatever the fleet's size (issue 17: one request for every
recipient passed the cap at about 9,100 devices)."""

MAX_BOX_BYTES = 16 * 1024
"""Longest sealed box (a Paillier secret key of up to 8192 bits, sealed)."""

SEALED_KEYS_BUDGET = 256 * 1024
"""Most box bytes the agent puts in one `SealedKeys` (a quarter of the cap)."""


class SealRequest(BaseMessage):
    """Coordinator to agent: one page of the devices to seal the epoch's key to.

    The coordinator sends a few pages at a time and the next ones as the
    agent's boxes come back, so neither a message nor the agent's work in hand
    grows with the fleet. `page` counts from 0 up to `pages` - 1.
    """

    kind: Literal["seal_request"] = "seal_request"
    epoch: Count
    page: Count = 0
    pages: Positive = 1
    recipients: Annotated[
        tuple[DeviceKeys, ...], Field(min_length=1, max_length=SEAL_PAGE_SIZE)
    ]

    @_model_validator(mode="after")
    def _unique_recipients(self) -> Self:
        unique_entries(tuple(r.device_id for r in self.recipients))
        if self.page >= self.pages:
            raise ValueError(f"page {self.page} of {self.pages} pages")
        return self


class SealedBox(_Frozen):
    """One recipient's box in a `SealedKeys` (not a message)."""

    recipient: DeviceId
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_BOX_BYTES)]


def split_boxes(
    boxes: list[SealedBox], budget: int = SEALED_KEYS_BUDGET
) -> list[tuple[SealedBox, ...]]:
    """Boxes in consecutive runs of at most ``budget`` box bytes (at least one each).

    How an agent cuts one page's boxes into `SealedKeys` messages.
    """
    parts: list[tuple[SealedBox, ...]] = []
    current: list[SealedBox] = []
    size = 0
    for box in boxes:
        if current and size + len(box.box) > budget:
            parts.append(tuple(current))
            current, size = [], 0
        current.append(box)
        size += len(box.box)
    if current:
        parts.append(tuple(current))
    return parts


class SealedKeys(BaseMessage):
    """Agent to coordinator: the boxes of (part of) one `SealRequest` page.

    The coordinator relays each box to its recipient as a `SealedSecretKey`
    (it cannot open them). One message per page instead of one per box keeps
    the agent far below its admission rate at any fleet size; the agent
    splits a page whose boxes would pass `SEALED_KEYS_BUDGET` bytes.
    """

    kind: Literal["sealed_keys"] = "sealed_keys"
    epoch: Count
    page: Count
    boxes: Annotated[
        tuple[SealedBox, ...], Field(min_length=1, max_length=SEAL_PAGE_SIZE)
    ]

    @_model_validator(mode="after")
    def _unique_boxes(self) -> Self:
        unique_entries(tuple(b.recipient for b in self.boxes))
        return self


class AgentPublicKey(BaseMessage):
    """Agent to all (relayed): the epoch's Paillier public key, signed."""

    kind: Literal["agent_public_key"] = "agent_public_key"
    topic: ClassVar[str] = PUBLIC_KEY
    retained: ClassVar[bool] = True
    relay: ClassVar[Relay] = Relay.AGENT
    epoch: Count
    public_key: Annotated[bytes, Field(min_length=1, max_length=4096)]


class SealedSecretKey(BaseMessage):
    """Agent to one device (relayed, unopenable by the coordinator)."""

    kind: Literal["sealed_secret_key"] = "sealed_secret_key"
    relay: ClassVar[Relay] = Relay.AGENT
    epoch: Count
    recipient: DeviceId
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_BOX_BYTES)]
