"""How good FedDisk's weights are where the true density ratio is known.

`clean_noisy_mixture` builds devices that each hold a different share of
"noisy" samples (a wide Gaussian) among "clean" ones (a narrow Gaussian), so
the fleet's density ``p`` and device k's ``q_k`` are known mixtures and the
true weight ``p(x)/q_k(x)`` of every sample is exact. `weight_quality`
scores weights against it: the mean per-device Spearman correlation and the
share of raw weights at the clip bounds. Pure numpy (no scipy, no torch):
`ursa.edge_sdk.methods.feddisk.sample_weights` computes the weights, the caller passes
them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["MixtureDevice", "clean_noisy_mixture", "spearman", "weight_quality"]


@dataclass(frozen=True)
class MixtureDevice:
    """One device's samples and each sample's true ratio ``p(x)/q_k(x)``."""

    x: npt.NDArray[np.float32]
    true_ratio: npt.NDArray[np.float64]
    noisy_share: float


def clean_noisy_mixture(
    noisy_shares: Sequence[float],
    samples: int,
    dim: int,
    rng: np.random.Generator,
    *,
    clean_std: float = 1.0,
    noisy_std: float = 2.5,
) -> list[MixtureDevice]:
    """Devices whose data mix ``N(0, clean_std^2 I)`` and ``N(0, noisy_std^2 I)``.

    Device k draws each sample noisy with probability ``noisy_shares[k]``; the
    fleet's ``p`` mixes them at the shares' mean (equal device sizes), so
    ``p(x)/q_k(x) = (s f_n + (1-s) f_c) / (s_k f_n + (1-s_k) f_c)``.

    Raises:
        ValueError: a share outside [0, 1], or fewer than 1 sample or dim.
    """
    if samples < 1 or dim < 1 or not all(0.0 <= s <= 1.0 for s in noisy_shares):
        raise ValueError("need samples, dim >= 1 and shares in [0, 1]")
    fleet = float(np.mean(noisy_shares))
    devices = []
    for share in noisy_shares:
        noisy = rng.random(samples) < share
        std = np.where(noisy, noisy_std, clean_std)[:, None]
        x = rng.standard_normal((samples, dim)) * std
        log_c = _log_gauss(x, clean_std)
        log_n = _log_gauss(x, noisy_std)
        ratio = _mix(fleet, log_n, log_c) - _mix(share, log_n, log_c)
        devices.append(MixtureDevice(x.astype(np.float32), np.exp(ratio), share))
    return devices


def spearman(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Spearman's rank correlation (ties get their mean rank); nan if constant."""
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b))
    if ra.size < 2 or ra.std() == 0.0 or rb.std() == 0.0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def weight_quality(
    raw: Sequence[npt.ArrayLike],
    weights: Sequence[npt.ArrayLike],
    true_ratio: Sequence[npt.ArrayLike],
    clip: tuple[float, float],
) -> dict[str, float]:
    """Per-device Spearman of weights vs the true ratio (mean, min); bound shares.

    Devices whose weights are constant (nan correlation) count as 0.
    """
    rhos = [spearman(w, t) for w, t in zip(weights, true_ratio, strict=True)]
    flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in raw])
    return {
        "spearman_mean": float(np.mean([0.0 if math.isnan(r) else r for r in rhos])),
        "spearman_min": float(np.nanmin(rhos))
        if not all(map(math.isnan, rhos))
        else math.nan,
        "at_low": float(np.mean(flat <= clip[0])),
        "at_high": float(np.mean(flat >= clip[1])),
    }


def _log_gauss(x: npt.NDArray[np.float64], std: float) -> npt.NDArray[np.float64]:
    d = x.shape[1]
    out: npt.NDArray[np.float64] = -0.5 * np.sum((x / std) ** 2, axis=1) - d * (
        math.log(std) + 0.5 * math.log(2.0 * math.pi)
    )
    return out


def _mix(
    share: float, log_n: npt.NDArray[np.float64], log_c: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``log(share * f_n + (1 - share) * f_c)``, stable."""
    with np.errstate(divide="ignore"):
        out: npt.NDArray[np.float64] = np.logaddexp(
            math.log(share) + log_n if share > 0 else -np.inf + log_n,
            math.log1p(-share) + log_c if share < 1 else -np.inf + log_c,
        )
    return out


def _ranks(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(v.size, dtype=np.float64)
    ranks[order] = np.arange(v.size, dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    mean_rank: npt.NDArray[np.float64] = (sums / counts)[inverse]
    return mean_rank
