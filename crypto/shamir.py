"""Shamir secret sharing of byte strings, over pycryptodome's GF(2^128) scheme.

pycryptodome shares one 16-byte block (`BLOCK_BYTES`); a longer secret (a
multiple of 16 bytes, e.g. a 32-byte X25519 key) is split block by block with
the same holder indices, so one `Share` carries a holder's share of every block.
Any ``threshold`` shares reconstruct the secret; fewer reveal nothing about it.

Indices are ``1..holders``. pycryptodome itself accepts any nonzero index below
2^128; we cap ``holders`` at `MAX_HOLDERS` (65535, two bytes on the wire).
Reconstruction is pure-Python Lagrange interpolation, O(threshold^2) field
multiplications per block (about 0.3 s per block at threshold 100): keep
neighbourhoods small (the SecAgg+ sparse graph) rather than thresholds in the
hundreds.

Shares carry no authentication: a wrong share silently yields a wrong secret.
`combine_shares` detects it when it is given more shares than the threshold
(two different subsets must agree); callers that can, also check the secret
itself (the coordinator compares a rebuilt X25519 key with its public key).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from Crypto.Protocol.SecretSharing import Shamir

from ursa.crypto.errors import CryptoError

__all__ = [
    "BLOCK_BYTES",
    "MAX_HOLDERS",
    "SecretKind",
    "Share",
    "ShareError",
    "UnmaskShare",
    "combine_shares",
    "split_secret",
]

BLOCK_BYTES = 16
MAX_HOLDERS = 0xFFFF
SecretKind = Literal["b", "s"]
"""Which secret of a secure-aggregation owner a share belongs to: b_u or s_u."""
_UNMASK_VERSION = 1


class ShareError(CryptoError, ValueError):
    """Shares that cannot be split or combined: too few, duplicate, malformed."""


@dataclass(frozen=True)
class Share:
    """One holder's share: its index (1-based) and one 16-byte share per block."""

    index: int
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.index, int) or not 1 <= self.index <= MAX_HOLDERS:
            raise ShareError(f"share index must be in [1, {MAX_HOLDERS}]")
        if (
            not isinstance(self.data, bytes)
            or not self.data
            or len(self.data) % BLOCK_BYTES
        ):
            raise ShareError(f"share data must be a nonempty multiple of {BLOCK_BYTES}")


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
    blocks = [
        Shamir.split(threshold, holders, secret[offset : offset + BLOCK_BYTES])
        for offset in range(0, len(secret), BLOCK_BYTES)
    ]
    return [
        Share(index, b"".join(block[index - 1][1] for block in blocks))
        for index in range(1, holders + 1)
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


def _combine(shares: Sequence[Share]) -> bytes:
    size = len(shares[0].data)
    return b"".join(
        Shamir.combine(
            [
                (share.index, share.data[offset : offset + BLOCK_BYTES])
                for share in shares
            ]
        )
        for offset in range(0, size, BLOCK_BYTES)
    )


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
