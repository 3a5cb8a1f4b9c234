"""The device side of secure aggregation: one round's keys, shares, mask and reveals.

A `MaskingParticipant` is one device in one round of pairwise-masked secure
aggregation (Bonawitz et al., CCS 2017, with the SecAgg+ neighbour graph of
Bell et al., CCS 2020). It is a pure state machine: the caller moves its
outputs over the wire and feeds it what the coordinator relays::

    KEYS --advertise--> ADVERTISED --share--> SHARED --receive_shares-->
    RECEIVED --mask--> MASKED --unmask (repeatable, consistent)--> MASKED

Per round it draws fresh X25519 keys ``c`` (encrypts share boxes) and ``s``
(agrees pairwise mask seeds) and a 32-byte self-mask seed ``b``; nothing is
reused across rounds. The advert (both public keys) is signed with the
device's Ed25519 identity over `advert_transcript`.

Share box from u to v (version 1)::

    box        = 0x01 | nonce (12) | ChaCha20-Poly1305(plaintext) + tag (16)
    plaintext  = 0x01 | index (2, big-endian) | share of s_u (34) | share of b_u (34)
    key        = HKDF-SHA256(X25519(c_u, c_v.pub), salt = none, info = transcript)
    AAD        = 0x01 | nonce | transcript
    transcript = "ursa-secagg-box-v1" | lp(federation) | lp(run) | round (8, BE)
                 | lp(u) | lp(v) | lp(c_u.pub) | lp(c_v.pub)   (lp: 4-byte BE length)

``index`` is v's position (1-based) in ``share_holders(graph, u)``, i.e. in
sorted(N(u) + u); the recipient checks it. A device asks the round's
`NeighbourRing` only for its own neighbourhood and its index among each
sender's holders: its work grows with the degree, not with K. The masked input is
``y = x + PRG(b_u) + sum_{v in N(u) ∩ U2, v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)``
(mod 2^32; ids compare as Python strings), U2 ∩ N(u) being the neighbours whose
boxes reached u.

Security rules enforced here: a mask is used for one vector only; a device
never reveals both b and s shares of one peer (that would let the coordinator
unmask that peer's input); it reveals nothing when fewer than ``threshold``
devices are said to survive, when it is not itself among them, or when the
lists disagree with the neighbours that shared with it. Not done here: the
Bonawitz consistency round (devices cross-signing the survivor list), so a
coordinator that shows different survivor lists to different devices is
limited only by the per-neighbourhood share threshold.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from numpy.typing import NDArray

from ursa._compat import StrEnum
from ursa.crypto.errors import CryptoError, IdentityFormatError, SignatureError
from ursa.crypto.identity import (
    DeviceIdentity,
    DevicePublicIdentity,
    validate_device_id,
    verify_signature,
)
from ursa.crypto.mask_stream import (
    PAIR_MASK_LABEL,
    SELF_MASK_LABEL,
    Mask,
    apply_masks,
    pair_context,
    pairwise_seed,
)
from ursa.crypto.neighbour_graph import NeighbourRing, graph_seed, share_threshold
from ursa.crypto.shamir import (
    SecretKind,
    Share,
    ShareError,
    UnmaskShare,
    share_bytes,
    split_secret,
)
from ursa.protocol.secure_aggregation import advert_transcript

__all__ = [
    "KEY_BYTES",
    "SHARE_BOX_BYTES",
    "KeyAdvert",
    "MaskingParticipant",
    "ParticipantStage",
    "PeerAdvert",
    "SecAggError",
    "UnmaskShare",
    "advert_transcript",
]

KEY_BYTES = 32
_SIGNATURE_BYTES = 64
_SECRET_BYTES = 32
_VERSION = 1
_NONCE_BYTES = 12
_TAG_BYTES = 16
_BOX_LABEL = b"ursa-secagg-box-v1"
_SHARE_BYTES = share_bytes(_SECRET_BYTES)
_PLAINTEXT_BYTES = 1 + 2 + 2 * _SHARE_BYTES
SHARE_BOX_BYTES = 1 + _NONCE_BYTES + _PLAINTEXT_BYTES + _TAG_BYTES
"""Every share box is this long (100 bytes)."""


class SecAggError(CryptoError):
    """The participant refuses: a bad advert or box, a wrong stage, an unsafe reveal."""


class ParticipantStage(StrEnum):
    """Where a participant is in its round."""

    KEYS = "keys"
    ADVERTISED = "advertised"
    SHARED = "shared"
    RECEIVED = "received"
    MASKED = "masked"


@dataclass(frozen=True)
class KeyAdvert:
    """A device's public round keys and its identity signature over them.

    Wire form: ``c_public (32) | s_public (32) | signature (64)``.
    """

    c_public: bytes
    s_public: bytes
    signature: bytes

    def __post_init__(self) -> None:
        _check_key("c_public", self.c_public)
        _check_key("s_public", self.s_public)
        if not isinstance(self.signature, bytes) or len(self.signature) != 64:
            raise SecAggError(f"advert signature must be {_SIGNATURE_BYTES} bytes")

    def to_bytes(self) -> bytes:
        """The 128-byte wire form."""
        return self.c_public + self.s_public + self.signature

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyAdvert:
        """Decode `to_bytes`; raises `SecAggError` on a wrong length."""
        if not isinstance(data, bytes | bytearray) or len(data) != 128:
            raise SecAggError("a key advert is 128 bytes")
        data = bytes(data)
        return cls(data[:32], data[32:64], data[64:])


@dataclass(frozen=True)
class PeerAdvert:
    """A neighbour's advert as relayed by the coordinator, with its identity.

    Wire form: ``identity.to_bytes() | c_public | s_public | signature``.
    """

    identity: DevicePublicIdentity
    c_public: bytes
    s_public: bytes
    signature: bytes

    def __post_init__(self) -> None:
        KeyAdvert(self.c_public, self.s_public, self.signature)

    @classmethod
    def of(cls, identity: DevicePublicIdentity, advert: KeyAdvert) -> PeerAdvert:
        """Pair a device's public identity with the advert it sent."""
        return cls(identity, advert.c_public, advert.s_public, advert.signature)

    def advert(self) -> KeyAdvert:
        """The advert without the identity."""
        return KeyAdvert(self.c_public, self.s_public, self.signature)

    def to_bytes(self) -> bytes:
        """Identity bytes followed by the 128-byte advert."""
        return self.identity.to_bytes() + self.advert().to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerAdvert:
        """Decode `to_bytes`; raises `SecAggError` when malformed."""
        if not isinstance(data, bytes | bytearray) or len(data) < 2:
            raise SecAggError("peer advert is truncated")
        data = bytes(data)
        split = 2 + data[1] + 2 * KEY_BYTES
        try:
            identity = DevicePublicIdentity.from_bytes(data[:split])
        except IdentityFormatError as exc:
            raise SecAggError(f"peer advert identity: {exc}") from exc
        advert = KeyAdvert.from_bytes(data[split:])
        return cls.of(identity, advert)


class MaskingParticipant:
    """One device's secure-aggregation state for one round (see the module doc)."""

    def __init__(
        self,
        *,
        identity: DeviceIdentity,
        federation: str,
        run: str,
        round_index: int,
        threshold: int,
        degree: int,
        rng: Callable[[int], bytes] | None = None,
    ) -> None:
        """Draw the round's keys and self-mask seed.

        Args:
            identity: the device's long-term identity; signs the advert.
            federation: federation id, bound into every transcript.
            run: run id, bound into every transcript.
            round_index: the round, bound into every transcript.
            threshold: the round's threshold t (least survivors to unmask).
            degree: configured graph degree (>= K - 1: complete graph).
            rng: random-bytes source for c, s and b; `os.urandom` by default.
                Only tests pass another (to make keys reproducible).
        """
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, not {threshold}")
        if degree < 0:
            raise ValueError(f"degree must be >= 0, not {degree}")
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, not {round_index}")
        random_bytes = os.urandom if rng is None else rng
        self._identity = identity
        self._federation = federation
        self._run = run
        self._round = round_index
        self._threshold = threshold
        self._degree = degree
        self._c = X25519PrivateKey.from_private_bytes(_draw(random_bytes))
        self._s = X25519PrivateKey.from_private_bytes(_draw(random_bytes))
        self._b = _draw(random_bytes)
        self._c_public = self._c.public_key().public_bytes_raw()
        self._s_public = self._s.public_key().public_bytes_raw()
        self._stage = ParticipantStage.KEYS
        self._box_label = _framed(  # every box transcript starts with the round's
            _BOX_LABEL,
            federation.encode(),
            run.encode(),
            struct.pack(">Q", round_index),
        )
        self._ring = NeighbourRing((), 0, b"")
        self._neighbours: tuple[str, ...] = ()
        self._peers: dict[str, PeerAdvert] = {}
        self._share_threshold = 0
        self._own_share: tuple[int, bytes, bytes] = (0, b"", b"")
        self._received: dict[str, tuple[int, bytes, bytes]] = {}
        self._masked_digest = b""
        self._revealed: dict[str, SecretKind] = {}
        self._c_secrets: dict[bytes, bytes] = {}

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._identity.device_id

    @property
    def stage(self) -> ParticipantStage:
        """The last step completed."""
        return self._stage

    def advertise(self) -> KeyAdvert:
        """The signed public round keys (the same advert on every call)."""
        if self._stage not in (ParticipantStage.KEYS, ParticipantStage.ADVERTISED):
            raise SecAggError(f"cannot advertise at stage {self._stage}")
        signature = self._identity.sign(
            advert_transcript(
                self._federation,
                self._run,
                self._round,
                self.device_id,
                self._c_public,
                self._s_public,
            )
        )
        self._stage = ParticipantStage.ADVERTISED
        return KeyAdvert(self._c_public, self._s_public, signature)

    def share(
        self, roster: Sequence[PeerAdvert], participants: Sequence[str]
    ) -> list[tuple[str, bytes]]:
        """Verify the neighbours' adverts and seal one share box to each.

        Args:
            roster: adverts of (at least) this device's neighbours; others are
                ignored, this device's own must match its keys.
            participants: every device that answered SA1 (U1), this one included;
                the graph is built from them.

        Returns:
            ``(recipient, box)`` per neighbour, sorted by recipient.

        Raises:
            SecAggError: wrong stage, fewer participants than the threshold, a
                missing, duplicate or badly signed neighbour advert.
        """
        self._require(ParticipantStage.ADVERTISED, "share")
        ring = self._checked_participants(participants)
        try:
            threshold_n = share_threshold(self._threshold, len(ring), self._degree)
        except ValueError as exc:
            raise SecAggError(str(exc)) from exc
        holders = ring.share_holders(self.device_id)
        mine = tuple(v for v in holders if v != self.device_id)
        peers = self._checked_roster(roster, ring, mine)
        # One split of s || b: a share of it is the share of s then that of b
        # (the blocks' polynomials are independent), in one pass over the holders.
        shares = split_secret(
            _raw_private(self._s) + self._b, threshold_n, len(holders)
        )
        boxes: list[tuple[str, bytes]] = []
        for holder, share in zip(holders, shares, strict=True):
            if holder == self.device_id:
                self._own_share = (
                    share.index,
                    share.data[:_SHARE_BYTES],
                    share.data[_SHARE_BYTES:],
                )
                continue
            plaintext = bytes([_VERSION]) + struct.pack(">H", share.index) + share.data
            boxes.append((holder, self._seal(peers[holder], plaintext)))
        self._ring = ring
        self._neighbours = mine
        self._peers = peers
        self._share_threshold = threshold_n
        self._stage = ParticipantStage.SHARED
        return boxes

    def receive_shares(self, boxes: Sequence[tuple[str, bytes]]) -> None:
        """Open the boxes the neighbours in U2 sealed to this device.

        The senders become this device's view of N(u) ∩ U2: the peers it
        masks with and whose shares it may reveal. Nothing changes on error.

        Raises:
            SecAggError: wrong stage, a box from a non-neighbour or twice from
                one, a tampered or misaddressed box, or too few neighbours left
                to ever rebuild this device's secrets.
        """
        self._require(ParticipantStage.SHARED, "receive shares")
        received: dict[str, tuple[int, bytes, bytes]] = {}
        for sender, box in boxes:
            if sender not in self._peers:
                raise SecAggError(f"share box from {sender!r}, not a neighbour")
            if sender in received:
                raise SecAggError(f"two share boxes from {sender!r}")
            received[sender] = self._open(sender, box)
        if len(received) + 1 < self._share_threshold:
            raise SecAggError(
                f"only {len(received)} neighbours shared: {self._share_threshold - 1} "
                "needed for this device's secrets to be recoverable"
            )
        self._received = received
        self._stage = ParticipantStage.RECEIVED

    def mask(self, vector: NDArray[np.uint32]) -> NDArray[np.uint32]:
        """Mask the encoded contribution; once per round.

        A repeated call with the identical vector returns the identical
        masked vector (a retransmission reveals nothing new); any other
        vector is refused, since two vectors under one mask leak their
        difference.

        Raises:
            ValueError: not a 1-D uint32 array.
            SecAggError: wrong stage, or a second, different vector.
        """
        if self._stage not in (ParticipantStage.RECEIVED, ParticipantStage.MASKED):
            raise SecAggError(f"cannot mask at stage {self._stage}")
        if (
            not isinstance(vector, np.ndarray)
            or vector.dtype != np.uint32
            or vector.ndim != 1
        ):
            raise ValueError("mask() takes a 1-D numpy uint32 vector")
        digest = hashlib.sha256(
            struct.pack(">Q", vector.size) + np.ascontiguousarray(vector).tobytes()
        ).digest()
        if self._stage is ParticipantStage.MASKED and digest != self._masked_digest:
            raise SecAggError("this round's mask was already used for another vector")
        masks = [Mask(self._b, SELF_MASK_LABEL)]
        for peer in sorted(self._received):
            context = pair_context(
                self._federation, self._run, self._round, self.device_id, peer
            )
            try:
                seed = pairwise_seed(self._s, self._peers[peer].s_public, context)
            except CryptoError as exc:
                raise SecAggError(f"pairwise key with {peer!r}: {exc}") from exc
            masks.append(Mask(seed, PAIR_MASK_LABEL, subtract=peer < self.device_id))
        masked = np.array(vector, dtype=np.uint32, copy=True)
        apply_masks(masked, masks)
        self._masked_digest = digest
        self._stage = ParticipantStage.MASKED
        return masked

    def unmask(
        self, survivors: Collection[str], dropped: Collection[str]
    ) -> list[UnmaskShare]:
        """Reveal, per neighbour in U2 and self, the b share (survived) or s share.

        Args:
            survivors: U3, devices whose masked input counted.
            dropped: U2 minus U3, devices that shared but whose input did not.

        Returns:
            One `UnmaskShare` per owner in N(u) ∩ U2 plus this device, by owner.

        Raises:
            SecAggError: wrong stage; fewer survivors than the threshold; the
                lists overlap, omit this device or name a non-participant;
                they disagree with the neighbours that shared with this
                device; or a reveal contradicts an earlier one.
        """
        self._require(ParticipantStage.MASKED, "unmask")
        alive, gone = set(survivors), set(dropped)
        if alive & gone:
            raise SecAggError(f"survivors and dropped overlap: {sorted(alive & gone)}")
        if len(alive) < self._threshold:
            raise SecAggError(
                f"{len(alive)} survivors, fewer than the threshold {self._threshold}"
            )
        if self.device_id not in alive:
            raise SecAggError("this device is not among the survivors")
        strangers = {u for u in alive | gone if u not in self._ring}
        if strangers:
            raise SecAggError(f"not participants of this round: {sorted(strangers)}")
        shared = set(self._received)
        claimed = (alive | gone) & set(self._neighbours)
        if claimed != shared:
            raise SecAggError(
                f"neighbours that never shared with this device: "
                f"{sorted(claimed - shared)}; neighbours that shared but are "
                f"neither survivor nor dropped: {sorted(shared - claimed)}"
            )
        kinds: dict[str, SecretKind] = {
            owner: "b" if owner in alive else "s" for owner in (*shared, self.device_id)
        }
        for owner, kind in kinds.items():
            earlier = self._revealed.get(owner)
            if earlier is not None and earlier != kind:
                status = "survived" if earlier == "b" else "dropped"
                raise SecAggError(
                    f"{owner!r} was revealed as {status} before: "
                    "never both secrets of one device"
                )
        self._revealed.update(kinds)
        held = {**self._received, self.device_id: self._own_share}
        reveals = []
        for owner in sorted(kinds):
            index, s_data, b_data = held[owner]
            data = b_data if kinds[owner] == "b" else s_data
            reveals.append(UnmaskShare(owner, kinds[owner], Share(index, data)))
        return reveals

    def _require(self, stage: ParticipantStage, action: str) -> None:
        if self._stage is not stage:
            raise SecAggError(f"cannot {action} at stage {self._stage}")

    def _checked_participants(self, participants: Sequence[str]) -> NeighbourRing:
        """The round's ring, once every participant id is checked (once)."""
        try:
            for device_id in participants:
                validate_device_id(device_id)
            ring = NeighbourRing(
                participants,
                self._degree,
                graph_seed(self._federation, self._run, self._round),
            )
        except (IdentityFormatError, ValueError) as exc:
            raise SecAggError(str(exc)) from exc
        if self.device_id not in ring:
            raise SecAggError("this device is not among the participants")
        if len(ring) < self._threshold:
            raise SecAggError(
                f"{len(ring)} participants, fewer than the threshold {self._threshold}"
            )
        return ring

    def _checked_roster(
        self,
        roster: Sequence[PeerAdvert],
        ring: NeighbourRing,
        mine: tuple[str, ...],
    ) -> dict[str, PeerAdvert]:
        by_id: dict[str, PeerAdvert] = {}
        for advert in roster:
            device_id = advert.identity.device_id
            if device_id in by_id:
                raise SecAggError(f"two adverts for {device_id!r}")
            if device_id not in ring:
                raise SecAggError(f"advert of {device_id!r}, not a participant")
            by_id[device_id] = advert
        own = by_id.pop(self.device_id, None)
        if own is not None and (own.c_public, own.s_public) != (
            self._c_public,
            self._s_public,
        ):
            raise SecAggError("the roster carries other keys for this device")
        peers: dict[str, PeerAdvert] = {}
        for device_id in mine:
            peer = by_id.get(device_id)
            if peer is None:
                raise SecAggError(f"no advert for neighbour {device_id!r}")
            transcript = advert_transcript(
                self._federation,
                self._run,
                self._round,
                device_id,
                peer.c_public,
                peer.s_public,
            )
            try:
                verify_signature(peer.identity, transcript, peer.signature)
            except SignatureError as exc:
                raise SecAggError(f"advert of {device_id!r}: {exc}") from exc
            peers[device_id] = peer
        return peers

    def _box_key(
        self, peer: PeerAdvert, sender: str, recipient: str
    ) -> tuple[bytes, bytes]:
        own_is_sender = sender == self.device_id
        c_sender = self._c_public if own_is_sender else peer.c_public
        c_recipient = peer.c_public if own_is_sender else self._c_public
        transcript = _framed(
            self._box_label, sender.encode(), recipient.encode(), c_sender, c_recipient
        )
        secret = self._c_secrets.get(peer.c_public)
        if secret is None:  # one exchange per peer serves both directions
            try:
                secret = self._c.exchange(
                    X25519PublicKey.from_public_bytes(peer.c_public)
                )
            except ValueError as exc:
                raise SecAggError(
                    f"share key with {peer.identity.device_id!r}: {exc}"
                ) from exc
            self._c_secrets[peer.c_public] = secret
        key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=transcript
        ).derive(secret)
        return key, transcript

    def _seal(self, peer: PeerAdvert, plaintext: bytes) -> bytes:
        key, transcript = self._box_key(peer, self.device_id, peer.identity.device_id)
        header = bytes([_VERSION]) + os.urandom(_NONCE_BYTES)
        return header + ChaCha20Poly1305(key).encrypt(
            header[1:], plaintext, header + transcript
        )

    def _open(self, sender: str, box: bytes) -> tuple[int, bytes, bytes]:
        if not isinstance(box, bytes) or len(box) != SHARE_BOX_BYTES:
            raise SecAggError(
                f"share box from {sender!r} is not {SHARE_BOX_BYTES} bytes"
            )
        if box[0] != _VERSION:
            raise SecAggError(f"unknown share box version {box[0]} from {sender!r}")
        key, transcript = self._box_key(self._peers[sender], sender, self.device_id)
        header = box[: 1 + _NONCE_BYTES]
        try:
            plaintext = ChaCha20Poly1305(key).decrypt(
                header[1:], box[len(header) :], header + transcript
            )
        except InvalidTag as exc:
            raise SecAggError(
                f"share box from {sender!r} does not open: tampered or misaddressed"
            ) from exc
        if len(plaintext) != _PLAINTEXT_BYTES or plaintext[0] != _VERSION:
            raise SecAggError(f"malformed share box plaintext from {sender!r}")
        (index,) = struct.unpack(">H", plaintext[1:3])
        expected = self._ring.share_index(sender, self.device_id)
        if index != expected:
            raise SecAggError(
                f"share box from {sender!r} carries index {index}, expected {expected}"
            )
        try:
            Share(index, plaintext[3:])
        except ShareError as exc:  # pragma: no cover - lengths fixed above
            raise SecAggError(str(exc)) from exc
        return index, plaintext[3 : 3 + _SHARE_BYTES], plaintext[3 + _SHARE_BYTES :]


def _framed(label: bytes, *parts: bytes) -> bytes:
    return label + b"".join(struct.pack(">I", len(part)) + part for part in parts)


def _draw(random_bytes: Callable[[int], bytes]) -> bytes:
    value = random_bytes(_SECRET_BYTES)
    if not isinstance(value, bytes) or len(value) != _SECRET_BYTES:
        raise ValueError(f"rng must return {_SECRET_BYTES} bytes")
    return value


def _raw_private(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _check_key(name: str, key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise SecAggError(f"{name} must be {KEY_BYTES} bytes")
