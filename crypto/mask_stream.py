"""Pseudorandom uint32 masks for secure aggregation, and the pairwise mask seed.

A mask is the ChaCha20 keystream under a key derived from a 32-byte seed, read
as little-endian uint32: ``mask_stream(seed, n, label)`` is the same on every
machine, so the coordinator can regenerate and remove exactly the mask a device
added once it learns the seed. The key is ``HKDF-SHA256(seed, info =
"ursa-secagg-mask-v1|" + label)`` and the nonce is zero: every (seed, label)
pair is used for one stream only, and the seeds are fresh every round, so no
keystream is ever reused. The label separates the self mask (`SELF_MASK_LABEL`)
from the pairwise masks (`PAIR_MASK_LABEL`) even if a seed were to repeat.

`apply_masks` adds (or subtracts) streams into a vector in place, a block of
`MASK_BLOCK_WORDS` at a time through one reused buffer: a device masking with
d neighbours then passes d keystreams through a cached block instead of
allocating d vectors (the page faults of fresh 4-byte-per-parameter buffers
cost ten times the cipher on this machine), and its memory stays flat on a Pi.

The pairwise seed of devices u and v is ``HKDF-SHA256(X25519(s_u, s_v.pub),
info = "ursa-secagg-pair-v1|" + context)`` with `pair_context` binding the
federation, run, round and the unordered pair: both ends derive the same seed
and nobody else can (the s keys are fresh per round and never leave a device
except as Shamir shares of a device declared dropped).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

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
    "MASK_BLOCK_WORDS",
    "PAIR_MASK_LABEL",
    "SEED_BYTES",
    "SELF_MASK_LABEL",
    "Mask",
    "apply_mask",
    "apply_masks",
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
MASK_BLOCK_WORDS = 1 << 14
"""uint32 words of keystream `apply_masks` produces per cipher call (64 KiB)."""
_ZERO_BLOCK = bytes(4 * MASK_BLOCK_WORDS)  # immutable: shared by every call


def mask_stream(seed: bytes, length: int, label: bytes) -> NDArray[np.uint32]:
    """``length`` pseudorandom uint32 expanded from ``seed`` under ``label``.

    Raises:
        ValueError: the seed is shorter than 16 bytes or ``length`` is negative.
    """
    _check(seed, length)
    stream = np.zeros(length, dtype=np.uint32)
    apply_mask(stream, seed, label)
    return stream


class Mask(NamedTuple):
    """One stream to fold into a vector: its seed, label and sign."""

    seed: bytes
    label: bytes
    subtract: bool = False


def apply_mask(
    target: NDArray[np.uint32], seed: bytes, label: bytes, *, subtract: bool = False
) -> None:
    """Add ``mask_stream(seed, target.size, label)`` into ``target`` in place.

    Mod 2^32, without materialising the stream; ``subtract`` takes it off.

    Raises:
        ValueError: the seed is shorter than 16 bytes, or ``target`` is not a
            writable, contiguous 1-D uint32 array.
    """
    apply_masks(target, [Mask(seed, label, subtract)])


def apply_masks(target: NDArray[np.uint32], masks: Sequence[Mask]) -> None:
    """Fold every mask's stream into ``target`` in place (see `apply_mask`).

    Block by block, every stream in turn: one block of ``target`` stays in
    cache while d keystreams pass through it, instead of d passes over the
    whole vector (twice as fast at 100k parameters and 44 neighbours).

    Raises:
        ValueError: a seed shorter than 16 bytes, or ``target`` is not a
            writable, contiguous 1-D uint32 array.
    """
    if (
        not isinstance(target, np.ndarray)
        or target.dtype != np.uint32
        or target.ndim != 1
        or not target.flags.c_contiguous
        or not target.flags.writeable
    ):
        raise ValueError("apply_mask takes a writable contiguous 1-D uint32 array")
    for mask in masks:
        _check(mask.seed, target.size)
    streams = [
        (
            Cipher(
                algorithms.ChaCha20(_mask_key(mask.seed, mask.label), _ZERO_NONCE),
                mode=None,
            ).encryptor(),
            np.subtract if mask.subtract else np.add,
        )
        for mask in masks
    ]
    block = max(1, min(target.size, MASK_BLOCK_WORDS))
    zeros = memoryview(_ZERO_BLOCK)
    out = bytearray(4 * block)
    words = np.frombuffer(out, dtype="<u4")
    for start in range(0, target.size, block):
        count = min(block, target.size - start)
        part = target[start : start + count]
        for encryptor, combine in streams:
            written = encryptor.update_into(zeros[: 4 * count], out)
            if written != 4 * count:  # a stream cipher writes what it is given
                raise CryptoError(f"keystream of {written} bytes, {4 * count} asked")
            combine(part, words[:count], out=part)


def _mask_key(seed: bytes, label: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=_MASK_INFO + label
    ).derive(seed)


def _check(seed: bytes, length: int) -> None:
    if not isinstance(seed, bytes) or len(seed) < 16:
        raise ValueError("mask seed must be at least 16 bytes")
    if length < 0:
        raise ValueError(f"length must be >= 0, not {length}")


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
