"""FLICKER's wire contract: CKKS context, ring, localisation, resampling, redundancy.

The global redundancy test travels as sealed encrypted candidates and masked
signed products; the coordinator decrypts only blinded signs.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    CKKS_CONTEXT,
    MAX_CHUNK_COUNT,
    MAX_DEVICES,
    BaseMessage,
    Blob,
    Count,
    DeviceId,
    DeviceList,
    Id,
    Positive,
    RelayedFrom,
    unique_entries,
)
from ursa.protocol.messages.session import DeviceKeys


class CkksContextAnnounce(BaseMessage):
    """Coordinator to all: the CKKS public context (no Galois keys) to fetch."""

    kind: Literal["ckks_context"] = "ckks_context"
    topic: ClassVar[str] = CKKS_CONTEXT
    retained: ClassVar[bool] = True
    transfer_id: Id


class RingStart(BaseMessage):
    """Coordinator to ring members: the ring order (at least 3 devices).

    It carries the members' enrolled identity keys (each device seals its hop
    to its successor's) and the coordinator's signature over them, which a
    device checks against the pinned coordinator identity (the simulations'
    devices check it too). Without members a device must know its peers
    already; a device that requires them refuses such a start.
    """

    kind: Literal["ring_start"] = "ring_start"
    ring_id: Id
    order: Annotated[DeviceList, Field(min_length=3)]
    hop_deadline_s: Annotated[float, Field(gt=0.0)]
    members: Annotated[tuple[DeviceKeys, ...], Field(max_length=MAX_DEVICES)] = ()


class RingHop(BaseMessage):
    """Device to next device via the coordinator: running Enc(counts), sealed."""

    kind: Literal["ring_hop"] = "ring_hop"
    relay: ClassVar[RelayedFrom] = RelayedFrom.PEER
    ring_id: Id
    hop_index: Count
    recipient: DeviceId
    contributors: DeviceList
    box: Blob


class RingResult(BaseMessage):
    """Last ring device to coordinator: Enc(global counts)."""

    kind: Literal["ring_result"] = "ring_result"
    ring_id: Id
    contributors: DeviceList
    total: Blob


class _FlickerStep(BaseMessage):
    """Fields of a correction step: the run (its ring id) and the step number.

    A reply repeats both from its request, so one late from an earlier step
    or an earlier run is recognised (`round` stays the federation's round).
    """

    run_id: Id
    step: Positive


class CosineRequest(_FlickerStep):
    """Coordinator to devices: Enc(global distribution) for masked cosine."""

    kind: Literal["cosine_request"] = "cosine_request"
    ciphertext: Blob


class CosineReply(_FlickerStep):
    """Device to coordinator: Enc(GD) * unit vector + zero-sum mask."""

    kind: Literal["cosine_reply"] = "cosine_reply"
    masked_product: Blob


class ResampleRequest(_FlickerStep):
    """Coordinator to the dominant device: resample until LI >= nabla_client."""

    kind: Literal["resample_request"] = "resample_request"
    nabla_client: Annotated[float, Field(gt=0.0, le=1.0)]


class CountUpdate(_FlickerStep):
    """Dominant device to coordinator: Enc(count change); saturated if done."""

    kind: Literal["count_update"] = "count_update"
    delta: Blob
    saturated: bool


MAX_REDUNDANCY_CIPHERTEXTS = 2
"""Candidate ciphertexts in one redundancy offer (two fresh CKKS ciphertexts,
~660 KB sealed, fit one `Blob`)."""


REDUNDANCY_SCALE_BITS = 20
"""Block sums of a `RedundancyReply` are ``s * sign * (cosine - eta)`` with a
secret ``1 <= s < 2^REDUNDANCY_SCALE_BITS``: magnitudes stay below
``2^(REDUNDANCY_SCALE_BITS + 1)`` (the coordinator refuses larger ones)."""


def _power_of_two(value: int) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f"must be a power of two, got {value}")
    return value


PowerOfTwo = Annotated[int, Field(ge=1, le=1 << 24), AfterValidator(_power_of_two)]


Peers = Annotated[
    tuple[DeviceId, ...], Field(max_length=MAX_DEVICES), AfterValidator(unique_entries)
]


class _RedundancyLayout(_FlickerStep):
    """How candidate feature vectors are packed.

    See `ursa.edge_sdk.methods.flicker.global_redundancy`.

    Each of ``ciphertexts`` candidate ciphertexts holds ``per_ciphertext``
    candidates, each repeated over ``slots / (block_slots * per_ciphertext)``
    blocks of ``block_slots`` slots.
    """

    block_slots: PowerOfTwo
    per_ciphertext: PowerOfTwo
    ciphertexts: Annotated[int, Field(ge=1, le=MAX_REDUNDANCY_CIPHERTEXTS)]


class RedundancyOffer(_RedundancyLayout):
    """Dominant device to coordinator: its encrypted candidates, sealed to one peer.

    ``recipients`` names every peer of this global redundancy test (one offer
    each), so the coordinator knows when all have answered.
    """

    kind: Literal["redundancy_offer"] = "redundancy_offer"
    recipient: DeviceId
    recipients: DeviceList
    box: Blob

    @_model_validator(mode="after")
    def _addressed(self) -> Self:
        if self.recipient not in self.recipients:
            raise ValueError("recipient must be one of recipients")
        if self.sender in self.recipients:
            raise ValueError("the dominant device cannot be its own peer")
        return self


class RedundancyAsk(_RedundancyLayout):
    """Coordinator to a peer: ``origin``'s sealed candidates; reply with products.

    ``vector_slots`` (chosen by the coordinator from the global counts, never
    from the peer's) is how many feature vectors every peer's reply covers.
    """

    kind: Literal["redundancy_ask"] = "redundancy_ask"
    origin: DeviceId
    vector_slots: PowerOfTwo
    box: Blob


class RedundancyReply(_FlickerStep):
    """Peer to coordinator: one ciphertext of signed, masked products.

    Part 0 also carries ``box``, sealed to the dominant device (the coordinator
    relays it unopened).
    """

    kind: Literal["redundancy_reply"] = "redundancy_reply"
    part: Count
    parts: Annotated[int, Field(ge=1, le=MAX_CHUNK_COUNT)]
    products: Blob
    box: Blob | None = None

    @_model_validator(mode="after")
    def _box_in_part_zero(self) -> Self:
        if self.part >= self.parts:
            raise ValueError("part must be < parts")
        if (self.part == 0) != (self.box is not None):
            raise ValueError("part 0, and only part 0, carries the box")
        return self


class RedundancyResult(_FlickerStep):
    """Coordinator to the dominant device: one peer's decrypted sign bits.

    ``peers`` lists every peer that answered in time (one message each, in
    that order); with none, a single message without ``peer``.
    """

    kind: Literal["redundancy_result"] = "redundancy_result"
    peers: Peers
    vector_slots: PowerOfTwo
    peer: DeviceId | None = None
    box: Blob | None = None
    signs: Blob | None = None

    @_model_validator(mode="after")
    def _one_peer(self) -> Self:
        present = [v is not None for v in (self.peer, self.box, self.signs)]
        if any(present) != all(present):
            raise ValueError("give peer, box and signs together")
        if (self.peer is None) != (not self.peers):
            raise ValueError("name a peer of peers, or none when peers is empty")
        if self.peer is not None and self.peer not in self.peers:
            raise ValueError("peer must be one of peers")
        return self
