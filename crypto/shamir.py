"""Shamir secret sharing of byte strings over the prime field GF(2^130 - 5).

A secret is split in 16-byte blocks (`BLOCK_BYTES`), each read as a
big-endian integer below 2^128 < p, shared with the same holder indices; one
`Share` carries a holder's share of every block, `SHARE_BLOCK_BYTES` (17) bytes
each. Any ``threshold`` shares rebuild the secret by Lagrange interpolation at
0; fewer reveal nothing about it (the coefficients are uniform in the field,
from `secrets`).

Why not pycryptodome's `Shamir` (GF(2^128)): its field arithmetic is pure
Python bit by bit, about 7 µs a multiplication, so a device's split at
K = 100 (45 holders, threshold 30, four blocks) cost 38 ms and the
coordinator's reconstruction of 100 secrets 8 s of CPU. Python's integers do
the prime field's multiplication in well under a microsecond; the scheme is
the textbook one and is tested against its properties (any threshold subset
rebuilds, fewer do not, a wrong share is caught).

Indices are ``1..holders``, capped at `MAX_HOLDERS` (65535, two bytes on the
wire). Shares carry no authentication: a wrong share yields a wrong secret.
`combine_shares` detects it when it is given more shares than the threshold
(two different subsets must agree) or when the result is no 16-byte block;
callers that can also check the secret itself (the coordinator compares a
rebuilt X25519 key with its public key). The arithmetic is not constant-time
(nor was pycryptodome's pure-Python field).
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from ursa.crypto.errors import CryptoError

__all__ = [
    "BLOCK_BYTES",
    "MAX_HOLDERS",
    "SHARE_BLOCK_BYTES",
    "SecretKind",
    "Share",
    "ShareError",
    "UnmaskShare",
    "combine_shares",
    "share_bytes",
    "split_secret",
]

BLOCK_BYTES = 16
"""A secret's block: an integer below 2^128."""
PRIME = (1 << 130) - 5
"""The field: Poly1305's prime, the first above 2^128 with a short form."""
SHARE_BLOCK_BYTES = 17
"""One block's share: an element of the field (below 2^130)."""
MAX_HOLDERS = 0xFFFF
_MAX_LANE_BITS = 2048
"""Widest lane `_evaluations` packs; wider (huge thresholds), the per-block
Horner with a reduction per step is faster than arithmetic on such integers."""
SecretKind = Literal["b", "s"]
"""Which secret of a secure-aggregation owner a share belongs to: b_u or s_u."""
_UNMASK_VERSION = 1


class ShareError(CryptoError, ValueError):
    """Shares that cannot be split or combined: too few, duplicate, malformed."""


def share_bytes(secret_bytes: int) -> int:
    """The size of one holder's share of a secret of ``secret_bytes`` bytes."""
    return secret_bytes // BLOCK_BYTES * SHARE_BLOCK_BYTES


@dataclass(frozen=True)
class Share:
    """One holder's share: its index (1-based) and 17 bytes per secret block."""

    index: int
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.index, int) or not 1 <= self.index <= MAX_HOLDERS:
            raise ShareError(f"share index must be in [1, {MAX_HOLDERS}]")
        if (
            not isinstance(self.data, bytes)
            or not self.data
            or len(self.data) % SHARE_BLOCK_BYTES
        ):
            raise ShareError(
                f"share data must be a nonempty multiple of {SHARE_BLOCK_BYTES}"
            )


def split_secret(secret: bytes, threshold: int, holders: int) -> list[Share]:
    """Split ``secret`` into ``holders`` shares, any ``threshold`` of which rebuild it.

    Raises:
        ShareError: the secret is not a non-empty multiple of 16 bytes, or not
            ``1 <= threshold <= holders <= MAX_HOLDERS``.
    """
    if not isinstance(secret, bytes) or not secret or len(secret) % BLOCK_BYTES:
        raise ShareError(f"secret must be a non-empty multiple of {BLOCK_BYTES} bytes")
    if not 1 <= holders <= MAX_HOLDERS:
        raise ShareError(f"holders must be in [1, {MAX_HOLDERS}], not {holders}")
    if not 1 <= threshold <= holders:
        raise ShareError(f"threshold must be in [1, {holders}], not {threshold}")
    values = [
        int.from_bytes(secret[offset : offset + BLOCK_BYTES], "big")
        for offset in range(0, len(secret), BLOCK_BYTES)
    ]
    return [
        Share(index, b"".join(y.to_bytes(SHARE_BLOCK_BYTES, "big") for y in row))
        for index, row in enumerate(_evaluations(values, threshold, holders), 1)
    ]


def combine_shares(shares: Sequence[Share], threshold: int) -> bytes:
    """Rebuild the secret from at least ``threshold`` shares.

    With more than ``threshold`` shares, a second subset is combined too and
    must agree, so one wrong share among redundant ones is caught.

    Raises:
        ShareError: too few shares, duplicate indices, unequal lengths, or
            inconsistent shares.
    """
    if threshold < 1:
        raise ShareError(f"threshold must be >= 1, not {threshold}")
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares given, {threshold} needed")
    indices = [share.index for share in shares]
    if len(set(indices)) != len(indices):
        raise ShareError(f"duplicate share indices in {sorted(indices)}")
    lengths = {len(share.data) for share in shares}
    if len(lengths) != 1:
        raise ShareError(f"shares of different lengths {sorted(lengths)}")
    secret = _combine(shares[:threshold])
    if len(shares) > threshold and _combine(shares[-threshold:]) != secret:
        raise ShareError("shares are inconsistent: at least one is wrong")
    return secret


def _evaluations(values: list[int], threshold: int, holders: int) -> list[list[int]]:
    """Per holder x in 1..holders, every block's polynomial at x (constant: the block).

    Each block gets ``threshold - 1`` fresh uniform coefficients. The blocks'
    polynomials are evaluated together: the coefficients of one degree are
    packed side by side into one integer, each in a lane wide enough that
    the exact, unreduced value (below ``2^130 * x^threshold``) never carries
    into the next lane, so one Horner pass over Python integers evaluates
    every block and each lane is reduced once at the end: a device's split
    of s and b (four blocks, 45 holders, threshold 30) costs half as much.
    """
    blocks = len(values)
    coefficients = [  # highest degree first
        [secrets.randbelow(PRIME) for _ in range(blocks)] for _ in range(threshold - 1)
    ]
    width = PRIME.bit_length() + threshold * holders.bit_length() + 1
    if width > _MAX_LANE_BITS:
        return _evaluations_per_block(values, coefficients, holders)
    lane = (1 << width) - 1
    packed = [
        sum(c << (j * width) for j, c in enumerate(degree)) for degree in coefficients
    ]
    constant = sum(v << (j * width) for j, v in enumerate(values))
    rows = []
    for x in range(1, holders + 1):
        acc = 0
        for coefficient in packed:
            acc = acc * x + coefficient
        acc = acc * x + constant
        rows.append([((acc >> (j * width)) & lane) % PRIME for j in range(blocks)])
    return rows


def _evaluations_per_block(
    values: list[int], coefficients: list[list[int]], holders: int
) -> list[list[int]]:
    """`_evaluations` one block at a time, reducing at every Horner step."""
    rows = []
    for x in range(1, holders + 1):
        row = []
        for j, value in enumerate(values):
            acc = 0
            for degree in coefficients:
                acc = (acc * x + degree[j]) % PRIME
            row.append((acc * x + value) % PRIME)
        rows.append(row)
    return rows


def _combine(shares: Sequence[Share]) -> bytes:
    xs = [share.index for share in shares]
    weights = []  # Lagrange basis at 0: prod x_m / (x_m - x_j), m != j
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % PRIME
                den = den * (xm - xj) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    size = len(shares[0].data)
    out = []
    for offset in range(0, size, SHARE_BLOCK_BYTES):
        total = 0
        for weight, share in zip(weights, shares, strict=True):
            y = int.from_bytes(share.data[offset : offset + SHARE_BLOCK_BYTES], "big")
            total = (total + weight * y) % PRIME
        if total >> (8 * BLOCK_BYTES):
            raise ShareError("shares are inconsistent: the result is no secret block")
        out.append(total.to_bytes(BLOCK_BYTES, "big"))
    return b"".join(out)


@dataclass(frozen=True)
class UnmaskShare:
    """A share revealed at unmasking: of ``owner``'s b (survived) or s (dropped).

    It lives here, beside `Share`, because both the device (which reveals it)
    and the coordinator (which combines it) need it and neither may import the
    other. Wire form (`to_bytes`): ``0x01 | kind (1 byte, "b"/"s") | len(owner)
    (1) | owner (ASCII) | index (2, big-endian) | data``.
    """

    owner: str
    kind: SecretKind
    share: Share

    def __post_init__(self) -> None:
        if self.kind not in ("b", "s"):
            raise ShareError(f"unmask share kind must be 'b' or 's', not {self.kind!r}")
        if not isinstance(self.owner, str) or not 1 <= len(self.owner) <= 255:
            raise ShareError("unmask share owner must be a 1-255 character id")
        if not self.owner.isascii():
            raise ShareError("unmask share owner must be ASCII")

    def to_bytes(self) -> bytes:
        """Encode for the wire (see the class docstring)."""
        owner = self.owner.encode("ascii")
        return (
            bytes([_UNMASK_VERSION, ord(self.kind), len(owner)])
            + owner
            + struct.pack(">H", self.share.index)
            + self.share.data
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskShare:
        """Decode `to_bytes` output.

        Raises:
            ShareError: truncated, unknown version or kind, malformed share.
        """
        if not isinstance(data, bytes | bytearray) or len(data) < 3:
            raise ShareError("unmask share is truncated")
        data = bytes(data)
        if data[0] != _UNMASK_VERSION:
            raise ShareError(f"unknown unmask share version {data[0]}")
        kind = chr(data[1])
        if kind not in ("b", "s"):
            raise ShareError(f"unknown unmask share kind {data[1]}")
        end = 3 + data[2]
        if len(data) < end + 2:
            raise ShareError("unmask share is truncated")
        try:
            owner = data[3:end].decode("ascii")
        except UnicodeDecodeError as exc:
            raise ShareError("unmask share owner is not ASCII") from exc
        (index,) = struct.unpack(">H", data[end : end + 2])
        return cls(owner, cast(SecretKind, kind), Share(index, data[end + 2 :]))
