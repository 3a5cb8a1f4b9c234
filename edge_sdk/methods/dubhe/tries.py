"""Dubhe's agent on the device: which of the H tries to adopt (Dubhe §5.3).

The agent (a device) decrypts the per-try sums of the members' label
distributions and answers the try closest to the target (`best_try`); it
refuses a sum no honest members could produce (`plausible_try_sum`). The
parameter search scores one sigma set over all its tries (`search_score`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import DEFAULT_SCALE_BITS
from ursa.edge_sdk.registration import RegistrationError


def try_distances(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> NDArray[np.float64]:
    """``||p_o,h - p_u||_1`` per try; ``p_o,h = sum_h / count_h`` (plain mean).

    Args:
        try_sums: ... x H x C decrypted sums of the members' distributions.
        counts: ... x H member counts.
        target: p_u, uniform when None (or the test-set distribution).
    """
    sums = np.asarray(try_sums, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if (n <= 0).any():
        raise RegistrationError("every try needs at least one member")
    p_o = sums / n[..., None]
    p_u = _target(target, sums.shape[-1])
    return np.asarray(np.abs(p_o - p_u).sum(axis=-1), dtype=np.float64)


def best_try(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> int:
    """The agent's answer ``h* = argmin_h ||p_o,h - p_u||_1`` (first on ties)."""
    return int(np.argmin(try_distances(try_sums, counts, target)))


def plausible_try_sum(
    totals: NDArray[np.floating], count: int, scale_bits: int = DEFAULT_SCALE_BITS
) -> bool:
    """Whether ``count`` honest label distributions can sum to ``totals``.

    Each honest distribution is in [0, 1] per class and sums to 1, up to the
    fixed point's rounding (at most ``2**-(scale_bits + 1)`` a value): so each
    total lies in [0, count] and all add up to ``count``, within that slack. A
    party that encrypts other values directly and keeps the sum within these
    bounds is not caught (packed Paillier has no per-party range proof).
    """
    t = np.asarray(totals, dtype=np.float64)
    if count < 1 or t.ndim != 1 or not np.isfinite(t).all():
        return False
    slack = count * t.size * 2.0**-scale_bits
    inside = bool(((t >= -slack) & (t <= count + slack)).all())
    return inside and abs(float(t.sum()) - count) <= slack


def search_score(
    try_sums: NDArray[np.floating],
    counts: NDArray[np.integer],
    target: NDArray[np.floating] | None = None,
) -> float:
    """Parameter-search score of one sigma set: ``||E_h(p_o,h) - p_u||_1``."""
    sums = np.asarray(try_sums, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    mean = (sums / n[:, None]).mean(axis=0)
    return float(np.abs(mean - _target(target, sums.shape[-1])).sum())


def _target(
    target: NDArray[np.floating] | None, num_classes: int
) -> NDArray[np.float64]:
    if target is None:
        return np.full(num_classes, 1.0 / num_classes)
    t = np.asarray(target, dtype=np.float64)
    if t.shape != (num_classes,) or (t < 0).any() or not np.isclose(t.sum(), 1.0):
        raise RegistrationError("target must be a distribution over the C classes")
    return t
