"""Paillier key pairs: generation, fixed-length bytes, raw encrypt and decrypt.

Paillier with ``g = n + 1``: ``Enc(m) = (1 + m*n) * r**n mod n**2``, decrypted
with the CRT over ``p**2`` and ``q**2``. Key generation is phe's (system random
primes); the arithmetic is gmpy2. Ciphertexts and obfuscators are held as
``gmpy2.mpz`` (an int-like type registered as `numbers.Integral`; ``int(c)``
converts) because a product mod ``n**2`` is ~8x faster than with Python ints.

Why the defaults are safe, and when they are not:

* 2048-bit keys (~112-bit security) by default; 3072 for data that must stay
  secret beyond ~2030. 512/1024-bit keys are accepted for tests only.
* Encryption is randomised and semantically secure **as long as every
  obfuscator ``r**n`` is used once**; `ObfuscatorPool` enforces that.
* The secret key is serialised only by the explicitly named `secret_to_bytes`.

``raw_*`` are single-number building blocks that check no layout, bound or key
fingerprint; the safe calls on vectors are in `ursa.crypto.paillier`.
"""

from __future__ import annotations

import hashlib
import numbers
import secrets
import struct
from typing import Any

import gmpy2
from phe import paillier as phe_paillier

from ursa.crypto.errors import (
    CiphertextError,
    EncodingError,
    KeyFormatError,
    KeyMismatchError,
)

DEFAULT_KEY_BITS = 2048
"""~112-bit security (NIST SP 800-57); use 3072 for long-lived secrets."""
MIN_KEY_BITS = 512
"""Smallest modulus the arithmetic accepts: for fast tests only, breakable."""
MIN_SECURE_KEY_BITS = 2048
"""Smallest modulus devices and ``coordinator serve`` accept unless their own
config sets ``insecure_test_keys = true``: a 512- or 1024-bit modulus can be
factored, and with it every registration and sum of the epoch decrypted."""
MAX_KEY_BITS = 4096
FINGERPRINT_BYTES = 8

_PUBLIC_MAGIC = b"UPK1"
_SECRET_MAGIC = b"USK1"
_LENGTH = struct.Struct(">H")
# magic, format version, key fingerprint, length, num_parties, ciphertext count
_mpz = gmpy2.mpz


def _check_key_bits(key_bits: int) -> None:
    if isinstance(key_bits, bool) or not isinstance(key_bits, int):
        raise TypeError(f"key_bits must be an int, got {type(key_bits).__name__}")
    if not MIN_KEY_BITS <= key_bits <= MAX_KEY_BITS or key_bits % 8:
        raise ValueError(
            f"key_bits must be a multiple of 8 in [{MIN_KEY_BITS}, {MAX_KEY_BITS}], "
            f"got {key_bits}"
        )


class PaillierPublicKey:
    """A Paillier public key (the modulus ``n``); safe to share and serialise."""

    __slots__ = ("_fingerprint", "_n", "_nsquare", "key_bits", "n")

    n: int
    key_bits: int
    _n: int  # gmpy2.mpz copies of n and n**2 (int-like, fast products)
    _nsquare: int
    _fingerprint: bytes

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        n = int(n)
        if n < 3 or n % 2 == 0 or not MIN_KEY_BITS <= n.bit_length() <= MAX_KEY_BITS:
            raise KeyFormatError(
                f"not a Paillier modulus (odd, {MIN_KEY_BITS}-{MAX_KEY_BITS} bits)"
            )
        self.n = n
        self.key_bits = n.bit_length()
        self._n = _mpz(n)
        self._nsquare = self._n * self._n
        width = (self.key_bits + 7) // 8
        self._fingerprint = hashlib.sha256(n.to_bytes(width, "big")).digest()[
            :FINGERPRINT_BYTES
        ]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PaillierPublicKey) and other.n == self.n

    def __hash__(self) -> int:
        return hash(self.n)

    def __repr__(self) -> str:
        return (
            f"PaillierPublicKey(key_bits={self.key_bits}, "
            f"fingerprint={self._fingerprint.hex()})"
        )

    @property
    def nsquare(self) -> int:
        """The ciphertext modulus ``n**2`` (as gmpy2.mpz)."""
        return self._nsquare

    def fingerprint(self) -> bytes:
        """First 8 bytes of SHA-256 over ``n`` (big-endian, key-size bytes)."""
        return self._fingerprint

    def ciphertext_size(self) -> int:
        """Bytes of one serialised ciphertext: ``2 * ceil(key_bits / 8)``."""
        return 2 * ((self.key_bits + 7) // 8)

    def to_bytes(self) -> bytes:
        """Serialise as magic, 2-byte length and big-endian ``n``."""
        body = self.n.to_bytes((self.key_bits + 7) // 8, "big")
        return _PUBLIC_MAGIC + _LENGTH.pack(len(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> PaillierPublicKey:
        """Parse `to_bytes` output.

        Raises:
            CryptoError: malformed bytes or not a plausible modulus.
        """
        fields = _split_fields(bytes(data), _PUBLIC_MAGIC, 1, "public key")
        return cls(int.from_bytes(fields[0], "big"))

    def random_obfuscator(self) -> int:
        """A fresh ``r**n mod n**2`` for uniform ``r`` coprime with ``n`` (~7.6 ms)."""
        while True:
            r = _mpz(secrets.randbelow(self.n - 1) + 1)
            if gmpy2.gcd(r, self._n) == 1:
                return gmpy2.powmod(r, self._n, self._nsquare)  # type: ignore[no-any-return]

    def raw_encrypt(self, plaintext: int, obfuscator: int | None = None) -> int:
        """Encrypt one integer in ``[0, n)``; prefer `encrypt_vector`.

        Args:
            plaintext: The integer to encrypt.
            obfuscator: A fresh ``r**n mod n**2`` used for this call only (e.g.
                from an `ObfuscatorPool`); drawn on the spot when omitted.

        Raises:
            EncodingError: the plaintext is outside ``[0, n)``.
        """
        m = int(plaintext)
        if not 0 <= m < self.n:
            raise EncodingError("plaintext outside [0, n)")
        r_n = self.random_obfuscator() if obfuscator is None else obfuscator
        if not 0 < r_n < self._nsquare:
            raise ValueError("obfuscator outside (0, n**2)")
        return (1 + m * self._n) * r_n % self._nsquare

    def check_ciphertext(self, ciphertext: int) -> None:
        """Raise `CiphertextError` unless ``0 < c < n**2`` and ``gcd(c, n) == 1``."""
        if not 0 < ciphertext < self._nsquare:
            raise CiphertextError("ciphertext outside (0, n**2)")
        if gmpy2.gcd(ciphertext, self._n) != 1:
            raise CiphertextError("ciphertext not coprime with n")


class PaillierSecretKey:
    """A Paillier secret key (``p``, ``q``); serialised only by `secret_to_bytes`."""

    __slots__ = (
        "_hp",
        "_hq",
        "_p",
        "_p_inverse",
        "_psquare",
        "_q",
        "_qsquare",
        "public_key",
    )

    public_key: PaillierPublicKey

    def __init__(self, public_key: PaillierPublicKey, p: int, q: int) -> None:
        p, q = sorted((int(p), int(q)))
        if p < 3 or p == q or p * q != public_key.n:
            raise KeyMismatchError("p * q does not equal the public modulus n")
        self.public_key = public_key
        self._p, self._q = _mpz(p), _mpz(q)
        self._psquare, self._qsquare = self._p * self._p, self._q * self._q
        self._p_inverse = gmpy2.invert(self._p, self._q)
        self._hp = self._h(self._p, self._psquare)
        self._hq = self._h(self._q, self._qsquare)

    def _h(self, prime: Any, prime_square: Any) -> Any:
        g = self.public_key.n + 1
        lifted = gmpy2.powmod(g, prime - 1, prime_square)
        return gmpy2.invert((lifted - 1) // prime, prime)

    def __repr__(self) -> str:
        return f"PaillierSecretKey(<secret>, public_key={self.public_key!r})"

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError(
            "PaillierSecretKey is not picklable; use secret_to_bytes() explicitly"
        )

    def raw_decrypt(self, ciphertext: int) -> int:
        """Decrypt one ciphertext with the CRT; prefer `decrypt_vector`.

        Raises:
            CiphertextError: the ciphertext is outside ``(0, n**2)``.
        """
        if not 0 < ciphertext < self.public_key.nsquare:
            raise CiphertextError("ciphertext outside (0, n**2)")
        p, q = self._p, self._q
        mp = (gmpy2.powmod(ciphertext, p - 1, self._psquare) - 1) // p * self._hp % p
        mq = (gmpy2.powmod(ciphertext, q - 1, self._qsquare) - 1) // q * self._hq % q
        return int(mp + (mq - mp) * self._p_inverse % q * p)

    def secret_to_bytes(self) -> bytes:
        """Serialise ``n``, ``p`` and ``q``. The result is the secret: seal it."""
        parts = [int(x) for x in (self.public_key.n, self._p, self._q)]
        out = [_SECRET_MAGIC]
        for x in parts:
            body = x.to_bytes((x.bit_length() + 7) // 8, "big")
            out += [_LENGTH.pack(len(body)), body]
        return b"".join(out)

    @classmethod
    def secret_from_bytes(cls, data: bytes) -> PaillierSecretKey:
        """Parse `secret_to_bytes` output, checking ``p * q == n`` and primality.

        Raises:
            CryptoError: malformed bytes, or ``p``/``q`` do not form the key.
        """
        n, p, q = (
            int.from_bytes(f, "big")
            for f in _split_fields(bytes(data), _SECRET_MAGIC, 3, "secret key")
        )
        # BPSW has no known pseudoprime and costs a third of 40 Miller-Rabin
        # rounds: every device runs this once per key epoch when it unseals.
        if not (gmpy2.is_bpsw_prp(p) and gmpy2.is_bpsw_prp(q)):
            raise KeyFormatError("malformed secret key: p or q is not prime")
        try:
            return cls(PaillierPublicKey(n), p, q)
        except KeyMismatchError as exc:
            raise KeyFormatError(f"malformed secret key: {exc}") from None


def _split_fields(data: bytes, magic: bytes, count: int, what: str) -> list[bytes]:
    """Split ``magic`` + ``count`` length-prefixed fields, exactly consuming data."""
    if not data.startswith(magic):
        raise KeyFormatError(f"malformed {what}: bad magic")
    fields, pos = [], len(magic)
    for _ in range(count):
        if pos + _LENGTH.size > len(data):
            raise KeyFormatError(f"malformed {what}: truncated")
        (size,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        if size == 0 or pos + size > len(data):
            raise KeyFormatError(f"malformed {what}: truncated field")
        fields.append(data[pos : pos + size])
        pos += size
    if pos != len(data):
        raise KeyFormatError(f"malformed {what}: {len(data) - pos} trailing bytes")
    return fields


def generate_keypair(
    key_bits: int = DEFAULT_KEY_BITS,
) -> tuple[PaillierPublicKey, PaillierSecretKey]:
    """Generate a key pair whose modulus has exactly ``key_bits`` bits.

    Raises:
        ValueError: ``key_bits`` not a multiple of 8 in ``[512, 4096]``.
    """
    _check_key_bits(key_bits)
    phe_public, phe_secret = phe_paillier.generate_paillier_keypair(n_length=key_bits)
    public_key = PaillierPublicKey(phe_public.n)
    return public_key, PaillierSecretKey(public_key, phe_secret.p, phe_secret.q)
