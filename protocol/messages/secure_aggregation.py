r"""Secure aggregation of model updates on the wire (protocol version 6).

Pairwise masking with dropout recovery (Bonawitz et al., CCS 2017), over a
sparse neighbour graph above a configured K (SecAgg+, Bell et al., CCS
2020). The coordinator relays and sums; it never holds one device's update::

    coordinator -> SecAggSetup (signed: the round's parameters)      -> all
    device      -> SecAggKeys (per-round X25519 keys, signed by the device)
    coordinator -> SecAggRoster (U1, the neighbours' signed keys)    -> each
    device      -> SecAggShares (one sealed box per neighbour)
    coordinator -> SecAggShareBundle (the boxes sealed to it)        -> each
    device      -> MaskedUpdate (its masked contribution, inline or uploaded)
    coordinator -> SecAggUnmask (signed: survivors U3, dropped U2\U3) -> all
    device      -> SecAggUnmaskShares (b-shares of survivors, s-shares of the
                   dropped; never both for one peer)

Every message names the round, the model and the global version it trains
from, so a message of another round or version is refused as such.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field
from pydantic import model_validator as _model_validator
from typing_extensions import Self

from ursa.protocol.messages.base import (
    CONTROL,
    MAX_DEVICES,
    BaseMessage,
    Blob,
    Count,
    DeviceId,
    DeviceList,
    Id,
    Key32,
    Name,
    Positive,
    Signature,
    _Frozen,
    unique_entries,
)
from ursa.protocol.messages.session import DeviceKeys

__all__ = [
    "MAX_SHARE_INDEX",
    "SHARE_BYTES",
    "MaskedUpdate",
    "PeerKeys",
    "RevealedShare",
    "SecAggKeys",
    "SecAggRoster",
    "SecAggSetup",
    "SecAggShareBundle",
    "SecAggShares",
    "SecAggUnmask",
    "SecAggUnmaskShares",
    "ShareBox",
]

SHARE_BYTES = 34
"""A Shamir share of a 32-byte secret (two 17-byte elements of GF(2^130 - 5))."""
MAX_SHARE_INDEX = 0xFFFF
"""Share indices run 1..holders (a device's neighbours and itself)."""
MAX_SHARE_BOX_BYTES = 1024
"""A sealed share pair is about 160 bytes; this bounds what a device may send."""
_PeerList = Annotated[
    tuple[DeviceId, ...],
    Field(max_length=MAX_DEVICES),
    # unique: a device named twice would be masked against twice
]


class _RoundModel(BaseMessage):
    """What every secure-aggregation message names besides the round."""

    model: Name
    model_version: Count


class SecAggSetup(_RoundModel):
    """Coordinator to all: this round sums under masks, with these parameters.

    Signed: the parameters bound what a device adds (``max_examples`` caps its
    weight, ``clip_norm`` its delta) and how much noise it adds, so a device
    acts on them only from the pinned coordinator.
    """

    kind: Literal["secagg_setup"] = "secagg_setup"
    topic: ClassVar[str] = CONTROL
    participants: DeviceList
    """The selected devices asked for keys (U0)."""
    threshold: Positive
    """Fewest survivors whose sum may be unmasked (and Shamir's t)."""
    degree: Positive
    """Neighbours per device in the masking graph (participants - 1: complete)."""
    weighting: Literal["fedavg", "equal", "climb"]
    max_examples: Positive
    clip_norm: Annotated[float, Field(gt=0.0)]
    noise_multiplier: Annotated[float, Field(ge=0.0)] = 0.0
    metrics: bool = True
    """Whether the vector carries the fleet's training metrics (off under DP)."""

    @_model_validator(mode="after")
    def _threshold_fits(self) -> Self:
        if self.threshold > len(self.participants):
            raise ValueError("threshold exceeds the participants")
        if self.degree > max(1, len(self.participants) - 1):
            raise ValueError("degree exceeds the participants")
        return self


class SecAggKeys(_RoundModel):
    """Device to coordinator: its per-round public keys, signed by its identity.

    ``c_public`` seals its shares to peers, ``s_public`` agrees its pairwise
    masks; ``advert_signature`` is its Ed25519 signature over both (and the
    round), which its peers check against its enrolled identity key.
    """

    kind: Literal["secagg_keys"] = "secagg_keys"
    c_public: Key32
    s_public: Key32
    advert_signature: Signature


class PeerKeys(_Frozen):
    """A neighbour's enrolled identity and its signed per-round keys."""

    identity: DeviceKeys
    c_public: Key32
    s_public: Key32
    advert_signature: Signature


class SecAggRoster(_RoundModel):
    """Coordinator to one device: who gave keys (U1) and its neighbours' keys."""

    kind: Literal["secagg_roster"] = "secagg_roster"
    topic: ClassVar[str] = CONTROL
    participants: DeviceList
    peers: Annotated[tuple[PeerKeys, ...], Field(max_length=MAX_DEVICES)]


class ShareBox(_Frozen):
    """One sealed pair of Shamir shares, with the other end's id."""

    peer: DeviceId
    box: Annotated[bytes, Field(min_length=1, max_length=MAX_SHARE_BOX_BYTES)]


class SecAggShares(_RoundModel):
    """Device to coordinator: a box per neighbour (``peer`` = the recipient)."""

    kind: Literal["secagg_shares"] = "secagg_shares"
    boxes: Annotated[tuple[ShareBox, ...], Field(min_length=1, max_length=MAX_DEVICES)]

    @_model_validator(mode="after")
    def _one_box_per_peer(self) -> Self:
        unique_entries(tuple(b.peer for b in self.boxes))
        return self


class SecAggShareBundle(_RoundModel):
    """Coordinator to one device: the boxes sealed to it (``peer`` = the sender).

    Its senders are the device's neighbours that shared (U2 around it): it
    masks against exactly them.
    """

    kind: Literal["secagg_share_bundle"] = "secagg_share_bundle"
    topic: ClassVar[str] = CONTROL
    boxes: Annotated[tuple[ShareBox, ...], Field(max_length=MAX_DEVICES)]

    @_model_validator(mode="after")
    def _one_box_per_peer(self) -> Self:
        unique_entries(tuple(b.peer for b in self.boxes))
        return self


class MaskedUpdate(BaseMessage):
    """Device to coordinator: its masked contribution, inline or as a transfer.

    ``vector`` (or the upload) is the little-endian uint32 ring vector; without
    the other survivors' vectors and the unmasking shares it is uniformly
    random. It replaces `ModelUpdate` in a round that sums securely: no
    example count, no metrics, nothing in the clear.
    """

    kind: Literal["masked_update"] = "masked_update"
    model: Name
    base_version: Count
    transfer_id: Id | None = None
    vector: Blob | None = None

    @_model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.transfer_id is None) == (self.vector is None):
            raise ValueError("give exactly one of transfer_id and vector")
        return self


class SecAggUnmask(_RoundModel):
    """Coordinator to all: whose masked vector counted, and who dropped out.

    Signed, and the same to every survivor: a device checks that at least
    ``threshold`` survived and that no peer is in both lists.
    """

    kind: Literal["secagg_unmask"] = "secagg_unmask"
    topic: ClassVar[str] = CONTROL
    survivors: DeviceList
    dropped: _PeerList = ()

    @_model_validator(mode="after")
    def _disjoint(self) -> Self:
        unique_entries(self.dropped)
        if set(self.survivors) & set(self.dropped):
            raise ValueError("a device cannot both survive and drop out")
        return self


class RevealedShare(_Frozen):
    """One Shamir share a survivor reveals: of ``owner``'s b (survived) or s."""

    owner: DeviceId
    secret: Literal["b", "s"]
    index: Annotated[int, Field(ge=1, le=MAX_SHARE_INDEX)]
    data: Annotated[bytes, Field(min_length=SHARE_BYTES, max_length=SHARE_BYTES)]


class SecAggUnmaskShares(_RoundModel):
    """Device to coordinator: its shares for the unmasking (one per neighbour)."""

    kind: Literal["secagg_unmask_shares"] = "secagg_unmask_shares"
    shares: Annotated[tuple[RevealedShare, ...], Field(max_length=MAX_DEVICES)]

    @_model_validator(mode="after")
    def _one_share_per_owner(self) -> Self:
        unique_entries(tuple(s.owner for s in self.shares))
        return self
