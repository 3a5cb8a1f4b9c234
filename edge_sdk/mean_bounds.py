"""What a decrypted secure mean may hold: the honest range of a sum of K reports.

A packed Paillier sum (`ursa.crypto.paillier`) only rejects a slot beyond the
packing's width; inside it, one party that encrypts by hand (not through the
codec) can put any value it likes into its slot, far beyond what an honest
report holds (the issue's row: one CLIMB report with a huge lambda slot made
every honest weight -998). Without range proofs a device cannot tell which
party did it, but it can tell a sum no honest fleet of ``K`` parties could
produce: each honest report is bounded by construction on its device (the
values are clamped before encryption), so an honest sum of slot ``j`` lies in
``[K * low_j, K * high_j]``, widened by each party's fixed-point rounding.
`HonestRange` is that check; a sum outside it is refused
(`ImplausibleSumError`) and the device keeps its previous state.

Within the range one party still moves the mean: its slot may hold anything
that keeps the sum in range, so the mean of slot ``j`` can land anywhere in
``[low_j, high_j]`` (docs/bounded_influence.md, "Decrypted means").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ursa.crypto.encoding import FixedPoint

__all__ = ["HonestRange", "ImplausibleSumError", "check_parties", "rounding_of"]

FloatVector = npt.NDArray[np.float64]


class ImplausibleSumError(ValueError):
    """A decrypted sum (or its party count) that no honest fleet could produce."""


def rounding_of(codec: FixedPoint) -> float:
    """One party's largest fixed-point rounding error per value: ``2**-(s + 1)``."""
    return 2.0 ** -(codec.scale_bits + 1)


@dataclass(frozen=True)
class HonestRange:
    """Slot by slot, what one honest report holds: ``low[j] <= v_j <= high[j]``.

    Attributes:
        low: Each slot's least honest value.
        high: Each slot's largest honest value.
        rounding: Each party's encoding error per slot (0 for integer counts,
            which a scale of 0 bits encodes exactly).
    """

    low: tuple[float, ...]
    high: tuple[float, ...]
    rounding: float

    def __post_init__(self) -> None:
        if len(self.low) != len(self.high) or not self.low:
            raise ValueError("an honest range needs one low and one high per slot")
        if any(lo > hi for lo, hi in zip(self.low, self.high, strict=True)):
            raise ValueError("an honest range needs low <= high in every slot")
        if not (self.rounding >= 0 and np.isfinite(self.rounding)):
            raise ValueError(f"rounding must be finite and >= 0, got {self.rounding}")

    @classmethod
    def of(
        cls, low: Sequence[float], high: Sequence[float], codec: FixedPoint
    ) -> HonestRange:
        """The range of reals encoded with ``codec`` (its rounding per party)."""
        return cls(tuple(low), tuple(high), rounding_of(codec))

    @property
    def length(self) -> int:
        """Values per report."""
        return len(self.low)

    def sum_bounds(self, num_parties: int) -> tuple[FloatVector, FloatVector]:
        """The least and largest honest sum of each slot over ``num_parties``."""
        k = float(num_parties)
        slack = k * self.rounding
        low = np.asarray(self.low, dtype=np.float64) * k - slack
        high = np.asarray(self.high, dtype=np.float64) * k + slack
        return low, high

    def check(self, totals: FloatVector, num_parties: int) -> None:
        """Refuse a sum of ``num_parties`` reports outside the honest range.

        Raises:
            ImplausibleSumError: a slot is not finite or outside
                ``[K * low - K * rounding, K * high + K * rounding]``, or the
                sum has another length.
        """
        values = np.asarray(totals, dtype=np.float64)
        if values.shape != (self.length,):
            raise ImplausibleSumError(
                f"a sum of {values.size} values; reports hold {self.length}"
            )
        low, high = self.sum_bounds(num_parties)
        for slot, (value, lo, hi) in enumerate(zip(values, low, high, strict=True)):
            if not (np.isfinite(value) and lo <= value <= hi):
                raise ImplausibleSumError(
                    f"slot {slot} sums to {value:.6g} over {num_parties} parties; "
                    f"honest reports sum to [{lo:.6g}, {hi:.6g}]"
                )


def check_parties(num_parties: int, most: int) -> None:
    """Refuse a sum that claims more parties than could have reported.

    Raises:
        ImplausibleSumError: ``num_parties`` outside ``[1, most]``.
    """
    if not 1 <= num_parties <= most:
        raise ImplausibleSumError(
            f"a sum over {num_parties} parties; at most {most} can report"
        )
