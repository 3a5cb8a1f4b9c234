"""The in-memory data set type, its typed error and a (stratified) train/test split.

Loaders for the standard file formats live in `ursa.tools.data.loaders`; they all
return a `Dataset`. Arrays are float32 features and int64 labels; a `Dataset`
never copies or mutates the arrays it is given (it is frozen, the arrays are
shared), and every operation that changes data returns a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IndexArray = npt.NDArray[np.int64]


class DatasetError(ValueError):
    """A data set is missing, garbled, or inconsistent (the message says which)."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Samples `x` (float32, `N x *input_shape`) with int64 labels `y` in `[0, C)`.

    Attributes:
        x: features, shape `(N, *input_shape)`: `(N, features)` for tabular data,
            `(N, C, H, W)` for images.
        y: labels, shape `(N,)`, int64, each in `[0, num_classes)`.
        num_classes: number of classes (some may have no samples).
        name: short human-readable name, e.g. `"digits"`.
        input_shape: the shape of one sample.
    """

    x: FloatArray
    y: IndexArray
    num_classes: int
    name: str
    input_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.x.dtype != np.float32:
            raise DatasetError(f"{self.name}: x must be float32, got {self.x.dtype}")
        if self.y.dtype != np.int64 or self.y.ndim != 1:
            raise DatasetError(
                f"{self.name}: y must be a 1-D int64 array, got {self.y.dtype} "
                f"with shape {self.y.shape}"
            )
        if self.x.shape != (len(self.y), *self.input_shape):
            raise DatasetError(
                f"{self.name}: x has shape {self.x.shape}, expected "
                f"{(len(self.y), *self.input_shape)} (N labels x input_shape)"
            )
        if self.num_classes < 1:
            raise DatasetError(f"{self.name}: num_classes must be >= 1")
        if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise DatasetError(
                f"{self.name}: labels must lie in [0, {self.num_classes}), got "
                f"[{self.y.min()}, {self.y.max()}]"
            )

    def __len__(self) -> int:
        return len(self.y)

    @property
    def num_features(self) -> int:
        """Number of features per sample (the product of `input_shape`)."""
        return int(np.prod(self.input_shape, dtype=np.int64))

    def flat(self) -> FloatArray:
        """Return `x` as an `N x features` view (no copy)."""
        return self.x.reshape(len(self.y), self.num_features)

    def class_counts(self) -> IndexArray:
        """Return the number of samples of each class, length `num_classes`."""
        return np.bincount(self.y, minlength=self.num_classes).astype(np.int64)

    def subset(self, indices: npt.ArrayLike) -> Dataset:
        """Return a new data set holding the samples at `indices` (repeats allowed).

        Raises:
            DatasetError: if `indices` are not integers or fall outside `[0, N)`.
        """
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise DatasetError(
                f"{self.name}: subset indices must be a 1-D integer array, got "
                f"{idx.dtype} with shape {idx.shape}"
            )
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.y)):
            raise DatasetError(
                f"{self.name}: subset indices must lie in [0, {len(self.y)}), got "
                f"[{idx.min()}, {idx.max()}]"
            )
        return Dataset(
            x=self.x[idx],
            y=self.y[idx],
            num_classes=self.num_classes,
            name=self.name,
            input_shape=self.input_shape,
        )


def train_test_split(
    dataset: Dataset, test_fraction: float, seed: int, *, stratify: bool = True
) -> tuple[Dataset, Dataset]:
    """Split into (train, test), both keeping the original sample order.

    With `stratify`, each class contributes `round(n_c * test_fraction)` samples
    to the test set, so both parts keep the class distribution.

    Raises:
        DatasetError: if `test_fraction` is not in (0, 1) or a part would be empty.
    """
    if not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    if stratify:
        parts = []
        for c in range(dataset.num_classes):
            members = np.flatnonzero(dataset.y == c)
            take = round(len(members) * test_fraction)
            parts.append(rng.permutation(members)[:take])
        test_idx = np.concatenate(parts).astype(np.int64)
    else:
        take = round(len(dataset) * test_fraction)
        test_idx = rng.permutation(len(dataset))[:take].astype(np.int64)
    is_test = np.zeros(len(dataset), dtype=bool)
    is_test[test_idx] = True
    if is_test.all() or not is_test.any():
        raise DatasetError(
            f"{dataset.name}: test_fraction {test_fraction} of {len(dataset)} "
            "samples leaves the train or the test part empty"
        )
    return dataset.subset(np.flatnonzero(~is_test)), dataset.subset(
        np.flatnonzero(is_test)
    )


def labels_from(values: npt.ArrayLike, where: str) -> IndexArray:
    """Return `values` as a non-empty 1-D int64 label array.

    Args:
        values: whole, non-negative numbers (ints, or floats with no fraction).
        where: what to name in the error message (a file, a user, a key).

    Raises:
        DatasetError: if the labels are empty, not 1-D, not whole or negative.
    """
    try:
        raw = np.asarray(values)
    except (ValueError, TypeError) as exc:
        raise DatasetError(f"{where}: labels are not an array: {exc}") from exc
    if raw.ndim != 1 or raw.size == 0:
        raise DatasetError(f"{where}: labels must be a non-empty 1-D sequence")
    if raw.dtype.kind not in "iuf":
        raise DatasetError(f"{where}: labels must be numbers, got dtype {raw.dtype}")
    if raw.dtype.kind == "f" and not np.array_equal(raw, np.round(raw)):
        raise DatasetError(f"{where}: labels must be whole numbers")
    labels = raw.astype(np.int64)
    if labels.min() < 0:
        raise DatasetError(f"{where}: labels must be >= 0, found {labels.min()}")
    return labels


def dataset_from_arrays(
    x: npt.ArrayLike,
    y: IndexArray,
    name: str,
    *,
    num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> Dataset:
    """Build a `Dataset` from any numeric `x` (cast to float32) and labels `y`.

    Args:
        x: `N` samples; reshaped to `(N, *input_shape)`.
        y: labels, e.g. from `labels_from`.
        name: the data set's name.
        num_classes: default: the largest label + 1.
        input_shape: default: `x.shape[1:]`.

    Raises:
        DatasetError: if counts differ, a label is `>= num_classes`, or `x`
            cannot take `input_shape`.
    """
    try:
        features = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError) as exc:
        raise DatasetError(f"{name}: features are not numeric: {exc}") from exc
    if features.ndim < 1 or len(features) != len(y):
        raise DatasetError(f"{name}: {len(features)} samples but {len(y)} labels")
    needed = int(y.max()) + 1 if len(y) else 1
    if num_classes is not None and num_classes < needed:
        raise DatasetError(
            f"{name}: num_classes={num_classes} but a label is {needed - 1}"
        )
    shape = tuple(features.shape[1:]) if input_shape is None else input_shape
    try:
        features = np.ascontiguousarray(features).reshape(len(y), *shape)
    except ValueError as exc:
        raise DatasetError(f"{name}: cannot shape samples as {shape}: {exc}") from exc
    classes = needed if num_classes is None else num_classes
    return Dataset(features, y, classes, name, shape)
