"""Federations: a data set dealt out to N devices (`ursa demo`, the lab's simulators).

Label-skew partitions (``climb``, ``dubhe``, ``dirichlet``): the data
set is split into train and test (stratified, so the test set keeps the
original near-balanced classes, as MNIST's test set does in the papers); a
partitioner of `ursa.tools.data.partition` gives the shape of an N x C count table,
`scale_counts_to_fit` shrinks it by one common factor until every class fits
the training data, and `assign_by_counts` deals out samples without
replacement (``iid``: a shuffled equal split of the training part). For
``climb`` the limiting classes are the majority ones, so all their training
samples are used and each minority class keeps 1/rho of its
samples (CLIMB §4, "we retain only 1/rho portion"); for ``dubhe`` the largest
class is used in full and the smallest keeps 1/rho of it.

Feature skew (``noise``, FedDisk §VI-A.1): the whole data set is shuffled into
N equal parts, device k's copy gets Gaussian noise of variance ``k * V / N``
(`noise_levels`, pixels clipped to [0, 1]), and each device splits its own data
85% / 15% into train and test; the test set is the union of the devices' test
parts (the paper averages the devices' test accuracies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.tools.data.assign import (
    add_feature_noise,
    assign_by_counts,
    noise_levels,
    scale_counts_to_fit,
)
from ursa.tools.data.datasets import Dataset, train_test_split
from ursa.tools.data.metrics import emd_avg, imbalance_ratio
from ursa.tools.data.partition import (
    climb_partition,
    dirichlet_partition,
    dubhe_partition,
)

PARTITIONS = ("climb", "dubhe", "dirichlet", "iid", "noise")
DEFAULT_TEST_FRACTION = 0.25
FEDDISK_TEST_FRACTION = 0.15
_SHAPE_SAMPLES = 1000
"""Samples per device of the count table before it is shrunk to fit."""


@dataclass(frozen=True)
class DeviceData:
    """One device's training set: flattened samples, labels, optional weights."""

    x: npt.NDArray[np.float32]
    y: npt.NDArray[np.int64]
    sample_weights: npt.NDArray[np.float64] | None = None


class FederationError(ValueError):
    """A federation that cannot be built as requested."""


@dataclass(frozen=True)
class PartitionSpec:
    """How to deal the data out (fields unused by a partition are ignored)."""

    kind: str = "climb"
    num_devices: int = 100
    rho: float = 10.0
    alpha: float = 0.1
    num_minority: int = 3
    emd: float = 1.5
    dirichlet_alpha: float = 0.3
    noise_variance: float = 0.3
    test_fraction: float = DEFAULT_TEST_FRACTION


@dataclass(frozen=True)
class Federation:
    """Devices' training data, the test set, and what the partition achieved."""

    devices: tuple[DeviceData, ...]
    test_x: npt.NDArray[np.float32]
    test_y: npt.NDArray[np.int64]
    num_classes: int
    counts: npt.NDArray[np.int64]
    minority_classes: tuple[int, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def num_devices(self) -> int:
        """N."""
        return len(self.devices)

    @property
    def input_dim(self) -> int:
        """Flattened features per sample."""
        return int(self.test_x.shape[1])


def build_federation(
    data: Dataset, spec: PartitionSpec, rng: np.random.Generator
) -> Federation:
    """Deal ``data`` out to ``spec.num_devices`` devices.

    Raises:
        FederationError: an unknown partition, or a device left without samples.
    """
    if spec.kind not in PARTITIONS:
        raise FederationError(
            f"unknown partition {spec.kind!r}; choose from {PARTITIONS}"
        )
    if spec.num_devices < 1:
        raise FederationError(f"need at least one device, got {spec.num_devices}")
    if spec.kind == "noise":
        return _noise_federation(data, spec, rng)
    seed = int(rng.integers(2**31))
    train, test = train_test_split(data, spec.test_fraction, seed)
    if spec.kind == "iid":
        indices = list(np.array_split(rng.permutation(len(train)), spec.num_devices))
    else:
        shape = _count_shape(spec, data.num_classes, rng)
        fitted = scale_counts_to_fit(shape, train.class_counts())
        indices = list(assign_by_counts(train.y, fitted, rng, replace=False).indices)
    if min(len(idx) for idx in indices) == 0:
        empty = sum(len(idx) == 0 for idx in indices)
        raise FederationError(
            f"{empty} devices get no samples: too many devices for this data set"
        )
    x = train.flat()
    devices = tuple(DeviceData(x[idx], train.y[idx]) for idx in indices)
    counts = np.stack(
        [np.bincount(d.y, minlength=data.num_classes) for d in devices]
    ).astype(np.int64)
    minority = tuple(range(spec.num_minority)) if spec.kind == "climb" else ()
    if spec.kind == "dubhe":
        minority = (data.num_classes - 1,)
    summary = {
        "partition": spec.kind,
        "num_devices": spec.num_devices,
        "train_samples": int(counts.sum()),
        "test_samples": len(test),
        "samples_per_device": _spread(counts.sum(axis=1)),
        "class_totals": counts.sum(axis=0).tolist(),
        "rho": imbalance_ratio(counts),
        "emd_avg": emd_avg(counts),
    }
    summary.update(_requested(spec))
    return Federation(
        devices, test.flat(), test.y, data.num_classes, counts, minority, summary
    )


def _count_shape(
    spec: PartitionSpec, num_classes: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    n = spec.num_devices
    if spec.kind == "climb":
        return climb_partition(
            n, num_classes, spec.rho, spec.alpha, rng,
            num_minority=spec.num_minority, samples_per_client=_SHAPE_SAMPLES,
        ).counts  # fmt: skip
    if spec.kind == "dubhe":
        return dubhe_partition(
            n, num_classes, spec.rho, spec.emd, rng, samples_per_client=_SHAPE_SAMPLES
        ).counts
    return dirichlet_partition(
        n, num_classes, spec.dirichlet_alpha, rng, samples_per_client=_SHAPE_SAMPLES
    ).counts


def _noise_federation(
    data: Dataset, spec: PartitionSpec, rng: np.random.Generator
) -> Federation:
    n = spec.num_devices
    if len(data) < 2 * n:
        raise FederationError(f"{len(data)} samples are too few for {n} devices")
    parts = np.array_split(rng.permutation(len(data)), n)
    max_sigma = float(np.sqrt(spec.noise_variance * (n - 1) / n))
    sigmas = noise_levels(n, max_sigma)
    noisy = add_feature_noise(data.flat(), parts, sigmas, rng)
    devices, test_x, test_y = [], [], []
    for idx, x in zip(parts, noisy, strict=True):
        y = data.y[idx]
        order = rng.permutation(len(y))
        n_test = max(1, round(len(y) * FEDDISK_TEST_FRACTION))
        test_part, train_part = order[:n_test], order[n_test:]
        devices.append(DeviceData(x[train_part], y[train_part]))
        test_x.append(x[test_part])
        test_y.append(y[test_part])
    counts = np.stack(
        [np.bincount(d.y, minlength=data.num_classes) for d in devices]
    ).astype(np.int64)
    summary = {
        "partition": "noise",
        "num_devices": n,
        "train_samples": int(counts.sum()),
        "test_samples": int(sum(len(t) for t in test_y)),
        "samples_per_device": _spread(counts.sum(axis=1)),
        "noise_sigma_max": max_sigma,
        "requested_noise_variance": spec.noise_variance,
    }
    return Federation(
        tuple(devices),
        np.concatenate(test_x),
        np.concatenate(test_y),
        data.num_classes,
        counts,
        (),
        summary,
    )


def _spread(values: npt.NDArray[np.int64]) -> dict[str, float]:
    return {
        "min": int(values.min()),
        "mean": float(values.mean()),
        "max": int(values.max()),
    }


def _requested(spec: PartitionSpec) -> dict[str, Any]:
    if spec.kind == "climb":
        return {
            "requested_rho": spec.rho,
            "alpha": spec.alpha,
            "minority_classes": list(range(spec.num_minority)),
        }
    if spec.kind == "dubhe":
        return {"requested_rho": spec.rho, "requested_emd": spec.emd}
    if spec.kind == "dirichlet":
        return {"dirichlet_alpha": spec.dirichlet_alpha}
    return {}
