"""Packed Paillier: encrypted integer vectors and their homomorphic sums.

A vector is packed into fixed-width slots (`ursa.crypto.encoding`) and each
plaintext encrypted under a key from `ursa.crypto.paillier_keys` (whose
docstring says why the defaults are safe). Every vector carries its key's
fingerprint, its length and how many parties' vectors it sums, so a sum under
the wrong key or with more parties than its layout allows is an error, not a
wrong number. Paillier is malleable and gives no integrity: slot bounds in
`unpack` catch overflow, not lies; in Dubhe all devices share the secret key
(see ``crypto/README.md``).

The safe calls are `encrypt_vector` / `add_encrypted` / `sum_encrypted` /
`decrypt_vector` (and the ``*_reals`` pair); the keys' ``raw_*`` methods are
single-number building blocks that check no layout, bound or fingerprint.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import gmpy2
import numpy as np
import numpy.typing as npt

from ursa.crypto.encoding import FixedPoint, PackingLayout, pack, unpack
from ursa.crypto.errors import (
    CiphertextError,
    EncodingError,
    KeyMismatchError,
)
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier_keys import (
    DEFAULT_KEY_BITS,
    FINGERPRINT_BYTES,
    MAX_KEY_BITS,
    MIN_KEY_BITS,
    MIN_SECURE_KEY_BITS,
    PaillierPublicKey,
    PaillierSecretKey,
    generate_keypair,
)
from ursa.crypto.timing import timed

__all__ = [
    "DEFAULT_KEY_BITS",
    "FINGERPRINT_BYTES",
    "MAX_KEY_BITS",
    "MIN_KEY_BITS",
    "MIN_SECURE_KEY_BITS",
    "EncryptedVector",
    "PaillierPublicKey",
    "PaillierSecretKey",
    "add_encrypted",
    "decrypt_real_sum",
    "decrypt_vector",
    "encrypt_reals",
    "encrypt_vector",
    "encrypted_vector_from",
    "generate_keypair",
    "sum_encrypted",
]

_VECTOR_HEADER = struct.Struct(">2sB8sIII")
_VECTOR_MAGIC = b"UV"
_VECTOR_VERSION = 1
_mpz = gmpy2.mpz


@dataclass(frozen=True, slots=True)
class EncryptedVector:
    """An encrypted packed vector: the sum of ``num_parties`` parties' vectors.

    Attributes:
        key_fingerprint: `PaillierPublicKey.fingerprint` of the encrypting key.
        length: Number of packed values.
        num_parties: How many encrypted vectors were summed into this one.
        ciphertexts: One ciphertext per packed plaintext (gmpy2.mpz values).
    """

    key_fingerprint: bytes
    length: int
    num_parties: int
    ciphertexts: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.length < 1 or self.num_parties < 1 or not self.ciphertexts:
            raise ValueError("an encrypted vector needs length, parties, ciphertexts")

    def to_bytes(self, public_key: PaillierPublicKey) -> bytes:
        """23-byte header, then each ciphertext as fixed-length big-endian bytes.

        Raises:
            KeyMismatchError: ``public_key`` is not the encrypting key.
        """
        _check_fingerprint(public_key, self.key_fingerprint)
        size = public_key.ciphertext_size()
        header = _VECTOR_HEADER.pack(
            _VECTOR_MAGIC,
            _VECTOR_VERSION,
            self.key_fingerprint,
            self.length,
            self.num_parties,
            len(self.ciphertexts),
        )
        try:
            body = b"".join(_mpz(c).to_bytes(size, "big") for c in self.ciphertexts)
        except OverflowError:
            raise CiphertextError("a ciphertext does not fit n**2") from None
        return header + body


def _check_fingerprint(public_key: PaillierPublicKey, fingerprint: bytes) -> None:
    if fingerprint != public_key.fingerprint():
        raise KeyMismatchError(
            f"vector was encrypted under key {fingerprint.hex()}, "
            f"not {public_key.fingerprint().hex()}"
        )


def encrypted_vector_from(
    data: bytes, public_key: PaillierPublicKey, *, num_parties: int | None = None
) -> EncryptedVector:
    """Parse and validate `EncryptedVector.to_bytes` output.

    Args:
        data: The received bytes.
        public_key: The key the vector must be encrypted under.
        num_parties: If given, the header must claim exactly this many parties
            (e.g. 1 for a device's own registry, so it cannot widen the bounds).

    Raises:
        CiphertextError: truncated, wrong length, bad header, or a ciphertext
            that is 0, ``>= n**2`` or not coprime with ``n``.
        KeyMismatchError: encrypted under another key.
    """
    view = memoryview(data)
    if len(view) < _VECTOR_HEADER.size:
        raise CiphertextError(f"truncated: {len(view)} bytes, no full header")
    magic, version, fingerprint, length, parties, count = _VECTOR_HEADER.unpack_from(
        view
    )
    if magic != _VECTOR_MAGIC or version != _VECTOR_VERSION:
        raise CiphertextError("not an encrypted vector (bad magic or version)")
    _check_fingerprint(public_key, fingerprint)
    if length < 1 or parties < 1 or count < 1:
        raise CiphertextError("length, parties and ciphertext count must be >= 1")
    if num_parties is not None and parties != num_parties:
        raise CiphertextError(f"claims {parties} parties, expected {num_parties}")
    if length > count * public_key.key_bits:
        raise CiphertextError(f"{length} values cannot fit {count} ciphertexts")
    size = public_key.ciphertext_size()
    body = view[_VECTOR_HEADER.size :]
    if len(body) != count * size:
        raise CiphertextError(
            f"expected {count} x {size} ciphertext bytes, got {len(body)}"
        )
    ciphertexts = []
    for start in range(0, len(body), size):
        c = _mpz.from_bytes(body[start : start + size], "big")
        public_key.check_ciphertext(c)
        ciphertexts.append(c)
    return EncryptedVector(fingerprint, length, parties, tuple(ciphertexts))


def _check_layout(public_key: PaillierPublicKey, layout: PackingLayout) -> None:
    if layout.key_bits > public_key.key_bits:
        raise EncodingError(
            f"layout for {layout.key_bits}-bit keys used with a "
            f"{public_key.key_bits}-bit key"
        )


@timed
def encrypt_vector(
    public_key: PaillierPublicKey,
    layout: PackingLayout,
    values: Sequence[int],
    *,
    obfuscators: ObfuscatorPool | None = None,
) -> EncryptedVector:
    """Pack and encrypt one party's vector (``num_parties == 1``).

    Args:
        public_key: The encryption key.
        layout: Packing layout; ``layout.key_bits`` must not exceed the key's.
        values: Integers in ``[0, layout.max_value]``.
        obfuscators: A pool of precomputed ``r**n`` (online cost ~ 1 mulmod).

    Raises:
        EncodingError: a value out of range, or a layout too wide for the key.
        KeyMismatchError: the pool belongs to another key.
    """
    _check_layout(public_key, layout)
    if obfuscators is not None and obfuscators.public_key != public_key:
        raise KeyMismatchError("obfuscator pool was made for another key")
    n, nsquare = public_key._n, public_key._nsquare
    ciphertexts = []
    draw = public_key.random_obfuscator if obfuscators is None else obfuscators.take
    for m in pack(layout, values):
        r_n = draw()
        ciphertexts.append((1 + m * n) * r_n % nsquare)
    return EncryptedVector(public_key.fingerprint(), len(values), 1, tuple(ciphertexts))


@timed
def add_encrypted(
    public_key: PaillierPublicKey, a: EncryptedVector, b: EncryptedVector
) -> EncryptedVector:
    """Slot-wise sum of two encrypted vectors; ``num_parties`` adds up.

    Raises:
        KeyMismatchError: either vector is under another key.
        ValueError: the vectors differ in length or ciphertext count.
    """
    _check_fingerprint(public_key, a.key_fingerprint)
    _check_fingerprint(public_key, b.key_fingerprint)
    if a.length != b.length or len(a.ciphertexts) != len(b.ciphertexts):
        raise ValueError(
            f"cannot add vectors of length {a.length} and {b.length} "
            f"({len(a.ciphertexts)} vs {len(b.ciphertexts)} ciphertexts)"
        )
    nsquare = public_key._nsquare
    summed = tuple(
        _mpz(x) * y % nsquare for x, y in zip(a.ciphertexts, b.ciphertexts, strict=True)
    )
    return EncryptedVector(
        a.key_fingerprint, a.length, a.num_parties + b.num_parties, summed
    )


@timed
def sum_encrypted(
    public_key: PaillierPublicKey, vectors: Iterable[EncryptedVector]
) -> EncryptedVector:
    """Sum a stream of encrypted vectors with one running product (no list kept).

    Raises:
        ValueError: no vectors, or vectors of different lengths.
        KeyMismatchError: a vector is under another key.
    """
    iterator = iter(vectors)
    first = next(iterator, None)
    if first is None:
        raise ValueError("sum_encrypted needs at least one vector")
    fingerprint = public_key.fingerprint()
    _check_fingerprint(public_key, first.key_fingerprint)
    nsquare = public_key._nsquare
    acc = [_mpz(c) for c in first.ciphertexts]
    count, length, parties = len(acc), first.length, first.num_parties
    for vector in iterator:
        if vector.key_fingerprint != fingerprint:
            _check_fingerprint(public_key, vector.key_fingerprint)
        cts = vector.ciphertexts
        if vector.length != length or len(cts) != count:
            raise ValueError(f"cannot add length {vector.length} to length {length}")
        if count == 1:
            acc[0] = acc[0] * cts[0] % nsquare
        else:
            acc = [x * y % nsquare for x, y in zip(acc, cts, strict=True)]
        parties += vector.num_parties
    return EncryptedVector(fingerprint, length, parties, tuple(acc))


@timed
def decrypt_vector(
    secret_key: PaillierSecretKey, layout: PackingLayout, vector: EncryptedVector
) -> list[int]:
    """Decrypt and unpack a (summed) vector, checking key and slot bounds.

    Raises:
        KeyMismatchError: the vector is under another key.
        CiphertextError: the ciphertext count does not fit the layout.
        EncodingError: ``num_parties`` exceeds ``layout.max_parties``.
        SlotOverflowError: a slot exceeds its bound (overflow or bad input).
    """
    public_key = secret_key.public_key
    _check_fingerprint(public_key, vector.key_fingerprint)
    _check_layout(public_key, layout)
    expected = layout.num_plaintexts(vector.length)
    if len(vector.ciphertexts) != expected:
        raise CiphertextError(
            f"{len(vector.ciphertexts)} ciphertexts; this layout packs "
            f"{vector.length} values into {expected}"
        )
    plaintexts = [secret_key.raw_decrypt(c) for c in vector.ciphertexts]
    return unpack(layout, plaintexts, vector.length, vector.num_parties)


def encrypt_reals(
    public_key: PaillierPublicKey,
    codec: FixedPoint,
    max_parties: int,
    values: Sequence[float] | npt.NDArray[np.floating],
    *,
    obfuscators: ObfuscatorPool | None = None,
) -> EncryptedVector:
    """Encode signed reals with ``codec`` and encrypt them (sum-ready).

    Raises:
        EncodingError: a value is NaN, infinite or beyond ``codec.bound``.
    """
    layout = codec.layout(max_parties, public_key.key_bits)
    return encrypt_vector(
        public_key, layout, codec.to_ints(values), obfuscators=obfuscators
    )


def decrypt_real_sum(
    secret_key: PaillierSecretKey,
    codec: FixedPoint,
    max_parties: int,
    vector: EncryptedVector,
) -> npt.NDArray[np.float64]:
    """Decrypt a sum made by `encrypt_reals`: the float64 sum of the parties' reals.

    Raises:
        KeyMismatchError: the vector is under another key.
        SlotOverflowError: a slot exceeds what ``num_parties`` parties can sum to.
    """
    layout = codec.layout(max_parties, secret_key.public_key.key_bits)
    sums = decrypt_vector(secret_key, layout, vector)
    return codec.from_int_sums(sums, vector.num_parties)
