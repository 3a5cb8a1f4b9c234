"""The stratified draw's private inputs on the device: one-time keys, ranks, seed.

Once per key epoch a device sends, with its encrypted registry, a fresh
one-time X25519 public key; the agent seals the registration's rank (and
slot) to it; only this device can open the box. The one-time private key
lives in the device's state (0600) from registration until the rank is
opened, then goes. The shared seed is derived from the epoch's Paillier
secret key, which every registered device holds and the coordinator never
does, so the coordinator cannot compute the quotas nor any device's draw.

Pure helpers, no I/O: the `Dubhe` method keeps the state.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity

__all__ = [
    "ONE_TIME_ID",
    "RankError",
    "new_one_time_key",
    "one_time_identity",
    "one_time_public",
    "open_rank_plaintext",
    "rank_context",
    "rank_plaintext",
    "shared_seed",
    "slot_of",
]

ONE_TIME_ID = "rank"
"""The id side of a one-time identity in the sealing transcript (no device's)."""

_ED25519_FILLER = Ed25519PrivateKey.from_private_bytes(
    hashlib.sha256(b"ursa one-time rank key: never signs").digest()
)
"""A public, fixed Ed25519 half: a sealed box's transcript names both keys of
an identity, and a one-time key only needs the X25519 one."""

_RANK = struct.Struct(">II")


class RankError(ValueError):
    """A rank box, registry entry or one-time key that does not fit."""


def new_one_time_key() -> bytes:
    """Fresh X25519 private key bytes (one key epoch's)."""
    return X25519PrivateKey.generate().private_bytes_raw()


def one_time_identity(private: bytes) -> DeviceIdentity:
    """The identity that opens boxes sealed to ``one_time_public(private)``."""
    return DeviceIdentity(
        ONE_TIME_ID, X25519PrivateKey.from_private_bytes(private), _ED25519_FILLER
    )


def one_time_public(key: bytes) -> DevicePublicIdentity:
    """The recipient the agent seals to, from the 32-byte one-time public key."""
    filler = _ED25519_FILLER.public_key().public_bytes_raw()
    return DevicePublicIdentity(ONE_TIME_ID, key, filler)


def rank_context(federation: str, epoch: int) -> bytes:
    """What a sealed rank is bound to (federation, key epoch, purpose)."""
    return f"ursa-rank|{federation}|{epoch}".encode()


def rank_plaintext(slot: int, rank: int) -> bytes:
    """The sealed content: the registration's slot and its rank within it."""
    return _RANK.pack(slot, rank)


def open_rank_plaintext(plaintext: bytes) -> tuple[int, int]:
    """(slot, rank) from an opened box."""
    if len(plaintext) != _RANK.size:
        raise RankError(f"a rank is {_RANK.size} bytes, got {len(plaintext)}")
    slot, rank = _RANK.unpack(plaintext)
    return int(slot), int(rank)


def slot_of(registry: NDArray[np.integer]) -> int:
    """The slot of a decrypted one-hot registry.

    Raises:
        RankError: not exactly one 1 among 0s.
    """
    r = np.asarray(registry)
    if r.ndim != 1 or int(r.sum()) != 1 or int(np.count_nonzero(r)) != 1:
        raise RankError("a registry that is not one-hot")
    return int(np.flatnonzero(r)[0])


def shared_seed(secret_key: bytes, federation: str, epoch: int) -> int:
    """The epoch's shared seed in ``[0, 2**63)``, from its Paillier secret key."""
    digest = hashlib.sha256(
        b"ursa stratified seed|"
        + federation.encode()
        + b"|"
        + str(epoch).encode()
        + b"|"
        + secret_key
    ).digest()
    return int.from_bytes(digest[:8], "big") >> 1
