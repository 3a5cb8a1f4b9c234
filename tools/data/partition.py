"""Partitioners: N x C integer label-count matrices with known skew.

* `dubhe_partition`: global imbalance ratio rho from half-normal class sizes
  and a requested average L1 distance EMD_avg between each device's label
  distribution and the global one (Dubhe §6.1.1). The paper does not publish
  its generator; this one is built so both figures land on the request.
* `climb_partition`: CLIMB §4: balanced classes with minority classes kept at
  1/rho, then each device gets an alpha share of i.i.d. data and a (1 - alpha)
  share cut from the label-sorted data.
* `dirichlet_partition`: device distributions drawn from Dirichlet(alpha * prior).
* `table_partition`: an explicit count table (e.g. FLICKER Table 1).

The Dubhe and CLIMB generators share one construction. A device's
distribution is ``(1 - s_k) p_g + s_k q_k``: an i.i.d. part with the global
distribution p_g and a skewed part q_k that is the device's contiguous piece
of the label-sorted data (pieces of length proportional to s_k tile the sorted
data, so q_k is mostly one class, two where a piece straddles a class
boundary). Because the pieces tile the data, the mean of the device
distributions is exactly p_g whatever the skews s_k are. Counts come from
systematic rounding of ``samples_per_client * p_k`` with a random offset per
device, which keeps every row sum exact and every class total unbiased. The
Dubhe generator then bisects the common scale of the skews so that EMD_avg
measured on the rounded counts meets the request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ursa.tools.data.metrics import emd_avg, imbalance_ratio

DEFAULT_SAMPLES_PER_CLIENT = 500
DEFAULT_SKEW_SPREAD = 0.0
"""Device skews s_k = min(1, t * b_k) with b_k uniform in [1 - spread, 1]."""
EMD_TOLERANCE = 0.01
"""Relative tolerance of the bisection on EMD_avg (the request is met to 1%)."""


class PartitionError(ValueError):
    """A partition that cannot be generated as requested."""


@dataclass(frozen=True)
class Population:
    """A generated population: its counts and what was asked of it."""

    counts: NDArray[np.int64]
    method: str
    requested: Mapping[str, float] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        """N, the number of devices."""
        return int(self.counts.shape[0])

    @property
    def num_classes(self) -> int:
        """C, the number of classes."""
        return int(self.counts.shape[1])

    @property
    def rho(self) -> float:
        """Achieved global imbalance ratio."""
        return imbalance_ratio(self.counts)

    @property
    def emd_avg(self) -> float:
        """Achieved average L1 distance of device distributions to the global one."""
        return emd_avg(self.counts)

    def summary(self) -> dict[str, Any]:
        """Achieved rho and EMD_avg beside the requested values (JSON-ready)."""
        out: dict[str, Any] = {
            "method": self.method,
            "rho": self.rho,
            "emd_avg": self.emd_avg,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
        }
        out.update({f"requested_{k}": v for k, v in self.requested.items()})
        return out


def half_normal_proportions(num_classes: int, rho: float) -> NDArray[np.float64]:
    """Class proportions on a half-normal curve with max/min exactly ``rho``.

    Class c gets ``exp(-x_c^2 / 2 s^2)`` with ``x_c = c / (C - 1)`` and
    ``s^2 = 1 / (2 ln rho)``: class 0 is the most frequent, class C-1 the least.
    """
    if num_classes < 2:
        raise PartitionError(f"need at least 2 classes, got {num_classes}")
    if not rho >= 1.0:
        raise PartitionError(f"rho must be >= 1, got {rho}")
    x = np.arange(num_classes) / (num_classes - 1)
    sizes = np.exp(-np.log(rho) * x**2)
    return np.asarray(sizes / sizes.sum(), dtype=np.float64)


def systematic_round(
    values: NDArray[np.floating], offsets: NDArray[np.floating]
) -> NDArray[np.int64]:
    """Round each row to integers with the row's sum kept (rows must sum to integers).

    Each entry becomes its floor or ceiling; with offsets uniform in [0, 1) the
    result is unbiased per entry.
    """
    x = np.asarray(values, dtype=np.float64)
    cum = np.cumsum(x, axis=1)
    cum[:, -1] = np.round(cum[:, -1])
    upper = np.floor(cum + offsets[:, None])
    lower = np.concatenate([np.floor(offsets)[:, None], upper[:, :-1]], axis=1)
    return np.asarray(upper - lower, dtype=np.int64)


def _skewed_pieces(
    p_global: NDArray[np.float64], skews: NDArray[np.float64], order: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Device distributions ``(1 - s_k) p_g + s_k q_k`` (see the module docstring)."""
    total = skews.sum()
    if total <= 0:
        return np.tile(p_global, (skews.size, 1))
    ends = np.empty(skews.size)
    ends[order] = np.cumsum(skews[order]) / total
    starts = ends - skews / total
    class_end = np.cumsum(p_global)
    class_start = class_end - p_global
    overlap = np.minimum(ends[:, None], class_end) - np.maximum(
        starts[:, None], class_start
    )
    # s_k q_k = total * overlap_k
    mixed = (1.0 - skews)[:, None] * p_global + total * np.clip(overlap, 0.0, None)
    return np.asarray(mixed, dtype=np.float64)


def _check_sizes(num_clients: int, samples_per_client: int) -> None:
    if num_clients < 1:
        raise PartitionError(f"need at least 1 client, got {num_clients}")
    if samples_per_client < 1:
        raise PartitionError(
            f"samples_per_client must be >= 1, got {samples_per_client}"
        )


def dubhe_partition(
    num_clients: int,
    num_classes: int,
    rho: float,
    emd: float,
    rng: np.random.Generator,
    *,
    samples_per_client: int = DEFAULT_SAMPLES_PER_CLIENT,
    skew_spread: float = DEFAULT_SKEW_SPREAD,
) -> Population:
    """Dubhe's synthetic population: global imbalance ``rho``, average EMD ``emd``.

    Raises:
        PartitionError: bad sizes, or ``emd`` above what this rho and C allow
            (the message gives the maximum).
    """
    _check_sizes(num_clients, samples_per_client)
    if not 0.0 <= skew_spread < 1.0:
        raise PartitionError(f"skew_spread must be in [0, 1), got {skew_spread}")
    if emd < 0:
        raise PartitionError(f"EMD_avg must be >= 0, got {emd}")
    p_global = half_normal_proportions(num_classes, rho)
    base = rng.uniform(1.0 - skew_spread, 1.0, num_clients)
    order = rng.permutation(num_clients)
    offsets = rng.random(num_clients)

    def build(scale: float) -> NDArray[np.int64]:
        skews = np.minimum(1.0, scale * base)
        dist = _skewed_pieces(p_global, skews, order)
        return systematic_round(dist * samples_per_client, offsets)

    low, high = 0.0, 1.0 / base.min()
    counts = build(high)
    top = emd_avg(counts)
    if emd > top * (1 + EMD_TOLERANCE):
        raise PartitionError(
            f"EMD_avg {emd} is out of reach: at most {top:.3f} for rho={rho}, "
            f"C={num_classes} and {num_clients} devices; ask for an EMD of at "
            f"most {math.floor(top * 100) / 100:.2f} (--emd), or more devices"
        )
    best, best_gap = counts, abs(top - emd)
    for _ in range(60):
        counts = build((low + high) / 2)
        got = emd_avg(counts)
        if abs(got - emd) < best_gap:
            best, best_gap = counts, abs(got - emd)
        if best_gap <= EMD_TOLERANCE * max(emd, 1e-3):
            break
        if got < emd:
            low = (low + high) / 2
        else:
            high = (low + high) / 2
    return Population(best, "dubhe", {"rho": float(rho), "emd": float(emd)})


def climb_partition(
    num_clients: int,
    num_classes: int,
    rho: float,
    alpha: float,
    rng: np.random.Generator,
    *,
    num_minority: int = 1,
    samples_per_client: int = DEFAULT_SAMPLES_PER_CLIENT,
) -> Population:
    """CLIMB's population: classes 0..m-1 at 1/rho, alpha i.i.d. + (1-alpha) sorted."""
    _check_sizes(num_clients, samples_per_client)
    if not 0.0 <= alpha <= 1.0:
        raise PartitionError(f"alpha must be in [0, 1], got {alpha}")
    if not 0 <= num_minority < num_classes:
        raise PartitionError(f"num_minority must be in 0..{num_classes - 1}")
    if not rho >= 1.0:
        raise PartitionError(f"rho must be >= 1, got {rho}")
    sizes = np.ones(num_classes)
    sizes[:num_minority] = 1.0 / rho
    p_global = sizes / sizes.sum()
    skews = np.full(num_clients, 1.0 - alpha)
    dist = _skewed_pieces(p_global, skews, rng.permutation(num_clients))
    counts = systematic_round(dist * samples_per_client, rng.random(num_clients))
    return Population(
        counts,
        "climb",
        {"rho": float(rho), "alpha": float(alpha), "minority": num_minority},
    )


def dirichlet_partition(
    num_clients: int,
    num_classes: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    samples_per_client: int = DEFAULT_SAMPLES_PER_CLIENT,
    prior: NDArray[np.floating] | None = None,
) -> Population:
    """Device distributions ~ Dirichlet(alpha * C * prior); prior uniform by default."""
    _check_sizes(num_clients, samples_per_client)
    if alpha <= 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    base = (
        np.full(num_classes, 1.0 / num_classes) if prior is None else np.asarray(prior)
    )
    if base.shape != (num_classes,) or (base <= 0).any():
        raise PartitionError("prior must be a positive vector over the C classes")
    base = base / base.sum()
    dist = rng.dirichlet(alpha * num_classes * base, size=num_clients)
    counts = systematic_round(dist * samples_per_client, rng.random(num_clients))
    return Population(counts, "dirichlet", {"alpha": float(alpha)})


def table_partition(table: NDArray[np.integer] | list[list[int]]) -> Population:
    """An explicit count table: one row per device, one column per class."""
    raw = np.asarray(table)
    if raw.ndim != 2 or raw.shape[0] < 1 or raw.shape[1] < 2:
        raise PartitionError("a count table needs one row per device and >= 2 classes")
    if not np.issubdtype(raw.dtype, np.integer) or (raw < 0).any():
        raise PartitionError("counts must be non-negative integers")
    if (raw.sum(axis=1) == 0).any():
        raise PartitionError("every device needs at least one sample")
    return Population(raw.astype(np.int64), "table", {})
