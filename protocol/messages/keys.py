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
    RelayedFrom,
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


MAX_SPEC_TENSORS = 4096
"""Most tensors a signed `ModelSpec` lists (a ResNet-152's state dict has ~900)."""
MAX_TENSOR_NAME = 256
"""Longest tensor name in a `ModelSpec`."""
MAX_SPEC_NAME_CHARS = 128 * 1024
"""Most characters all of a spec's tensor names take together, so a spec is at
most about 400 KiB (4096 tensors of 8 dimensions), within the payload cap."""
MAX_TENSOR_DIMS = 8
MAX_DIMENSION = 2**32 - 1
MAX_SPEC_VALUES = 2**36
"""Most values all of a spec's tensors hold together (a device checks its
model against the spec without allocating any of them)."""


class ModelTensor(_Frozen):
    """One tensor of a `ModelSpec` (not a message): its name, shape and kind.

    ``kind`` is ``"float"`` or ``"int"`` (an integer buffer such as BatchNorm's
    ``num_batches_tracked``), as `ursa.models.spec.tensor_spec` names them.
    """

    name: Annotated[str, Field(min_length=1, max_length=MAX_TENSOR_NAME)]
    shape: Annotated[
        tuple[Annotated[int, Field(ge=0, le=MAX_DIMENSION)], ...],
        Field(max_length=MAX_TENSOR_DIMS),
    ]
    kind: Literal["float", "int"]


class ModelSpec(_Frozen):
    """The global model's tensors, in order (not a message): what a device checks.

    Signed into `KeyEpochStart`, so a device whose own model does not fit
    (another architecture, another class count) sits the epoch out before
    any selection, naming the first tensor that differs, instead of being
    selected and failing. ``model`` is the model's wire name (a device
    compares only a spec of the model it trains).
    """

    model: Name
    tensors: Annotated[
        tuple[ModelTensor, ...], Field(min_length=1, max_length=MAX_SPEC_TENSORS)
    ]

    @_model_validator(mode="after")
    def _bounded(self) -> Self:
        unique_entries(tuple(t.name for t in self.tensors))
        if sum(len(t.name) for t in self.tensors) > MAX_SPEC_NAME_CHARS:
            raise ValueError(f"tensor names longer than {MAX_SPEC_NAME_CHARS} in all")
        values = 0
        for tensor in self.tensors:
            size = 1
            for dim in tensor.shape:
                size *= dim
            values += size
        if values > MAX_SPEC_VALUES:
            raise ValueError(f"the tensors hold more than {MAX_SPEC_VALUES} values")
        return self

    @classmethod
    def of(
        cls, model: str, tensors: tuple[tuple[str, tuple[int, ...], str], ...]
    ) -> ModelSpec:
        """The spec of ``model`` from its (name, shape, kind) triples.

        Raises:
            pydantic.ValidationError: a model past the bounds above.
        """
        return cls(
            model=model,
            tensors=tuple(
                ModelTensor(name=n, shape=s, kind="int" if k == "int" else "float")
                for n, s, k in tensors
            ),
        )

    def triples(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        """The (name, shape, kind) triples (`ursa.models.spec.TensorSpec`)."""
        return tuple((t.name, t.shape, t.kind) for t in self.tensors)


class KeyEpochStart(BaseMessage):
    """Coordinator to all: a new key epoch, its agent and registry parameters.

    `agent_keys` are the agent's enrolled identity keys: devices verify the
    agent's signed `AgentPublicKey` and open its `SealedSecretKey` with them.
    `methods` names the methods the federation runs on its devices (signed
    with the rest), so a device configured for other ones refuses the epoch
    with `method_mismatch` instead of silently skipping their steps;
    `method_settings` carries the values those methods' device halves take
    from the coordinator (FedProx's ``mu``), signed with the rest.
    `model_spec` is the global model's tensor spec (None: the federation
    trains no model, or its model is past `ModelSpec`'s bounds): every device
    checks its own model against it before it registers.
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
    model_spec: ModelSpec | None = None

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
    relay: ClassVar[RelayedFrom] = RelayedFrom.AGENT
    epoch: Count
    public_key: Annotated[bytes, Field(min_length=1, max_length=4096)]


class SealedSecretKey(BaseMessage):
    """Agent to one device (relayed, unopenable by the coordinator)."""

    kind: Literal["sealed_secret_key"] = "sealed_secret_key"
    relay: ClassVar[RelayedFrom] = RelayedFrom.AGENT
    epoch: Count
    recipient: DeviceId
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_BOX_BYTES)]
