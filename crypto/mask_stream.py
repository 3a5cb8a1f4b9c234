"""Pseudorandom uint32 masks for secure aggregation, and the pairwise mask seed.

A mask is the ChaCha20 keystream under a key derived from a 32-byte seed, read
as little-endian uint32: ``mask_stream(seed, n, label)`` is the same on every
machine, so the coordinator can regenerate and remove exactly the mask a device
added once it learns the seed. The key is ``HKDF-SHA256(seed, info =
"ursa-secagg-mask-v1|" + label)`` and the nonce is zero: every (seed, label)
pair is used for one stream only, and the seeds are fresh every round, so no
keystream is ever reused. The label separates the self mask (`SELF_MASK_LABEL`)
from the pairwise masks (`PAIR_MASK_LABEL`) even if a seed were to repeat.

The pairwise seed of devices u and v is ``HKDF-SHA256(X25519(s_u, s_v.pub),
info = "ursa-secagg-pair-v1|" + context)`` with `pair_context` binding the
federation, run, round and the unordered pair: both ends derive the same seed
and nobody else can (the s keys are fresh per round and never leave a device
except as Shamir shares of a device declared dropped).
"""

from __future__ import annotations

import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from ursa.crypto.errors import CryptoError, KeyFormatError

__all__ = [
    "PAIR_MASK_LABEL",
    "SEED_BYTES",
    "SELF_MASK_LABEL",
    "mask_stream",
    "pair_context",
    "pairwise_seed",
]

SEED_BYTES = 32
SELF_MASK_LABEL = b"self"
"""Label of the self mask PRG(b_u)."""
PAIR_MASK_LABEL = b"pair"
"""Label of a pairwise mask PRG(s_uv)."""
_MASK_INFO = b"ursa-secagg-mask-v1|"
_PAIR_INFO = b"ursa-secagg-pair-v1|"
_PAIR_CONTEXT_LABEL = b"ursa-secagg-pair-context-v1"
_ZERO_NONCE = bytes(16)  # cryptography's ChaCha20: 4-byte counter + 12-byte nonce
_X25519_BYTES = 32


def mask_stream(seed: bytes, length: int, label: bytes) -> NDArray[np.uint32]:
    """``length`` pseudorandom uint32 expanded from ``seed`` under ``label``.

    Raises:
        ValueError: the seed is shorter than 16 bytes or ``length`` is negative.
    """
    if not isinstance(seed, bytes) or len(seed) < 16:
        raise ValueError("mask seed must be at least 16 bytes")
    if length < 0:
        raise ValueError(f"length must be >= 0, not {length}")
    key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=_MASK_INFO + label
    ).derive(seed)
    encryptor = Cipher(algorithms.ChaCha20(key, _ZERO_NONCE), mode=None).encryptor()
    keystream = encryptor.update(bytes(4 * length))
    return np.frombuffer(keystream, dtype="<u4").astype(np.uint32)


def pair_context(
    federation: str, run: str, round_index: int, first: str, second: str
) -> bytes:
    """The transcript a pairwise seed is bound to; symmetric in the two ids."""
    low, high = sorted((first, second))
    return _framed(
        _PAIR_CONTEXT_LABEL,
        federation.encode(),
        run.encode(),
        struct.pack(">Q", round_index),
        low.encode(),
        high.encode(),
    )


def pairwise_seed(
    own_private: X25519PrivateKey, peer_public: bytes, context: bytes
) -> bytes:
    """The 32-byte seed of the pairwise mask between two s keys, under ``context``.

    Raises:
        KeyFormatError: ``peer_public`` is not a 32-byte X25519 key.
        CryptoError: the exchange fails (low-order point).
    """
    if not isinstance(peer_public, bytes) or len(peer_public) != _X25519_BYTES:
        raise KeyFormatError(f"X25519 public key must be {_X25519_BYTES} bytes")
    try:
        shared = own_private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:
        raise CryptoError(f"X25519 exchange failed: {exc}") from exc
    return HKDF(
        algorithm=hashes.SHA256(),
        length=SEED_BYTES,
        salt=None,
        info=_PAIR_INFO + context,
    ).derive(shared)


def _framed(label: bytes, *parts: bytes) -> bytes:
    return label + b"".join(struct.pack(">I", len(part)) + part for part in parts)
