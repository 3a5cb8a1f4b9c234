"""CKKS vectors over TenSEAL: the key owner decrypts, devices encrypt and compute.

FLICKER (the FLICKER paper) uses CKKS two ways:

* **Ring sum.** Devices encrypt class counts under the coordinator's public key
  and add them hop by hop (`CkksPublicContext.encrypt` / `add` / `add_plain`);
  the coordinator decrypts the global counts (`CkksKeyOwner.decrypt`).
* **Masked cosine.** The coordinator broadcasts ``Enc(x)`` (x = normalised
  global counts); a device returns ``Enc(x) * y + Enc(m)`` where y is its own
  unit vector and m a random mask whose entries sum *exactly* to zero
  (`CkksPublicContext.masked_product`). The coordinator's `decrypt_sum` yields
  ``<x, y>`` only; no Galois (rotation) keys are needed, so devices receive a
  ~0.46 MB public context instead of ~35 MB.

Wire format of a ciphertext: ``"UCK" 0x01 | key id (16 B) | TenSEAL vector``.
The key id is the first 16 bytes of SHA-256 over the serialized public context,
so a ciphertext from another key pair or epoch raises `KeyMismatchError` instead
of decrypting to garbage (CKKS itself cannot tell). The key id is a label, not
authentication: a party that forges it only gets garbage decrypted.

Caveats (also for ``crypto/README.md``):

* CKKS is approximate: a fresh ciphertext carries absolute error ~1e-7 per slot
  at the default scale 2^40; compare with a tolerance, never with ``==``.
* Values must satisfy ``|v| < 2^(remaining modulus bits - scale_bits - 1)``:
  2^99 fresh, 2^59 after one `multiply_plain`, 2^19 after two. Overflow is not
  detected; it decrypts to garbage.
* The mask hides individual products statistically (each slot is shifted by a
  value spread over ~2^21, so a product in [-1, 1] moves its distribution by
  ~2^-20); it is not computational hiding. The mask is added as a *fresh
  encryption*, so the device's own encryption noise covers every slot, also the
  noise term that depends on y. CKKS has no formal circuit privacy: treat the
  key owner as learning ``<x, y>`` plus a negligible amount about y.
* Vectors are zero-padded to a power of two (`pad_length`) so the ciphertext
  length reveals only a bucket of the true length.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.crypto.errors import (
    BackendUnavailableError,
    CiphertextError,
    CryptoError,
    EncodingError,
    KeyMismatchError,
)

__all__ = [
    "CKKS_UNAVAILABLE",
    "MASK_BITS",
    "MAX_PUBLIC_CONTEXT_BYTES",
    "CkksKeyOwner",
    "CkksParams",
    "CkksPublicContext",
    "pad_length",
    "require_tenseal",
    "unit_vector",
]

_MAGIC = b"UCK\x01"
_KEY_ID_BYTES = 16
_HEADER_BYTES = len(_MAGIC) + _KEY_ID_BYTES
MAX_PUBLIC_CONTEXT_BYTES = 4 * 1024 * 1024
"""Larger contexts are refused unparsed (one with Galois keys is ~35 MB)."""
MASK_BITS = 20
"""Mask entries are differences of uniforms over [-2^MASK_BITS, 2^MASK_BITS)."""
_MASK_FRACTION_BITS = 10  # masks are multiples of 2^-10, so their float sum is exact
# Largest total coefficient modulus (bits) at 128-bit security for a ternary
# secret, per the HomomorphicEncryption.org standard (SEAL's CoeffModulus::MaxBitCount).
_MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

FloatArray = npt.NDArray[np.float64]
Values = Sequence[float] | npt.NDArray[Any]


CKKS_UNAVAILABLE = "CKKS unavailable: install ursa-fl[ckks] on Python ≥ 3.11"
"""TenSEAL 0.3.18, the first with aarch64 wheels, has none for Python 3.10."""


def _tenseal() -> Any:
    """Import TenSEAL lazily so that ``import ursa.crypto`` never needs it."""
    try:
        import tenseal
    except ImportError as exc:
        raise BackendUnavailableError(CKKS_UNAVAILABLE) from exc
    return tenseal


def require_tenseal() -> None:
    """Raise `BackendUnavailableError` now if TenSEAL cannot be imported.

    FLICKER calls this when it is configured, so that a device without TenSEAL
    fails at start-up with the fix instead of when the first ciphertext arrives.
    """
    _tenseal()


def pad_length(length: int) -> int:
    """Return the smallest power of two >= ``length`` (``length`` >= 1)."""
    if length < 1:
        raise ValueError(f"vector length must be >= 1, got {length}")
    return 1 << (length - 1).bit_length()


def unit_vector(values: Values) -> FloatArray:
    """Return ``values`` as a float64 vector of L2 norm 1.

    Raises:
        ValueError: the vector is empty, not finite, not 1-D or all zeros.
    """
    array = _as_vector(values)
    norm = float(np.linalg.norm(array))
    if norm == 0.0:
        raise ValueError("cannot normalise a zero vector")
    return array / norm


@dataclass(frozen=True)
class CkksParams:
    """CKKS parameters; the defaults are ~128-bit secure with 4096 slots, depth 2.

    ``poly_modulus_degree`` N = 8192 gives N/2 = 4096 slots. The coefficient
    modulus [60, 40, 40, 60] totals 200 bits, below the 218 bits the
    HomomorphicEncryption.org standard allows at N = 8192 for 128-bit security
    (ternary secret). The two inner 40-bit primes allow two rescales
    (multiplicative depth 2); the last 60-bit prime is the key-switching prime.
    ``scale_bits`` = 40 matches the inner primes (rescaling keeps the scale near
    2^40) and leaves 60 - 40 = 20 bits of integer precision at the last level.
    Raising the total beyond the table lowers security: construction refuses it.
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 40, 40, 60)
    scale_bits: int = 40

    def __post_init__(self) -> None:
        max_bits = _MAX_COEFF_BITS_128.get(self.poly_modulus_degree)
        if max_bits is None:
            raise ValueError(
                "poly_modulus_degree must be a power of two in "
                f"{sorted(_MAX_COEFF_BITS_128)}, got {self.poly_modulus_degree}"
            )
        sizes = self.coeff_mod_bit_sizes
        if len(sizes) < 2 or not all(1 <= bits <= 60 for bits in sizes):
            raise ValueError(
                f"coeff_mod_bit_sizes needs >= 2 primes of 1..60 bits, got {sizes}"
            )
        if sum(sizes) > max_bits:
            raise ValueError(
                f"coeff modulus of {sum(sizes)} bits exceeds {max_bits} bits, the "
                f"128-bit security limit at N={self.poly_modulus_degree}"
            )
        if not 1 <= self.scale_bits < sizes[0]:
            raise ValueError(
                f"scale_bits must be in [1, {sizes[0]}), got {self.scale_bits}"
            )

    @property
    def slot_count(self) -> int:
        """Number of values one ciphertext holds (N/2)."""
        return self.poly_modulus_degree // 2

    @property
    def depth(self) -> int:
        """Number of `multiply_plain` calls a fresh ciphertext supports."""
        return len(self.coeff_mod_bit_sizes) - 2


class CkksKeyOwner:
    """The party that holds the CKKS secret key (the FLICKER coordinator)."""

    def __init__(self, params: CkksParams | None = None) -> None:
        ts = _tenseal()
        self.params = params if params is not None else CkksParams()
        context = ts.context(
            ts.SCHEME_TYPE.CKKS,
            poly_modulus_degree=self.params.poly_modulus_degree,
            coeff_mod_bit_sizes=list(self.params.coeff_mod_bit_sizes),
        )
        context.global_scale = float(2**self.params.scale_bits)
        self._adopt(context)

    def _adopt(self, context: Any) -> None:
        self._context = context
        self._public_bytes: bytes = context.serialize(
            save_public_key=True,
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        self.key_id = _key_id(self._public_bytes)

    def __repr__(self) -> str:
        return f"CkksKeyOwner(key_id={self.key_id.hex()}, params={self.params})"

    def secret_context_bytes(self) -> bytes:
        """The context WITH its secret key: only for the owner's 0600 key file.

        Anyone holding these bytes decrypts every FLICKER ciphertext; never send
        or log them (`ursa.coordinator.methods.flicker.keyfile` stores them).
        """
        data: bytes = self._context.serialize(
            save_public_key=True,
            save_secret_key=True,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        return data

    @classmethod
    def from_secret_context_bytes(
        cls, data: bytes, params: CkksParams | None = None
    ) -> CkksKeyOwner:
        """The key owner of `secret_context_bytes` (a restarted coordinator).

        Raises:
            CiphertextError: not a serialized context with a secret key.
        """
        ts = _tenseal()
        try:
            context = ts.context_from(data)
            has_secret = context.has_secret_key()
        except Exception as exc:
            raise CiphertextError(f"cannot load the CKKS context: {exc}") from exc
        if not has_secret:
            raise CiphertextError("the stored CKKS context has no secret key")
        owner = cls.__new__(cls)
        owner.params = params if params is not None else CkksParams()
        context.global_scale = float(2**owner.params.scale_bits)
        owner._adopt(context)
        return owner

    def public_context_bytes(self) -> bytes:
        """Serialized public context: public key only (no secret, Galois, relin)."""
        return self._public_bytes

    def public_context(self) -> CkksPublicContext:
        """The public context as an object, for encrypting locally."""
        return CkksPublicContext.from_bytes(self._public_bytes)

    def decrypt(self, ciphertext: bytes) -> FloatArray:
        """Decrypt all slots of the vector (padded length; caller trims).

        Raises:
            KeyMismatchError: the ciphertext is under another key.
            CiphertextError: the bytes are malformed.
        """
        ts = _tenseal()
        payload = _unframe(self.key_id, ciphertext, self._max_ciphertext_bytes())
        try:
            vector = ts.ckks_vector_from(self._context, payload)
            values = np.asarray(vector.decrypt(), dtype=np.float64)
        except Exception as exc:
            raise CiphertextError(f"cannot decrypt CKKS ciphertext: {exc}") from exc
        if not np.all(np.isfinite(values)):
            raise CiphertextError("CKKS ciphertext decrypted to non-finite values")
        return values

    def decrypt_sum(self, masked_product: bytes) -> float:
        """Decrypt and sum all slots: for a `masked_product`, the dot product."""
        return math.fsum(self.decrypt(masked_product).tolist())

    def _max_ciphertext_bytes(self) -> int:
        return _max_ciphertext_bytes(
            self.params.poly_modulus_degree, len(self.params.coeff_mod_bit_sizes)
        )


class CkksPublicContext:
    """What a device holds: encrypt and compute, never decrypt."""

    def __init__(self, context: Any, key_id: bytes, max_ciphertext_bytes: int) -> None:
        """Wrap a public TenSEAL context; use `from_bytes` instead."""
        self._context = context
        self.key_id = key_id
        self._max_bytes = max_ciphertext_bytes
        self.poly_modulus_degree = int(
            context.seal_context().data.key_context_data().parms().poly_modulus_degree()
        )

    def __repr__(self) -> str:
        return f"CkksPublicContext(key_id={self.key_id.hex()})"

    @property
    def slot_count(self) -> int:
        """Number of values one ciphertext holds."""
        return self.poly_modulus_degree // 2

    @classmethod
    def from_bytes(cls, data: bytes) -> CkksPublicContext:
        """Load a public context received from the key owner.

        Raises:
            CiphertextError: the bytes are not a TenSEAL context.
            CryptoError: the context is not CKKS, carries a secret key, lacks a
                public key or is below 128-bit security.
        """
        ts = _tenseal()
        if not isinstance(data, bytes | bytearray):
            raise CiphertextError(f"public context must be bytes, got {type(data)}")
        if len(data) > MAX_PUBLIC_CONTEXT_BYTES:
            raise CryptoError(
                f"public context of {len(data)} bytes exceeds "
                f"{MAX_PUBLIC_CONTEXT_BYTES}; it must not carry Galois keys"
            )
        try:
            context = ts.context_from(bytes(data))
            key_data = context.seal_context().data.key_context_data()
            scheme = key_data.parms().scheme()
            degree = int(key_data.parms().poly_modulus_degree())
            total_bits = int(key_data.total_coeff_modulus_bit_count())
            primes = int(key_data.chain_index()) + 1
            has_secret = bool(context.has_secret_key())
            has_public = bool(context.has_public_key())
            has_scale = _has_global_scale(context)
        except Exception as exc:
            raise CiphertextError(f"malformed CKKS public context: {exc}") from exc
        if scheme != ts.SCHEME_TYPE.CKKS.value:
            raise CryptoError(f"context scheme is {scheme}, expected CKKS")
        if has_secret:
            raise CryptoError("refusing a CKKS context that carries the secret key")
        if not has_public or not has_scale:
            raise CryptoError("CKKS context lacks a public key or global scale")
        max_bits = _MAX_COEFF_BITS_128.get(degree)
        if max_bits is None or total_bits > max_bits:
            raise CryptoError(
                f"CKKS context N={degree}, {total_bits}-bit modulus is below "
                "128-bit security"
            )
        return cls(context, _key_id(bytes(data)), _max_ciphertext_bytes(degree, primes))

    def encrypt(self, values: Values) -> bytes:
        """Encrypt a vector, zero-padded to `pad_length` slots."""
        array = self._padded(_as_vector(values), None)
        ts = _tenseal()
        try:
            vector = ts.ckks_vector(self._context, array.tolist())
        except Exception as exc:
            raise EncodingError(f"cannot encode vector for CKKS: {exc}") from exc
        return self._frame(vector)

    def add(self, a: bytes, b: bytes) -> bytes:
        """Return ``Enc(a + b)``; both must hold vectors of the same padded length."""
        left, right = self._load(a), self._load(b)
        if left.size() != right.size():
            raise CiphertextError(
                f"cannot add ciphertexts of {left.size()} and {right.size()} slots"
            )
        return self._frame(self._compute(lambda: left + right, "add"))

    def add_plain(self, a: bytes, values: Values) -> bytes:
        """Return ``Enc(a + values)``; ``values`` is zero-padded to a's length."""
        vector = self._load(a)
        plain = self._padded(_as_vector(values), vector.size())
        return self._frame(self._compute(lambda: vector + plain.tolist(), "add"))

    def multiply_plain(self, a: bytes, values: Values) -> bytes:
        """Return ``Enc(a * values)`` element-wise; uses one level of depth."""
        vector = self._load(a)
        plain = self._padded(_as_vector(values), vector.size())
        return self._frame(self._compute(lambda: vector * plain.tolist(), "multiply"))

    def masked_product(
        self, ciphertext: bytes, plain_unit: Values, rng: np.random.Generator
    ) -> bytes:
        """Return ``Enc(x * y + m)`` so that only ``<x, y>`` can be recovered.

        ``m`` is drawn from ``rng`` (use an unseeded ``np.random.default_rng()``
        in production): ``m_i = (k_i - k_{i-1}) * 2^-10`` with k uniform
        integers, so the entries sum exactly to zero and each has magnitude up
        to 2^(MASK_BITS + 1). The mask is added as a fresh encryption. The key
        owner's `CkksKeyOwner.decrypt_sum` then yields ``<x, y>``.
        """
        vector = self._load(ciphertext)
        size = int(vector.size())
        plain = self._padded(_as_vector(plain_unit), size)
        mask = zero_sum_mask(size, rng)
        ts = _tenseal()
        try:
            encrypted_mask = ts.ckks_vector(self._context, mask.tolist())
        except Exception as exc:
            raise EncodingError(f"cannot encode mask: {exc}") from exc
        product = self._compute(lambda: vector * plain.tolist(), "multiply")
        return self._frame(self._compute(lambda: product + encrypted_mask, "add"))

    def _load(self, data: bytes) -> Any:
        ts = _tenseal()
        payload = _unframe(self.key_id, data, self._max_bytes)
        try:
            return ts.ckks_vector_from(self._context, payload)
        except Exception as exc:
            raise CiphertextError(f"malformed CKKS ciphertext: {exc}") from exc

    def _frame(self, vector: Any) -> bytes:
        payload: bytes = vector.serialize()
        return _MAGIC + self.key_id + payload

    def _padded(self, array: FloatArray, size: int | None) -> FloatArray:
        target = pad_length(len(array)) if size is None else size
        if target > self.slot_count:
            raise ValueError(
                f"vector of {len(array)} values exceeds {self.slot_count} slots"
            )
        if len(array) > target:
            raise ValueError(
                f"plain vector of {len(array)} values is longer than the "
                f"ciphertext's {target} slots"
            )
        return np.pad(array, (0, target - len(array)))

    @staticmethod
    def _compute(operation: Callable[[], Any], name: str) -> Any:
        try:
            return operation()
        except Exception as exc:
            raise CryptoError(
                f"CKKS {name} failed (multiplicative depth exhausted or scale "
                f"out of range?): {exc}"
            ) from exc


def zero_sum_mask(length: int, rng: np.random.Generator) -> FloatArray:
    """Random float64 mask whose entries sum to exactly 0.0 (dyadic values)."""
    bound = 1 << (MASK_BITS + _MASK_FRACTION_BITS)
    integers = rng.integers(-bound, bound, size=length, dtype=np.int64)
    differences = integers - np.roll(integers, 1)
    return differences.astype(np.float64) * 2.0**-_MASK_FRACTION_BITS


def _as_vector(values: Values) -> FloatArray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"expected a non-empty 1-D vector, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("vector contains NaN or infinity")
    return array


def _key_id(public_context_bytes: bytes) -> bytes:
    return hashlib.sha256(public_context_bytes).digest()[:_KEY_ID_BYTES]


def _max_ciphertext_bytes(degree: int, primes: int) -> int:
    # Two polynomials of `primes` 64-bit words per coefficient, uncompressed,
    # with slack for size-3 ciphertexts and framing.
    return 3 * degree * primes * 8 + 65536


def _has_global_scale(context: Any) -> bool:
    try:
        return float(context.global_scale) > 0.0
    except ValueError:
        return False


def _unframe(key_id: bytes, data: bytes, max_bytes: int) -> bytes:
    if not isinstance(data, bytes | bytearray):
        raise CiphertextError(f"ciphertext must be bytes, got {type(data).__name__}")
    if len(data) <= _HEADER_BYTES or bytes(data[: len(_MAGIC)]) != _MAGIC:
        raise CiphertextError("not an ursa CKKS ciphertext (bad header or truncated)")
    if len(data) > max_bytes:
        raise CiphertextError(f"CKKS ciphertext of {len(data)} bytes is too large")
    if bytes(data[len(_MAGIC) : _HEADER_BYTES]) != key_id:
        raise KeyMismatchError(
            "CKKS ciphertext was made under another key "
            f"({bytes(data[len(_MAGIC) : _HEADER_BYTES]).hex()} != {key_id.hex()})"
        )
    return bytes(data[_HEADER_BYTES:])
