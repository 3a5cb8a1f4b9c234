from __future__ import annotations

import math

import numpy as np
import pytest

from ursa.lab.simulate.feddisk_quality import (
    clean_noisy_mixture,
    spearman,
    weight_quality,
)


def test_spearman_ranks_with_ties() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties get their mean rank: ranks (0.5, 0.5, 2, 3) against (0, 1, 2, 3)
    expected = float(np.corrcoef([0.5, 0.5, 2, 3], [0, 1, 2, 3])[0, 1])
    assert spearman([5, 5, 7, 9], [1, 2, 3, 4]) == pytest.approx(expected)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_mixture_ratio_is_exact_and_has_mean_one_under_the_device() -> None:
    devices = clean_noisy_mixture(
        (0.2, 0.8), 20000, 2, np.random.default_rng(0), noisy_std=3.0
    )

    for device in devices:
        assert device.x.shape == (20000, 2)
        # E_q[p/q] = 1: the reason FedDisk normalises weights to mean 1
        assert device.true_ratio.mean() == pytest.approx(1.0, abs=0.05)
    wide = np.linalg.norm(devices[0].x, axis=1) > 4.0  # almost surely noisy
    # few noisy samples here (0.2), half of the fleet's: p/q_k near 0.5/0.2
    assert devices[0].true_ratio[wide].mean() == pytest.approx(2.5, rel=0.1)
    with pytest.raises(ValueError):
        clean_noisy_mixture((1.5,), 10, 2, np.random.default_rng(0))


def test_weight_quality_scores_per_device_and_counts_the_bounds() -> None:
    truth = [np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0])]
    weights = [np.array([0.5, 1.0, 1.5]), np.array([1.0, 1.0, 1.0])]
    raw = [np.array([0.1, 1.0, 10.0]), np.array([1.0, 1.0, 1.0])]

    quality = weight_quality(raw, weights, truth, (0.1, 10.0))

    assert quality["spearman_mean"] == pytest.approx(0.5)  # constant counts as 0
    assert quality["at_low"] == pytest.approx(1 / 6)
    assert quality["at_high"] == pytest.approx(1 / 6)
