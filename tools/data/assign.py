"""Materialise a partition: turn a devices x classes count table into sample indices.

A partitioner (Dubhe's rho/EMD tables, CLIMB's mixtures, Dirichlet, FLICKER's
Table 1) produces an `N_devices x C` table of how many samples of each class
each device holds. `assign_by_counts` draws those samples from a labelled data
set, `scale_counts_to_fit` shrinks a table (keeping its shape) so that it fits a
small data set such as digits (~180 samples per class), and `add_feature_noise`
with `noise_levels` gives FedDisk's simulated feature skew: each device's copy of
its samples carries Gaussian noise of its own, increasing variance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

IndexArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


class AssignmentError(ValueError):
    """A count table, label array or noise setting is invalid or cannot be met."""


@dataclass(frozen=True, eq=False)
class Assignment:
    """Sample indices per device, and which classes had to be drawn with replacement.

    Attributes:
        indices: one sorted int64 index array per device (row of the table);
            device `d` holds exactly `counts[d, c]` samples of class `c`.
        resampled_classes: classes drawn with replacement, so some of their
            samples appear more than once (on one device or across devices).
    """

    indices: tuple[IndexArray, ...]
    resampled_classes: tuple[int, ...]

    @property
    def is_resampled(self) -> bool:
        """Whether any sample may appear more than once."""
        return bool(self.resampled_classes)


def _count_table(counts: npt.ArrayLike) -> IndexArray:
    table = np.asarray(counts)
    if table.ndim != 2 or 0 in table.shape or table.dtype.kind not in "iuf":
        raise AssignmentError(
            f"counts must be a 2-D devices x classes numeric table, got {table.shape}"
        )
    if table.dtype.kind == "f" and not np.array_equal(table, np.round(table)):
        raise AssignmentError("counts must be whole numbers")
    if table.size and table.min() < 0:
        raise AssignmentError("counts must be >= 0")
    return table.astype(np.int64)


def _labels(y: npt.ArrayLike, num_classes: int) -> IndexArray:
    labels = np.asarray(y)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise AssignmentError(f"y must be a 1-D integer array, got {labels.dtype}")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise AssignmentError(
            f"labels span [{labels.min()}, {labels.max()}] but the table has "
            f"{num_classes} classes"
        )
    return labels


def assign_by_counts(
    y: npt.ArrayLike,
    counts: npt.ArrayLike,
    rng: np.random.Generator,
    *,
    replace: bool | Literal["auto"] = "auto",
) -> Assignment:
    """Draw sample indices so that device `d` gets `counts[d, c]` samples of class `c`.

    Args:
        y: labels of the data set, `(N,)`, each in `[0, C)`.
        counts: `N_devices x C` table of non-negative whole numbers.
        rng: the random source (the only one used).
        replace: `"auto"`: classes with enough samples are dealt out without
            replacement (no sample on two devices); an over-subscribed class
            deals out shuffled copies of its samples in turn, so each sample is
            used at most `ceil(demand / available)` times, and is reported in
            `resampled_classes`. `False`: over-subscription is an error.
            `True`: every draw is independent, with replacement (bootstrap).

    Raises:
        AssignmentError: on a bad table or labels, a class that is requested
            but has no samples, or over-subscription with `replace=False`.
    """
    table = _count_table(counts)
    num_devices, num_classes = table.shape
    labels = _labels(y, num_classes)
    demand = table.sum(axis=0)
    available = np.bincount(labels, minlength=num_classes)
    missing = np.flatnonzero((demand > 0) & (available == 0))
    if missing.size:
        raise AssignmentError(f"classes {missing.tolist()} are requested but absent")
    over = np.flatnonzero(demand > available)
    if replace is False and over.size:
        c = int(over[0])
        raise AssignmentError(
            f"class {c}: the table asks for {demand[c]} samples, the data has "
            f"{available[c]} (classes over-subscribed: {over.tolist()}); use "
            "scale_counts_to_fit or replace='auto'"
        )
    owners, picks = [], []
    for cls in np.flatnonzero(demand):
        members = np.flatnonzero(labels == cls)
        if replace is True:
            pool = rng.choice(members, size=int(demand[cls]), replace=True)
        else:
            copies = -(-int(demand[cls]) // len(members))  # ceil
            pool = np.concatenate([rng.permutation(members) for _ in range(copies)])
        owners.append(np.repeat(np.arange(num_devices), table[:, cls]))
        picks.append(pool[: demand[cls]])
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    pick = np.concatenate(picks).astype(np.int64) if picks else owner
    order = np.lexsort((pick, owner))
    per_device = np.split(pick[order], np.cumsum(table.sum(axis=1))[:-1])
    resampled = np.flatnonzero(demand) if replace is True else over
    return Assignment(tuple(per_device), tuple(int(c) for c in resampled))


def scale_counts_to_fit(
    counts: npt.ArrayLike, available_per_class: npt.ArrayLike
) -> IndexArray:
    """Shrink a count table by one common factor so every class fits the data.

    The factor is the largest `s <= 1` with `s * demand_c <= available_c` for
    every class, so the table's shape (class mix per device, global imbalance)
    is kept. Entries are rounded per class by largest remainder: each entry is
    within 1 of `s * counts`, zero entries stay zero, and each class total is
    `round(s * demand_c) <= available_c`. Small entries may round to 0, so a
    device may end up with no samples. A table that already fits is returned
    unchanged (as a copy).

    Raises:
        AssignmentError: on a bad table, or a requested class with no samples.
    """
    table = _count_table(counts)
    available = np.asarray(available_per_class)
    if available.shape != (table.shape[1],) or available.dtype.kind not in "iu":
        raise AssignmentError(
            f"available_per_class must be {table.shape[1]} integers, got "
            f"{available.dtype} {available.shape}"
        )
    demand = table.sum(axis=0)
    if ((demand > 0) & (available == 0)).any():
        missing = np.flatnonzero((demand > 0) & (available == 0)).tolist()
        raise AssignmentError(f"classes {missing} are requested but have no samples")
    asked = demand > 0
    factor = min(1.0, float((available[asked] / demand[asked]).min(initial=1.0)))
    if factor >= 1.0:
        unchanged: IndexArray = table.copy()
        return unchanged
    scaled = table * factor
    fitted: IndexArray = np.floor(scaled).astype(np.int64)
    targets = np.minimum(np.round(scaled.sum(axis=0)), available).astype(np.int64)
    for c in range(table.shape[1]):
        extra = int(targets[c] - fitted[:, c].sum())
        if extra > 0:
            remainders = scaled[:, c] - fitted[:, c]
            top = np.argsort(-remainders, kind="stable")[:extra]
            fitted[top, c] += 1
    return fitted


def noise_levels(
    num_devices: int,
    max_sigma: float,
    *,
    linear_in: Literal["variance", "sigma"] = "variance",
) -> npt.NDArray[np.float64]:
    """Per-device noise standard deviations rising from 0 to `max_sigma`.

    FedDisk's simulated MNIST setting gives client `k` variance `k * V / K`,
    i.e. linear in the variance (`linear_in="variance"`, the default):
    `sigma_k = max_sigma * sqrt(k / (K - 1))`. Here the last device gets exactly
    `max_sigma`, so the paper's `V = 0.3` over 100 clients is
    `max_sigma = sqrt(0.3 * 99 / 100)`. `linear_in="sigma"` spaces the standard
    deviations evenly instead.
    """
    if num_devices < 1 or not np.isfinite(max_sigma) or max_sigma < 0:
        raise AssignmentError(
            f"need num_devices >= 1 and a finite max_sigma >= 0, got "
            f"{num_devices}, {max_sigma}"
        )
    ramp = np.linspace(0.0, 1.0, num_devices) if num_devices > 1 else np.ones(1)
    steps = np.sqrt(ramp) if linear_in == "variance" else ramp
    return np.asarray(max_sigma * steps, dtype=np.float64)


def add_feature_noise(
    x: npt.ArrayLike,
    device_indices: Sequence[npt.ArrayLike],
    sigmas: npt.ArrayLike,
    rng: np.random.Generator,
    *,
    clip: tuple[float, float] | None = (0.0, 1.0),
) -> list[FloatArray]:
    """Return each device's samples with its own Gaussian feature noise added.

    Device `d` gets `x[device_indices[d]] + N(0, sigmas[d]**2)` per feature, as
    a new float32 array (one per device, so a sample held by two devices gets
    two independent noisy copies); `x` is never modified. The result is
    clipped to `clip` (FedDisk clips to [0, 1]; pass None to keep it raw).

    Raises:
        AssignmentError: if lengths differ, a sigma is negative or not finite,
            or an index is out of range.
    """
    data = np.asarray(x)
    levels = np.asarray(sigmas, dtype=np.float64)
    if levels.shape != (len(device_indices),):
        raise AssignmentError(
            f"need one sigma per device: {len(device_indices)} devices, "
            f"sigmas of shape {levels.shape}"
        )
    if not np.isfinite(levels).all() or (levels < 0).any():
        raise AssignmentError("sigmas must be finite and >= 0")
    noisy: list[FloatArray] = []
    for d, raw in enumerate(device_indices):
        idx = np.asarray(raw)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if (
            idx.ndim != 1
            or idx.dtype.kind not in "iu"
            or (idx.size and (idx.min() < 0 or idx.max() >= len(data)))
        ):
            raise AssignmentError(
                f"device {d}: indices must be 1-D integers in [0, {len(data)})"
            )
        samples = data[idx].astype(np.float32)
        samples += rng.normal(0.0, levels[d], size=samples.shape).astype(np.float32)
        if clip is not None:
            np.clip(samples, clip[0], clip[1], out=samples)
        noisy.append(samples)
    return noisy
