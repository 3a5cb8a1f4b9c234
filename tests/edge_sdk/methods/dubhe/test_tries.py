"""The agent's choice among tries and its plausibility check."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.edge_sdk.methods.dubhe.tries import (
    best_try,
    plausible_try_sum,
    search_score,
    try_distances,
)


def test_agent_picks_the_try_nearest_uniform() -> None:
    sums = np.array([[2.0, 0.0], [1.2, 0.8], [0.8, 1.2], [1.0, 1.0]])
    counts = np.array([2, 2, 2, 2])
    np.testing.assert_allclose(try_distances(sums, counts), [1.0, 0.2, 0.2, 0.0])
    assert best_try(sums, counts) == 3
    assert best_try(sums[:3], counts[:3]) == 1  # first on ties
    assert best_try(sums, counts, target=np.array([0.6, 0.4])) == 1
    # search score: distance of the mean p_o over tries: mean is (0.625, 0.375)
    assert search_score(sums, counts) == pytest.approx(0.25)


def test_a_try_sum_is_plausible_only_as_count_distributions() -> None:
    assert plausible_try_sum(np.array([1.5, 0.5, 0.0, 1.0]), 3)
    assert plausible_try_sum(np.array([3.0, 0.0]), 3)
    assert not plausible_try_sum(np.array([3.5, -0.5]), 3)  # a negative class
    assert not plausible_try_sum(np.array([2.0, 0.5]), 3)  # short of the count
    assert not plausible_try_sum(np.array([4.0, 0.0]), 3)  # over it
    assert not plausible_try_sum(np.array([np.nan, 3.0]), 3)
    assert not plausible_try_sum(np.array([1.0]), 0)
