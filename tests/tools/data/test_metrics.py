from __future__ import annotations

import math

import numpy as np
import pytest

from ursa.tools.data.metrics import (
    MetricError,
    distance_to_uniform,
    distributions,
    emd_avg,
    global_distribution,
    imbalance_ratio,
    population_distributions,
)

COUNTS = np.array([[6, 2, 0, 0], [0, 0, 4, 4], [2, 2, 2, 2]])


def test_distributions_and_global() -> None:
    np.testing.assert_allclose(distributions(COUNTS)[0], [0.75, 0.25, 0, 0])
    np.testing.assert_allclose(
        global_distribution(COUNTS), [8, 4, 6, 6] / np.float64(24)
    )


def test_emd_avg_by_hand() -> None:
    # global (1/3, 1/6, 1/4, 1/4); L1 per device: 1.0, 1.0, 1/6
    assert emd_avg(COUNTS) == pytest.approx((1.0 + 1.0 + 1 / 6) / 3)
    assert emd_avg(np.tile([3, 1], (5, 1))) == 0.0


def test_imbalance_ratio() -> None:
    assert imbalance_ratio(COUNTS) == 2.0
    assert imbalance_ratio(np.array([10, 1, 5])) == 10.0
    assert math.isinf(imbalance_ratio(np.array([[1, 0], [2, 0]])))


def test_population_distribution_is_the_plain_mean() -> None:
    p = distributions(COUNTS)
    p_o = population_distributions(p, np.array([[0, 1], [1, 2]]))
    np.testing.assert_allclose(p_o[0], [0.375, 0.125, 0.25, 0.25])
    np.testing.assert_allclose(p_o[1], [0.125, 0.125, 0.375, 0.375])
    assert distance_to_uniform(p_o[0]) == pytest.approx(0.25)
    np.testing.assert_allclose(distance_to_uniform(p_o), [0.25, 0.5])
    assert distance_to_uniform(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == 0.0


def test_bad_inputs_raise() -> None:
    with pytest.raises(MetricError):
        distributions(np.array([[1, 0], [0, 0]]))
    with pytest.raises(MetricError):
        emd_avg(np.array([1, 2, 3]))
    with pytest.raises(MetricError):
        global_distribution(np.array([[-1, 2]]))
    with pytest.raises(MetricError):
        population_distributions(np.eye(2), np.zeros((1, 0), dtype=int))
