"""Fixed-point encoding of float vectors into the uint32 ring of secure aggregation.

Pairwise masks only cancel in a ring, so every contribution is an integer mod
``2**RING_BITS``. A `RingFixedPoint` codec maps a float ``v`` in ``[-bound, bound]``
to ``round(v * 2**scale_bits) mod 2**32`` and a ring sum back to a float.

Invariants:

* **No wrap for honest sums.** `RingFixedPoint.for_sum` picks the largest scale
  (at most `MAX_SCALE_BITS`) with ``parties * ceil(bound * 2**s) +
  ceil(headroom * 2**s) < 2**31``: the signed sum of ``parties`` clipped,
  rounded values plus ``headroom`` (e.g. distributed noise) stays inside
  ``[-2**31, 2**31)``, so decoding the ring sum gives the true integer sum.
  Values beyond ``bound`` are clipped (never wrapped); a sum over more parties
  than the codec was built for may wrap and decode to garbage.
* **Unbiased rounding.** Each coordinate rounds up with probability equal to
  its fractional part (stochastic rounding), so ``E[encode(v)] = v * 2**s``
  and the quantisation error of a sum of ``n`` values has standard deviation
  at most ``sqrt(n) / 2 / 2**s``.
* Non-finite inputs (NaN, inf) are refused rather than clipped: they signal a
  diverged model, not a large update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ursa.crypto.errors import CryptoError

__all__ = [
    "MAX_SCALE_BITS",
    "RING",
    "RING_BITS",
    "LayoutError",
    "RingFixedPoint",
    "Segment",
    "VectorLayout",
]

RING_BITS = 32
RING = 1 << RING_BITS
MAX_SCALE_BITS = 24
"""More fractional bits than float32's 24-bit mantissa buy nothing."""
_SIGNED_LIMIT = 1 << (RING_BITS - 1)
_WIRE_DTYPE = np.dtype("<u4")


class LayoutError(CryptoError, ValueError):
    """A contribution vector or its bytes do not match the `VectorLayout`."""


@dataclass(frozen=True)
class RingFixedPoint:
    """One fixed-point codec: ``scale_bits`` fractional bits, values in ±``bound``."""

    scale_bits: int
    bound: float

    def __post_init__(self) -> None:
        if not 0 <= self.scale_bits <= MAX_SCALE_BITS:
            raise ValueError(f"scale_bits must be in [0, {MAX_SCALE_BITS}]")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise ValueError(f"bound must be finite and positive, not {self.bound}")
        if math.ceil(self.bound * (1 << self.scale_bits)) >= _SIGNED_LIMIT:
            raise ValueError(
                f"bound {self.bound} at {self.scale_bits} fractional bits does not "
                f"fit one signed {RING_BITS}-bit value"
            )

    @classmethod
    def for_sum(
        cls, bound: float, parties: int, headroom: float = 0.0
    ) -> RingFixedPoint:
        """The finest codec whose sum over ``parties`` values never wraps.

        Args:
            bound: largest magnitude of one party's coordinate (clip bound).
            parties: most contributions that will ever be summed.
            headroom: extra magnitude the sum must hold on top (e.g. noise tail).

        Raises:
            ValueError: even ``scale_bits = 0`` would overflow, or a bad argument.
        """
        if parties < 1:
            raise ValueError(f"parties must be >= 1, not {parties}")
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"bound must be finite and positive, not {bound}")
        if not (math.isfinite(headroom) and headroom >= 0):
            raise ValueError(f"headroom must be finite and >= 0, not {headroom}")
        for scale_bits in range(MAX_SCALE_BITS, -1, -1):
            unit = float(1 << scale_bits)
            worst = parties * math.ceil(bound * unit) + math.ceil(headroom * unit)
            if worst < _SIGNED_LIMIT:
                return cls(scale_bits, float(bound))
        raise ValueError(
            f"{parties} parties of bound {bound} (+ headroom {headroom}) overflow "
            f"a signed {RING_BITS}-bit sum even without fractional bits"
        )

    def encode(self, values: ArrayLike, rng: np.random.Generator) -> NDArray[np.uint32]:
        """Clip, scale and stochastically round ``values`` into the ring.

        Raises:
            ValueError: a value is NaN or infinite.
        """
        array = np.asarray(values, dtype=np.float64).ravel()
        if not np.isfinite(array).all():
            raise ValueError("cannot encode NaN or infinite values")
        scaled = np.clip(array, -self.bound, self.bound)
        scaled *= float(1 << self.scale_bits)
        # floor(x + U), U ~ Uniform[0, 1), rounds up with probability frac(x).
        scaled += rng.random(scaled.shape)
        np.floor(scaled, out=scaled)
        # |scaled| <= ceil(bound * 2**s) < 2**31 (for_sum), so int32 is exact.
        return scaled.astype(np.int32).view(np.uint32)

    def decode(self, total: ArrayLike) -> NDArray[np.float64]:
        """Map a ring sum to floats: two's complement, then divide by ``2**s``."""
        ring = np.asarray(total, dtype=np.uint32)
        return ring.view(np.int32).astype(np.float64) / float(1 << self.scale_bits)


@dataclass(frozen=True)
class Segment:
    """A named run of ``length`` coordinates, each within ±``bound``."""

    name: str
    length: int
    bound: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("segment name must not be empty")
        if self.length < 1:
            raise ValueError(f"segment {self.name!r} length must be >= 1")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise ValueError(f"segment {self.name!r} bound must be finite and > 0")


@dataclass(frozen=True)
class VectorLayout:
    """Segments concatenated into one uint32 vector, each with its own codec.

    Per-segment codecs let a weight (bound ``max_examples``) and a model delta
    (bound ``max_weight * clip_norm``) share one masked vector without the
    large bound costing the delta its precision. Both sides build the layout
    from the same segments, ``parties`` and ``headroom``.
    """

    segments: Sequence[Segment]
    parties: int
    headroom: float = 0.0
    codecs: tuple[RingFixedPoint, ...] = field(init=False, repr=False)
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        segments = tuple(self.segments)
        if not segments:
            raise ValueError("a layout needs at least one segment")
        names = [segment.name for segment in segments]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate segment names in {names}")
        codecs = tuple(
            RingFixedPoint.for_sum(segment.bound, self.parties, self.headroom)
            for segment in segments
        )
        offsets = [0]
        for segment in segments:
            offsets.append(offsets[-1] + segment.length)
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "codecs", codecs)
        object.__setattr__(self, "_offsets", tuple(offsets))

    @property
    def length(self) -> int:
        """Total number of uint32 coordinates."""
        return self._offsets[-1]

    def codec(self, name: str) -> RingFixedPoint:
        """The codec of segment ``name`` (e.g. to size distributed noise)."""
        for segment, codec in zip(self.segments, self.codecs, strict=True):
            if segment.name == name:
                return codec
        raise LayoutError(f"no segment named {name!r}")

    def encode(
        self, parts: Mapping[str, ArrayLike], rng: np.random.Generator
    ) -> NDArray[np.uint32]:
        """Encode every segment (any shape of the right size) into one vector.

        Raises:
            LayoutError: a segment is missing, unknown or of the wrong size.
        """
        expected = {segment.name for segment in self.segments}
        if set(parts) != expected:
            missing = sorted(expected - set(parts))
            unknown = sorted(set(parts) - expected)
            raise LayoutError(f"segments missing {missing}, unknown {unknown}")
        out = np.empty(self.length, dtype=np.uint32)
        for i, (segment, codec) in enumerate(
            zip(self.segments, self.codecs, strict=True)
        ):
            values = np.asarray(parts[segment.name], dtype=np.float64)
            if values.size != segment.length:
                raise LayoutError(
                    f"segment {segment.name!r} has {values.size} values, "
                    f"expected {segment.length}"
                )
            out[self._offsets[i] : self._offsets[i + 1]] = codec.encode(values, rng)
        return out

    def decode(self, total: ArrayLike) -> dict[str, NDArray[np.float64]]:
        """Split a ring sum into its segments, decoded to float64 (1-D each).

        Raises:
            LayoutError: the vector is not of the layout's length.
        """
        vector = self._checked(total)
        return {
            segment.name: codec.decode(vector[self._offsets[i] : self._offsets[i + 1]])
            for i, (segment, codec) in enumerate(
                zip(self.segments, self.codecs, strict=True)
            )
        }

    def to_bytes(self, vector: ArrayLike) -> bytes:
        """Little-endian uint32 bytes of a vector of this layout."""
        return self._checked(vector).astype(_WIRE_DTYPE, copy=False).tobytes()

    def from_bytes(self, data: bytes) -> NDArray[np.uint32]:
        """Parse `to_bytes` output (a fresh, writable native-order array).

        Raises:
            LayoutError: the byte count is not ``4 * length``.
        """
        expected = self.length * _WIRE_DTYPE.itemsize
        if not isinstance(data, bytes | bytearray) or len(data) != expected:
            size = len(data) if isinstance(data, bytes | bytearray) else -1
            raise LayoutError(f"vector has {size} bytes, expected {expected}")
        return np.frombuffer(data, dtype=_WIRE_DTYPE).astype(np.uint32)

    def _checked(self, vector: ArrayLike) -> NDArray[np.uint32]:
        array = np.asarray(vector)
        if array.dtype != np.uint32 or array.shape != (self.length,):
            raise LayoutError(
                f"expected a uint32 vector of shape ({self.length},), "
                f"got {array.dtype} {array.shape}"
            )
        return array
