"""The device half's data after a run: labels and samples with the final counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ursa.edge_sdk.methods.flicker.method import (
    Flicker,
    load_features,
    resample_indices,
)
from ursa.edge_sdk.methods_config import FlickerSpec


def test_count_level_resampling_keeps_copies_and_drops_a_class_own_samples() -> None:
    labels = np.array([0, 0, 0, 0, 1, 2, 2], dtype=np.int64)
    rng = np.random.default_rng(0)

    picked = resample_indices(labels, (2, 3, 2), rng)

    assert np.bincount(labels[picked], minlength=3).tolist() == [2, 3, 2]
    assert set(picked[labels[picked] == 1]) == {4}  # copies of its own sample
    assert len(set(picked[labels[picked] == 0])) == 2  # no sample twice


def test_without_a_run_the_data_is_unchanged() -> None:
    labels = np.array([0, 1, 1], dtype=np.int64)
    x = np.arange(3, dtype=np.float32)[:, None]

    samples, out = Flicker(FlickerSpec(), labels=labels, x=x).resampled()

    assert samples is x and out is labels


def test_a_features_file_becomes_the_shared_extractor(tmp_path: Path) -> None:
    path = tmp_path / "features.npz"
    np.savez(path, centroids=np.eye(3, 4), temperature=0.5)

    extractor = load_features(path)

    assert extractor.centroids.shape == (3, 4) and extractor.temperature == 0.5
    np.savez(path, centroids=np.eye(3, 4), temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        load_features(path)


def test_non_square_samples_cannot_be_resampled_as_images() -> None:
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures

    labels = np.array([0, 1], dtype=np.int64)
    extractor = CentroidFeatures(np.eye(2, 5), 1.0)

    with pytest.raises(ValueError, match="not square"):
        Flicker(labels=labels, x=np.zeros((2, 5)), extractor=extractor)
