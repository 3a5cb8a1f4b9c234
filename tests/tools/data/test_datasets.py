"""Tests for ursa.tools.data.datasets: the Dataset type, its helpers and the split."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.tools.data.datasets import (
    Dataset,
    DatasetError,
    dataset_from_arrays,
    labels_from,
    train_test_split,
)


def _toy(n_per_class: tuple[int, ...] = (6, 4, 10)) -> Dataset:
    y = np.repeat(np.arange(len(n_per_class)), n_per_class).astype(np.int64)
    x = np.arange(len(y) * 4, dtype=np.float32).reshape(len(y), 1, 2, 2)
    return Dataset(x, y, len(n_per_class), "toy", (1, 2, 2))


def test_flat_is_a_view_with_one_row_per_sample() -> None:
    data = _toy()
    flat = data.flat()
    assert flat.shape == (20, 4)
    assert np.shares_memory(flat, data.x)
    assert data.num_features == 4


def test_class_counts() -> None:
    assert _toy().class_counts().tolist() == [6, 4, 10]
    assert _toy((3, 0, 2)).class_counts().tolist() == [3, 0, 2]


def test_subset_takes_rows_and_allows_repeats() -> None:
    data = _toy()
    part = data.subset(np.array([19, 0, 0]))
    assert part.y.tolist() == [2, 0, 0]
    np.testing.assert_array_equal(part.x[0], data.x[19])
    assert part.num_classes == 3 and part.input_shape == (1, 2, 2)
    assert len(data.subset(np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize("bad", [[20], [-1], [0.5], [[0, 1]]])
def test_subset_rejects_bad_indices(bad: list[object]) -> None:
    with pytest.raises(DatasetError):
        _toy().subset(np.array(bad))


def test_constructor_validates_shapes_dtypes_and_labels() -> None:
    x = np.zeros((3, 2), np.float32)
    y = np.array([0, 1, 2], np.int64)
    with pytest.raises(DatasetError, match="float32"):
        Dataset(x.astype(np.float64), y, 3, "t", (2,))  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match="int64"):
        Dataset(x, y.astype(np.int32), 3, "t", (2,))  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match="shape"):
        Dataset(x, y, 3, "t", (3,))
    with pytest.raises(DatasetError, match="labels"):
        Dataset(x, y, 2, "t", (2,))


def test_train_test_split_stratified_keeps_class_shares() -> None:
    data = _toy((10, 20, 30))
    train, test = train_test_split(data, 0.2, seed=1)
    assert test.class_counts().tolist() == [2, 4, 6]
    assert train.class_counts().tolist() == [8, 16, 24]
    # disjoint and complete: the features are unique row ids
    rows = np.concatenate([train.flat()[:, 0], test.flat()[:, 0]])
    assert sorted(rows.tolist()) == data.flat()[:, 0].tolist()


def test_train_test_split_is_seeded_and_unstratified_works() -> None:
    data = _toy((10, 20, 30))
    a = train_test_split(data, 0.25, seed=3, stratify=False)[1]
    b = train_test_split(data, 0.25, seed=3, stratify=False)[1]
    c = train_test_split(data, 0.25, seed=4, stratify=False)[1]
    assert len(a) == 15
    np.testing.assert_array_equal(a.x, b.x)
    assert not np.array_equal(a.x, c.x)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 0.001])
def test_train_test_split_rejects_degenerate_fractions(fraction: float) -> None:
    with pytest.raises(DatasetError):
        train_test_split(_toy(), fraction, seed=0)


def test_labels_from_accepts_whole_floats_and_rejects_the_rest() -> None:
    assert labels_from([1.0, 2.0], "t").dtype == np.int64
    for bad in ([1.5], [-1], [], ["a"], [[1]]):
        with pytest.raises(DatasetError):
            labels_from(bad, "t")


def test_dataset_from_arrays_casts_and_infers_classes() -> None:
    data = dataset_from_arrays(
        np.ones((2, 6), np.uint8), np.array([0, 4]), "t", input_shape=(2, 3)
    )
    assert data.x.dtype == np.float32 and data.x.shape == (2, 2, 3)
    assert data.num_classes == 5
    with pytest.raises(DatasetError, match="num_classes"):
        dataset_from_arrays(np.ones((2, 6)), np.array([0, 4]), "t", num_classes=3)
    with pytest.raises(DatasetError, match="samples"):
        dataset_from_arrays(np.ones((3, 6)), np.array([0, 4]), "t")
