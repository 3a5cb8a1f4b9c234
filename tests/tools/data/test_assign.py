"""Tests for ursa.tools.data.assign: count tables to indices, scaling, feature noise."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.tools.data.assign import (
    AssignmentError,
    add_feature_noise,
    assign_by_counts,
    noise_levels,
    scale_counts_to_fit,
)

# 3 classes with 10, 6 and 4 samples, shuffled
Y = np.random.default_rng(0).permutation(np.repeat([0, 1, 2], [10, 6, 4]))


def _held(y: np.ndarray, indices: tuple[np.ndarray, ...], classes: int) -> np.ndarray:
    return np.array([np.bincount(y[idx], minlength=classes) for idx in indices])


def test_assign_gives_exact_counts_without_overlap() -> None:
    counts = np.array([[5, 0, 1], [3, 6, 0], [2, 0, 3]])
    result = assign_by_counts(Y, counts, np.random.default_rng(1))
    assert len(result.indices) == 3
    np.testing.assert_array_equal(_held(Y, result.indices, 3), counts)
    together = np.concatenate(result.indices)
    assert len(np.unique(together)) == len(together) == counts.sum()
    assert result.resampled_classes == () and not result.is_resampled
    assert all(idx.dtype == np.int64 for idx in result.indices)


def test_assign_is_reproducible_from_the_generator() -> None:
    counts = np.array([[2, 1, 1], [3, 2, 0]])
    a = assign_by_counts(Y, counts, np.random.default_rng(7))
    b = assign_by_counts(Y, counts, np.random.default_rng(7))
    c = assign_by_counts(Y, counts, np.random.default_rng(8))
    assert all(np.array_equal(p, q) for p, q in zip(a.indices, b.indices, strict=True))
    assert not all(
        np.array_equal(p, q) for p, q in zip(a.indices, c.indices, strict=True)
    )


def test_assign_auto_reuses_an_oversubscribed_class_evenly() -> None:
    counts = np.array(
        [[2, 4, 3], [2, 4, 3], [0, 0, 3]]
    )  # class 1: 8 of 6, class 2: 9 of 4
    result = assign_by_counts(Y, counts, np.random.default_rng(2))
    np.testing.assert_array_equal(_held(Y, result.indices, 3), counts)
    assert result.resampled_classes == (1, 2) and result.is_resampled
    together = np.concatenate(result.indices)
    uses = np.bincount(together, minlength=len(Y))
    assert uses[Y == 0].max() == 1  # class 0 fits: no reuse
    assert uses[Y == 1].max() == 2 and uses[Y == 2].max() == 3  # ceil(8/6), ceil(9/4)
    assert (uses[Y == 2] >= 2).all()  # every sample is used before any is reused twice


def test_assign_without_replacement_refuses_oversubscription() -> None:
    with pytest.raises(AssignmentError, match=r"class 2.*asks for 5.*has 4"):
        assign_by_counts(Y, [[0, 0, 5]], np.random.default_rng(0), replace=False)
    ok = assign_by_counts(Y, [[0, 0, 4]], np.random.default_rng(0), replace=False)
    assert sorted(ok.indices[0].tolist()) == np.flatnonzero(Y == 2).tolist()


def test_assign_with_replacement_draws_bootstrap_samples() -> None:
    counts = np.array([[30, 0, 0], [0, 0, 30]])
    result = assign_by_counts(Y, counts, np.random.default_rng(3), replace=True)
    np.testing.assert_array_equal(_held(Y, result.indices, 3), counts)
    assert result.resampled_classes == (0, 2)
    assert len(np.unique(result.indices[0])) < 30


def test_assign_handles_empty_devices() -> None:
    result = assign_by_counts(Y, [[0, 0, 0], [1, 1, 1]], np.random.default_rng(0))
    assert result.indices[0].size == 0 and result.indices[1].size == 3


@pytest.mark.parametrize(
    ("y", "counts", "match"),
    [
        (Y, [[1, 1]], "table has 2 classes"),
        (Y, [[1, -1, 0]], ">= 0"),
        (Y, [[1.5, 0, 0]], "whole"),
        (Y, [1, 1, 1], "2-D"),
        (Y, np.zeros((0, 3)), "2-D"),
        (np.array([0, 0, 2]), [[0, 1, 0]], r"classes \[1\].*absent"),
        (Y.astype(float), [[1, 1, 1]], "integer"),
    ],
)
def test_assign_rejects_bad_inputs(y: np.ndarray, counts: object, match: str) -> None:
    with pytest.raises(AssignmentError, match=match):
        assign_by_counts(y, counts, np.random.default_rng(0))  # type: ignore[arg-type]


def test_scale_counts_keeps_a_table_that_fits() -> None:
    counts = np.array([[3, 1], [2, 2]])
    scaled = scale_counts_to_fit(counts, np.array([5, 3]))
    np.testing.assert_array_equal(scaled, counts)
    assert scaled is not counts


def test_scale_counts_shrinks_by_one_factor_and_fits() -> None:
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 300, size=(40, 10))
    counts[:, 9] = rng.integers(0, 30, size=40)  # a minority class
    counts[3, 4] = 0
    available = np.full(10, 180)
    scaled = scale_counts_to_fit(counts, available)
    assert (scaled.sum(axis=0) <= available).all()
    assert scaled.sum(axis=0).max() >= 179  # the binding class is (nearly) full
    factor = (available / counts.sum(axis=0)).min()
    assert (np.abs(scaled - counts * factor) < 1).all()  # shape kept, entry by entry
    assert scaled[3, 4] == 0
    np.testing.assert_array_equal(
        scaled.sum(axis=0), np.round(counts.sum(axis=0) * factor)
    )
    assign_by_counts(np.repeat(np.arange(10), 180), scaled, rng, replace=False)


def test_scale_counts_rejects_impossible_tables() -> None:
    with pytest.raises(AssignmentError, match="no samples"):
        scale_counts_to_fit([[1, 1]], np.array([3, 0]))
    with pytest.raises(AssignmentError, match="2 integers"):
        scale_counts_to_fit([[1, 1]], np.array([3, 0, 1]))


def test_noise_levels_are_linear_in_variance_by_default() -> None:
    sigmas = noise_levels(5, 2.0)
    np.testing.assert_allclose(sigmas**2, [0.0, 1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(
        noise_levels(5, 2.0, linear_in="sigma"), [0, 0.5, 1, 1.5, 2]
    )
    np.testing.assert_allclose(noise_levels(1, 0.7), [0.7])
    with pytest.raises(AssignmentError):
        noise_levels(0, 1.0)
    with pytest.raises(AssignmentError):
        noise_levels(3, -1.0)


def test_feature_noise_grows_with_device_index_and_does_not_mutate() -> None:
    rng = np.random.default_rng(9)
    x = np.full((400, 1, 4, 4), 0.5, dtype=np.float32)
    before = x.copy()
    groups = [np.arange(k * 100, (k + 1) * 100) for k in range(4)]
    sigmas = noise_levels(4, 0.3)
    noisy = add_feature_noise(x, groups, sigmas, rng, clip=None)
    np.testing.assert_array_equal(x, before)
    assert [n.shape for n in noisy] == [(100, 1, 4, 4)] * 4
    assert all(n.dtype == np.float32 for n in noisy)
    spread = [float(np.std(n - 0.5)) for n in noisy]
    assert spread[0] == 0.0
    assert spread[1] < spread[2] < spread[3]
    np.testing.assert_allclose(spread[1:], sigmas[1:], rtol=0.1)


def test_feature_noise_clips_and_gives_shared_samples_independent_copies() -> None:
    rng = np.random.default_rng(1)
    x = np.full((10, 3), 0.5, dtype=np.float32)
    noisy = add_feature_noise(x, [np.arange(10), np.arange(10)], [2.0, 2.0], rng)
    assert all(n.min() >= 0.0 and n.max() <= 1.0 for n in noisy)
    assert not np.array_equal(noisy[0], noisy[1])
    empty = add_feature_noise(x, [np.array([], dtype=np.int64)], [1.0], rng)
    assert empty[0].shape == (0, 3)


@pytest.mark.parametrize(
    ("indices", "sigmas"),
    [
        ([np.arange(2)], [1.0, 2.0]),
        ([np.arange(2)], [-1.0]),
        ([np.arange(2)], [np.nan]),
        ([np.array([0, 10])], [1.0]),
        ([np.array([0.0, 1.0])], [1.0]),
    ],
)
def test_feature_noise_rejects_bad_inputs(
    indices: list[np.ndarray], sigmas: list[float]
) -> None:
    with pytest.raises(AssignmentError):
        add_feature_noise(np.zeros((10, 2)), indices, sigmas, np.random.default_rng(0))
