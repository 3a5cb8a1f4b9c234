"""Discrete Gaussian noise and conditional rounding for distributed DP.

The distributed discrete Gaussian mechanism (Kairouz, Liu, Steinke, ICML 2021)
has each device round its scaled update to integers, add integer noise drawn
from the discrete Gaussian N_Z(0, sigma_dev^2), and mask the result for secure
aggregation; the coordinator only ever sees the sum, whose noise is the sum of
at least ``parties`` independent shares.

Invariants and caveats:

* **Sampler.** `sample_discrete_gaussian` is Algorithm 3 of Canonne, Kamath,
  Steinke (NeurIPS 2020): rejection from the discrete Laplace with scale
  ``t = floor(sigma) + 1``. The discrete Laplace is drawn as the difference of
  two geometric variables, and the acceptance test uses float64 ``exp``: the
  output is the discrete Gaussian up to float64 rounding of those
  probabilities (relative error ~1e-16), not the bit-exact sampler of the paper.
  The randomness is numpy's generator, and the running time (number of
  rejections) is not constant: pass a generator seeded from the OS, and do not
  rely on it against an adversary who can time the device.
* **Noise per device.** `device_sigma` splits the central std
  ``noise_multiplier * sensitivity`` (real units) over ``parties`` devices in the
  integer units of a fixed-point encoding with ``scale = 2**scale_bits``.
  The sum over ``parties`` or more devices then carries at least the central std.
* **Rounding.** `round_conditionally` is the conditional randomised rounding of
  Kairouz et al. (Algorithm 1, Theorem 1): unbiased stochastic rounding retried
  until the rounded vector's L2 norm is within the inflated bound `inflated_l2`,
  which is the L2 sensitivity the privacy accounting must use. Conditioning on
  the norm makes it very slightly biased towards shorter vectors (``beta=0``
  turns it off: plain stochastic rounding, exactly unbiased, with the looser
  deterministic bound).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ursa.crypto.errors import EncodingError
from ursa.crypto.vector_norm import l2_norm

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DEFAULT_BETA = math.exp(-0.5)
"""Conditional rounding's tail parameter: the paper's choice; <= 2.6 tries expected."""

DEFAULT_MAX_TRIES = 1000
"""Rounding attempts before giving up; each fails with probability <= beta."""

MAX_SIGMA = float(2**48)
"""Largest accepted std: noise beyond the 32-bit ring wraps and means nothing."""

_BATCH_SLACK = 1.4
"""Candidates drawn per missing sample; about 3 in 4 are accepted for large sigma."""


class ConditionalRoundingError(EncodingError):
    """Stochastic rounding kept exceeding the inflated L2 bound (input too long)."""


class RoundedVector(NamedTuple):
    """An integer vector from `round_conditionally` and the L2 bound it satisfies."""

    values: IntArray
    bound_l2: float


def sample_discrete_gaussian(
    sigma: float, size: int, rng: np.random.Generator
) -> IntArray:
    """Draw ``size`` independent samples of N_Z(0, sigma^2).

    Rejection sampling from the discrete Laplace (Canonne, Kamath, Steinke 2020,
    Algorithm 3), vectorised: each pass draws a batch of candidates and keeps the
    accepted ones, so the expected cost is about 1.3 candidates per sample.

    Args:
        sigma: The scale parameter: the variance is at most sigma^2 and within
            1e-6 relative of it for sigma >= 1; exactly 0 gives zeros.
        size: The number of samples.
        rng: The randomness; seed it from the OS for real noise.

    Returns:
        An int64 array of shape ``(size,)``.

    Raises:
        ValueError: ``sigma`` is negative, not finite or above `MAX_SIGMA`, or
            ``size`` is negative.
    """
    if not (math.isfinite(sigma) and 0.0 <= sigma <= MAX_SIGMA):
        raise ValueError(f"sigma must be in [0, {MAX_SIGMA:g}], got {sigma}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    out = np.zeros(size, dtype=np.int64)
    if sigma == 0.0 or size == 0:
        return out
    t = math.floor(sigma) + 1
    # Geometric on {0, 1, ...} with P(k) ∝ exp(-k / t); the difference of two
    # independent ones is the discrete Laplace with P(y) ∝ exp(-|y| / t).
    p_stop = -math.expm1(-1.0 / t)
    shift = sigma * sigma / t
    filled = 0
    while filled < size:
        batch = int((size - filled) * _BATCH_SLACK) + 16
        laplace = rng.geometric(p_stop, batch) - rng.geometric(p_stop, batch)
        accept = np.exp(-((np.abs(laplace) - shift) ** 2) / (2.0 * sigma * sigma))
        kept = laplace[rng.random(batch) < accept][: size - filled]
        out[filled : filled + kept.size] = kept
        filled += kept.size
    return out


def device_sigma(
    noise_multiplier: float, sensitivity: float, scale: float, parties: int
) -> float:
    """Per-device integer std so that ``parties`` shares add up to the central std.

    The central Gaussian mechanism adds std ``noise_multiplier * sensitivity``
    (real units) to the sum; ``scale`` (``2**scale_bits``) converts to integer
    units, and variances add, so each of ``parties`` devices adds
    ``noise_multiplier * sensitivity * scale / sqrt(parties)``. More devices
    than ``parties`` only add noise.

    Args:
        noise_multiplier: Central std over sensitivity (0 disables the noise).
        sensitivity: One device's L2 contribution bound, in real units.
        scale: The fixed-point scale (integer units per real unit), > 0.
        parties: The fewest devices whose noise is in any released sum (the
            secure-aggregation threshold), >= 1.

    Raises:
        ValueError: a negative or non-finite argument, ``scale <= 0`` or
            ``parties < 1``.
    """
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0.0):
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    if not (math.isfinite(sensitivity) and sensitivity >= 0.0):
        raise ValueError(f"sensitivity must be >= 0, got {sensitivity}")
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"scale must be > 0, got {scale}")
    if parties < 1:
        raise ValueError(f"parties must be >= 1, got {parties}")
    return noise_multiplier * sensitivity * scale / math.sqrt(parties)


def inflated_l2(bound_l2: float, dimension: int, beta: float = DEFAULT_BETA) -> float:
    """L2 bound of a rounded vector whose real input has norm <= ``bound_l2``.

    Kairouz et al. (Theorem 1), in integer units:
    ``min(bound + sqrt(d), sqrt(bound^2 + d/4 + sqrt(2 ln(1/beta)) (bound +
    sqrt(d)/2)))``. The first term holds for any rounding that moves each
    coordinate by less than 1; the second only for conditional rounding with
    ``beta`` (``beta=0`` drops it).

    Raises:
        ValueError: a negative bound or dimension, or ``beta`` outside [0, 1).
    """
    if not (math.isfinite(bound_l2) and bound_l2 >= 0.0):
        raise ValueError(f"bound_l2 must be >= 0, got {bound_l2}")
    if dimension < 0:
        raise ValueError(f"dimension must be >= 0, got {dimension}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    root_d = math.sqrt(dimension)
    deterministic = bound_l2 + root_d
    if beta == 0.0:
        return deterministic
    conditional = math.sqrt(
        bound_l2 * bound_l2
        + dimension / 4.0
        + math.sqrt(2.0 * math.log(1.0 / beta)) * (bound_l2 + root_d / 2.0)
    )
    return min(deterministic, conditional)


def round_conditionally(
    values: FloatArray,
    bound_l2: float,
    rng: np.random.Generator,
    *,
    beta: float = DEFAULT_BETA,
    max_tries: int = DEFAULT_MAX_TRIES,
) -> RoundedVector:
    """Stochastically round ``values`` until the result's L2 norm is within bound.

    Each coordinate goes to ``floor(x)`` or ``floor(x) + 1`` with the
    probabilities that make it unbiased; the whole vector is redrawn while its
    norm exceeds ``inflated_l2(bound_l2, len(values), beta)``. Without the
    retry, a rounded vector could be up to ``sqrt(d)`` longer than its input,
    and the privacy accounting would have to use that.

    Args:
        values: The scaled (integer-unit) real vector, already clipped so that
            its L2 norm is at most ``bound_l2``.
        bound_l2: The clip norm in integer units (``clip_norm * 2**scale_bits``).
        rng: The rounding randomness.
        beta: The tail parameter of the inflated bound (0: plain stochastic
            rounding, never retried).
        max_tries: Attempts before giving up.

    Returns:
        The int64 vector and the bound it satisfies (the L2 sensitivity to use).

    Raises:
        ValueError: ``values`` not a finite 1-D vector, its norm above
            ``bound_l2`` (clip first), or ``max_tries < 1``.
        ConditionalRoundingError: no attempt met the bound (probability
            <= ``beta ** max_tries`` for a clipped input).
    """
    vector = np.asarray(values, dtype=np.float64)
    if vector.ndim != 1 or not np.all(np.isfinite(vector)):
        raise ValueError("values must be a finite 1-D vector")
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    bound = inflated_l2(bound_l2, vector.size, beta)
    norm = l2_norm(vector)
    if norm > bound_l2 * (1.0 + 1e-9):
        raise ValueError(f"values have L2 norm {norm:g} > bound {bound_l2:g}: clip")
    floor = np.floor(vector)
    fraction = vector - floor
    base = floor.astype(np.int64)
    for _ in range(max_tries):
        rounded = base + (rng.random(vector.size) < fraction)
        if l2_norm(rounded) <= bound:
            return RoundedVector(rounded, bound)
    raise ConditionalRoundingError(
        f"{max_tries} roundings all exceeded the L2 bound {bound:g}"
    )
