"""Selection and population metrics: ||p_o - p_u||_1, EMD_avg, imbalance ratio rho."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


class MetricError(ValueError):
    """Input a metric cannot be computed on (bad shape, empty device, no data)."""


def _counts(counts: NDArray[np.integer] | NDArray[np.floating]) -> NDArray[np.float64]:
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 1:
        raise MetricError("counts must be an N x C matrix")
    if (c < 0).any():
        raise MetricError("counts must be non-negative")
    return c


def distributions(
    counts: NDArray[np.integer] | NDArray[np.floating],
) -> NDArray[np.float64]:
    """Each device's label distribution: its row of counts divided by its total."""
    c = _counts(counts)
    totals = c.sum(axis=1, keepdims=True)
    if (totals <= 0).any():
        raise MetricError("every device needs at least one sample")
    return np.asarray(c / totals, dtype=np.float64)


def global_distribution(
    counts: NDArray[np.integer] | NDArray[np.floating],
) -> NDArray[np.float64]:
    """The class distribution of all samples together."""
    totals = _counts(counts).sum(axis=0)
    if totals.sum() <= 0:
        raise MetricError("the population has no samples")
    return np.asarray(totals / totals.sum(), dtype=np.float64)


def emd_avg(counts: NDArray[np.integer] | NDArray[np.floating]) -> float:
    """Average over devices of ``||p_k - p_global||_1`` (Dubhe §6.1.1; 0 to < 2)."""
    p = distributions(counts)
    return float(np.abs(p - global_distribution(counts)).sum(axis=1).mean())


def imbalance_ratio(counts: NDArray[np.integer] | NDArray[np.floating]) -> float:
    """rho: samples of the most frequent class over the least frequent (inf if 0)."""
    c = np.asarray(counts, dtype=np.float64)
    totals = c.sum(axis=0) if c.ndim == 2 else c
    if totals.ndim != 1 or totals.size < 1 or (totals < 0).any():
        raise MetricError("need class totals or an N x C count matrix")
    low = totals.min()
    return float("inf") if low == 0 else float(totals.max() / low)


def population_distributions(
    distributions: NDArray[np.floating], selections: NDArray[np.integer]
) -> NDArray[np.float64]:
    """p_o per selection: the plain mean of the selected devices' distributions.

    Args:
        distributions: N x C.
        selections: ... x K device indices.

    Returns:
        ... x C.
    """
    p = np.asarray(distributions, dtype=np.float64)
    s = np.asarray(selections, dtype=np.int64)
    if s.shape[-1] < 1:
        raise MetricError("a selection needs at least one device")
    return np.asarray(p[s].mean(axis=-2), dtype=np.float64)


def distance_to_uniform(
    p_o: NDArray[np.floating], target: NDArray[np.floating] | None = None
) -> NDArray[np.float64]:
    """``||p_o - p_u||_1`` over the last axis; p_u uniform unless `target` is given."""
    p = np.asarray(p_o, dtype=np.float64)
    t = (
        np.full(p.shape[-1], 1.0 / p.shape[-1])
        if target is None
        else np.asarray(target)
    )
    return np.asarray(np.abs(p - t).sum(axis=-1), dtype=np.float64)
