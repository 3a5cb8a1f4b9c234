"""What an unmasked secure sum may hold, and the check every sum passes.

The coordinator never sees one device's vector, so it cannot clip one; a
device whose SDK skips the clip can put any value into the uint32 ring. What
it can check is the sum of the ``n`` survivors against what ``n`` honest
contributions (`ursa.protocol.secure_aggregation`) can give:

* every segment: each coordinate within ``n * bound`` (the codec clips an
  honest value to its segment's ``bound``);
* the weight ``W``: FedAvg in ``[n, n * max_examples]``, else exactly ``n``;
* the model: ``||S||_2 <= W_hi * clip_norm`` where ``W_hi`` is the largest
  true weight sum the decoded ``W`` allows (``min(W, n * max_examples)``
  under FedAvg, ``n`` otherwise), since ``||sum a_i c_i|| <= sum a_i ||c_i||``
  and every honest ``||c_i|| <= clip_norm``; the mean step ``S / W`` is then
  at most ``clip_norm`` long;
* ``reporting`` (the metric slots, without DP): exactly ``n``.

Each bound has slack for what honest encoding adds: stochastic rounding moves
each coordinate of each device by less than one ring unit ``2^-s`` (so at most
``n 2^-s`` per coordinate, ``n sqrt(d) 2^-s`` in L2 over ``d`` coordinates),
and under distributed DP the summed noise (discrete Gaussian, sub-Gaussian
with its std sigma per coordinate: Canonne, Kamath & Steinke 2020) stays
within ``sigma sqrt(d + 2 sqrt(d t) + 2 t)`` in L2 but with probability
``e^-t`` (Hsu, Kakade & Zhang 2012); ``t = NOISE_TAIL^2 / 2 = 32``, so an
honest sum is refused with probability below 1e-13 per check.

Pure: numbers in, `SumOutOfBoundsError` or the weight to divide by out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.aggregation import vector_norm
from ursa.crypto.fixed_point import VectorLayout
from ursa.protocol.messages import SecAggSetup
from ursa.protocol.secure_aggregation import (
    MODEL_SEGMENT,
    NOISE_TAIL,
    WEIGHT_SEGMENT,
    noise_sigmas,
)

__all__ = ["CheckedSum", "SumBounds", "SumOutOfBoundsError"]

_TAIL_T = NOISE_TAIL**2 / 2.0
"""The tail parameter t of the noise bound (e^-t: the chance an honest sum fails)."""


class SumOutOfBoundsError(ValueError):
    """An unmasked sum no ``n`` honest devices could have produced."""


@dataclass(frozen=True)
class CheckedSum:
    """A sum that passed: the weight to divide by, and its model norm and bound."""

    weight: float
    """The weight sum, clamped into what honest devices give."""
    norm: float
    norm_bound: float


@dataclass(frozen=True)
class SumBounds:
    """The bounds of one round's sum over ``survivors`` devices."""

    survivors: int
    fedavg: bool
    max_examples: int
    clip_norm: float
    bounds: Mapping[str, float]
    """Each segment's per-device bound (the codec's clip)."""
    quantum: Mapping[str, float]
    """Each segment's ring unit ``2^-s`` in real units."""
    noise_std: Mapping[str, float]
    """Each segment's summed DP noise std per coordinate (0: no DP)."""

    @classmethod
    def of(cls, setup: SecAggSetup, layout: VectorLayout, survivors: int) -> SumBounds:
        """The bounds the round's signed setup and layout give ``survivors``."""
        sigmas = noise_sigmas(setup, layout)
        quantum = {
            s.name: 1.0 / float(1 << c.scale_bits)
            for s, c in zip(layout.segments, layout.codecs, strict=True)
        }
        return cls(
            survivors=survivors,
            fedavg=setup.weighting == "fedavg",
            max_examples=setup.max_examples,
            clip_norm=setup.clip_norm,
            bounds={s.name: s.bound for s in layout.segments},
            quantum=quantum,
            noise_std={
                name: sigma * quantum[name] * math.sqrt(survivors)
                for name, sigma in sigmas.items()
            },
        )

    def slack(self, segment: str, length: int) -> float:
        """L2 slack over ``length`` coordinates: rounding plus the noise tail."""
        rounding = self.survivors * math.sqrt(length) * self.quantum[segment]
        sigma = self.noise_std.get(segment, 0.0)
        noise = sigma * math.sqrt(
            length + 2 * math.sqrt(length * _TAIL_T) + 2 * _TAIL_T
        )
        return rounding + noise

    def check(self, sums: Mapping[str, NDArray[np.float64]]) -> CheckedSum:
        """The weight to divide the model sum by, once ``sums`` passed every check.

        Raises:
            SumOutOfBoundsError: a segment is missing, not finite or out of range.
        """
        n = self.survivors
        if n < 1:
            raise SumOutOfBoundsError("a sum over no device")
        values = {}
        for name, bound in self.bounds.items():
            if name not in sums:
                raise SumOutOfBoundsError(f"segment {name!r} is missing")
            segment = np.asarray(sums[name], dtype=np.float64)
            if not np.all(np.isfinite(segment)):
                raise SumOutOfBoundsError(f"segment {name!r} holds NaN or inf")
            limit = n * bound + self.slack(name, 1)
            top = float(np.max(np.abs(segment))) if segment.size else 0.0
            if top > limit:
                raise SumOutOfBoundsError(
                    f"segment {name!r} holds {top:.6g}, {n} devices give at most "
                    f"{limit:.6g}"
                )
            values[name] = segment
        weight = float(values[WEIGHT_SEGMENT].sum())
        weight_slack = self.slack(WEIGHT_SEGMENT, 1)
        low, high = (n, n * self.max_examples) if self.fedavg else (n, n)
        if not low - weight_slack <= weight <= high + weight_slack:
            raise SumOutOfBoundsError(
                f"weight sum {weight:.6g} outside [{low}, {high}] for {n} devices"
            )
        if "reporting" in values:
            reporting = float(values["reporting"].sum())
            if abs(reporting - n) > self.slack("reporting", 1):
                raise SumOutOfBoundsError(
                    f"{reporting:.6g} devices reported, {n} survived"
                )
        model = values[MODEL_SEGMENT]
        top_weight = min(weight + weight_slack, float(high))
        norm_bound = top_weight * self.clip_norm + self.slack(MODEL_SEGMENT, model.size)
        norm = vector_norm(model)
        if norm > norm_bound:
            raise SumOutOfBoundsError(
                f"model sum norm {norm:.6g} exceeds {norm_bound:.6g} (weight "
                f"{weight:.6g} x clip_norm {self.clip_norm:g} + slack)"
            )
        return CheckedSum(min(max(weight, float(low)), float(high)), norm, norm_bound)
