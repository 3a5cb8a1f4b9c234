"""Packing integer vectors into Paillier plaintexts, and fixed-point reals.

Invariants (the whole protocol relies on them):

* **Slots.** A vector of non-negative integers, each at most
  `PackingLayout.max_value`, is cut into plaintexts of `slots_per_plaintext`
  fixed-width slots; element ``i`` of a chunk sits at bits
  ``[i * slot_bits, (i + 1) * slot_bits)`` (element 0 is least significant).
* **Width and guard bit.** ``slot_bits`` is the bit length of
  ``max_value * max_parties`` plus one guard bit. Adding up to ``max_parties``
  packed plaintexts therefore never carries from one slot into the next, and
  every honest slot keeps its top bit clear.
* **Fits below n.** A plaintext uses at most ``key_bits - 2`` bits, so it is
  below every modulus ``n`` of ``key_bits`` bits (``n >= 2**(key_bits - 1)``)
  even after the largest honest sum: the homomorphic sum never wraps mod n.
* **Overflow is detected, not prevented.** `unpack` rejects a slot above
  ``max_value * num_parties`` and any bit set above the last used slot with
  `SlotOverflowError`. A party that encrypts out-of-range values directly (not
  through `pack`) can still shift counts between slots within those bounds;
  callers should also check a known total (e.g. that a Dubhe registry sums to
  the number of registrants).
* **Fixed point.** `FixedPoint` maps a real ``x`` with ``|x| <= bound`` to
  ``round(x * 2**scale_bits) + offset`` with ``offset = ceil(bound *
  2**scale_bits)``; a sum of ``k`` parties is decoded by subtracting
  ``k * offset``. The one protocol-wide scale is `DEFAULT_SCALE_BITS` (24 bits,
  the float32 mantissa): each party's rounding error is at most
  ``2**-(scale_bits + 1)``, so a sum of ``k`` parties is within
  ``k * 2**-(scale_bits + 1)`` of the exact sum.

Unsupported: negative integers in `pack` (use `FixedPoint`), NaN or infinite
reals, multiplication of packed plaintexts, and sums of more parties than
``max_parties`` (the layout, not the ciphertext, bounds that).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import SupportsIndex

import numpy as np
import numpy.typing as npt

from ursa.crypto.errors import EncodingError, SlotOverflowError

DEFAULT_SCALE_BITS = 24
"""Fixed-point fraction bits: float32 precision, rounding error <= 2**-25 a party."""

GUARD_BITS = 1
"""Spare bits on top of each slot; an honest slot never sets them."""

_PLAINTEXT_MARGIN_BITS = 2
"""Bits of the key size left unused, so a packed plaintext is always below n."""


@dataclass(frozen=True)
class PackingLayout:
    """How integer vectors are packed into plaintexts of a given key size.

    Attributes:
        max_value: Largest value one party may put into a slot (>= 1).
        max_parties: Most vectors that will ever be summed (>= 1).
        key_bits: Bit length of the Paillier modulus the plaintexts go under.
    """

    max_value: int
    max_parties: int
    key_bits: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_value", "max_parties", "key_bits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if self.max_value < 1:
            raise ValueError(f"max_value must be >= 1, got {self.max_value}")
        if self.max_parties < 1:
            raise ValueError(f"max_parties must be >= 1, got {self.max_parties}")
        if self.slots_per_plaintext < 1:
            raise ValueError(
                f"a {self.slot_bits}-bit slot does not fit a {self.key_bits}-bit key"
            )

    @property
    def slot_bound(self) -> int:
        """Largest honest slot value of a full sum: ``max_value * max_parties``."""
        return self.max_value * self.max_parties

    @property
    def slot_bits(self) -> int:
        """Bits per slot: the largest honest sum plus `GUARD_BITS`."""
        return self.slot_bound.bit_length() + GUARD_BITS

    @property
    def slots_per_plaintext(self) -> int:
        """Slots in one plaintext, so that it stays below any ``key_bits`` modulus."""
        return (self.key_bits - _PLAINTEXT_MARGIN_BITS) // self.slot_bits

    def num_plaintexts(self, length: int) -> int:
        """Plaintexts (hence ciphertexts) needed for a vector of ``length`` values."""
        if length < 0:
            raise ValueError(f"length must be >= 0, got {length}")
        return -(-length // self.slots_per_plaintext)


def _as_int(value: SupportsIndex) -> int:
    """Return ``value`` as an int, refusing floats, bools and other non-integers.

    Typed as the integers it accepts; callers' values still come from data, so
    whatever else arrives is refused here at run time too.
    """
    if isinstance(value, bool | np.bool_):
        raise EncodingError(f"expected an integer, got a boolean {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise EncodingError(
            f"expected an integer, got {type(value).__name__} {value!r}"
        ) from None


def pack(layout: PackingLayout, values: Sequence[int]) -> list[int]:
    """Pack integers in ``[0, layout.max_value]`` into plaintexts.

    Raises:
        EncodingError: a value is not an integer, is negative or exceeds
            ``max_value``, or the vector is empty.
    """
    if len(values) == 0:
        raise EncodingError("cannot pack an empty vector")
    ints = [_as_int(v) for v in values]
    bad = next((v for v in ints if v < 0 or v > layout.max_value), None)
    if bad is not None:
        raise EncodingError(
            f"value {bad} is outside [0, {layout.max_value}] for this layout"
        )
    bits = layout.slot_bits
    per = layout.slots_per_plaintext
    plaintexts = []
    for start in range(0, len(ints), per):
        acc = 0
        for v in reversed(ints[start : start + per]):
            acc = (acc << bits) | v
        plaintexts.append(acc)
    return plaintexts


def unpack(
    layout: PackingLayout, plaintexts: Sequence[int], length: int, num_parties: int
) -> list[int]:
    """Unpack the sum of ``num_parties`` packed vectors of ``length`` values.

    Raises:
        EncodingError: ``num_parties`` is not in ``[1, max_parties]``, or the
            number of plaintexts does not match ``length``.
        SlotOverflowError: a slot exceeds ``max_value * num_parties``, or a bit
            above the last used slot is set (a carry or out-of-range input).
    """
    if not 1 <= num_parties <= layout.max_parties:
        raise EncodingError(
            f"num_parties {num_parties} outside [1, {layout.max_parties}] "
            "for this layout"
        )
    if length < 1:
        raise EncodingError(f"length must be >= 1, got {length}")
    expected = layout.num_plaintexts(length)
    if len(plaintexts) != expected:
        raise EncodingError(
            f"{len(plaintexts)} plaintexts for {length} values; layout needs {expected}"
        )
    bits = layout.slot_bits
    mask = (1 << bits) - 1
    per = layout.slots_per_plaintext
    bound = layout.max_value * num_parties
    values: list[int] = []
    for index, plaintext in enumerate(plaintexts):
        rest = int(plaintext)
        if rest < 0:
            raise EncodingError(f"plaintext {index} is negative")
        count = min(per, length - index * per)
        for _ in range(count):
            slot = rest & mask
            if slot > bound:
                raise SlotOverflowError(
                    f"slot {len(values)} holds {slot} > {bound} "
                    f"(max_value {layout.max_value} x {num_parties} parties)"
                )
            values.append(slot)
            rest >>= bits
        if rest:
            raise SlotOverflowError(
                f"plaintext {index} has bits set above its last slot (overflow)"
            )
    return values


@dataclass(frozen=True)
class FixedPoint:
    """Signed reals in ``[-bound, bound]`` as non-negative integers (scale + offset).

    Attributes:
        bound: Largest magnitude a party may encode; larger values raise.
        scale_bits: Fraction bits; `DEFAULT_SCALE_BITS` protocol-wide.
    """

    bound: float
    scale_bits: int = DEFAULT_SCALE_BITS

    def __post_init__(self) -> None:
        if isinstance(self.scale_bits, bool) or not isinstance(self.scale_bits, int):
            raise TypeError("scale_bits must be an int")
        if not 0 <= self.scale_bits <= 64:
            raise ValueError(f"scale_bits must be in [0, 64], got {self.scale_bits}")
        scaled = self.bound * 2.0**self.scale_bits
        if not (self.bound > 0 and math.isfinite(scaled)):
            raise ValueError(f"bound must be finite and > 0, got {self.bound}")

    @property
    def offset(self) -> int:
        """Integer added to every scaled value: ``ceil(bound * 2**scale_bits)``."""
        return math.ceil(math.ldexp(self.bound, self.scale_bits))

    def max_value(self) -> int:
        """Largest integer one party can produce: ``2 * offset``."""
        return 2 * self.offset

    def layout(self, max_parties: int, key_bits: int = 2048) -> PackingLayout:
        """The packing layout for sums of up to ``max_parties`` encoded vectors."""
        return PackingLayout(self.max_value(), max_parties, key_bits)

    def to_ints(self, values: Sequence[float] | npt.NDArray[np.floating]) -> list[int]:
        """Encode a 1-D vector of reals.

        Raises:
            EncodingError: not 1-D, empty, NaN/infinite, or ``|x| > bound``.
        """
        try:
            array = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise EncodingError(f"not a vector of reals: {exc}") from None
        if array.ndim != 1 or array.size == 0:
            raise EncodingError(f"expected a non-empty 1-D vector, got {array.shape}")
        if not np.all(np.isfinite(array)):
            raise EncodingError("cannot encode NaN or infinite values")
        worst = float(np.max(np.abs(array)))
        if worst > self.bound:
            raise EncodingError(f"|{worst}| exceeds the codec bound {self.bound}")
        scaled = np.rint(np.ldexp(array, self.scale_bits))
        offset = self.offset
        return [int(v) + offset for v in scaled.tolist()]

    def from_int_sums(
        self, sums: Sequence[int], num_parties: int
    ) -> npt.NDArray[np.float64]:
        """Decode the slot-wise sum of ``num_parties`` encodings to the real sum."""
        if num_parties < 1:
            raise EncodingError(f"num_parties must be >= 1, got {num_parties}")
        shift = num_parties * self.offset
        limit = num_parties * self.max_value()
        out = np.empty(len(sums), dtype=np.float64)
        denominator = 1 << self.scale_bits
        for i, total in enumerate(sums):
            value = _as_int(total)
            if not 0 <= value <= limit:
                raise SlotOverflowError(
                    f"sum {i} = {value} outside [0, {limit}] for {num_parties} parties"
                )
            out[i] = (value - shift) / denominator
        return out
