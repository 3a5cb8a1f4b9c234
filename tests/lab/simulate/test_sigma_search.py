"""The one sigma search both simulators use (`ursa.lab.simulate.sigma_search`)."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.selection import sigma_grid
from ursa.edge_sdk.methods.dubhe.tries import search_score
from ursa.lab.simulate.participants import make_selector
from ursa.lab.simulate.selection_sums import (
    DISTRIBUTION_SCALE,
    SumBackend,
    plain_try_sums,
)
from ursa.lab.simulate.sigma_search import search_sigma
from ursa.protocol.codebook import Codebook
from ursa.tools.data.metrics import distributions
from ursa.tools.data.partition import dubhe_partition

CODEBOOK = Codebook.default(10)


def _population(seed: int = 0) -> np.ndarray:
    counts = dubhe_partition(150, 10, 10.0, 1.5, np.random.default_rng(seed)).counts
    return distributions(counts)


def test_the_adopted_point_is_the_grid_point_with_the_lowest_score() -> None:
    p = _population()
    recorded: list[np.ndarray] = []

    def recording(fixed: np.ndarray, sets: np.ndarray) -> np.ndarray:
        sums = plain_try_sums(fixed, sets)
        recorded.append(sums[0] / DISTRIBUTION_SCALE)
        return sums

    backend = SumBackend(try_sums=recording)
    point, score = search_sigma(p, CODEBOOK, 10, tries=20, steps=4, backend=backend)
    grid = sigma_grid(CODEBOOK, 4)
    scores = [search_score(sums, np.full(20, 10)) for sums in recorded]
    assert len(scores) == len(grid) > 1 and len(set(scores)) > 1
    assert point == grid[int(np.argmin(scores))] and score == min(scores)
    assert search_sigma(p, CODEBOOK, 10, tries=20, steps=4) == (point, score)
    assert search_sigma(p, CODEBOOK, 10, tries=20, steps=4, seed=9) != (point, score)


def test_the_distance_score_and_a_bad_score() -> None:
    p = _population(1)
    paper = search_sigma(p, CODEBOOK, 10, tries=20, steps=4, seed=0)
    distance = search_sigma(
        p, CODEBOOK, 10, tries=20, steps=4, seed=0, score="distance"
    )
    assert distance[0] in sigma_grid(CODEBOOK, 4)
    assert distance[1] >= paper[1]  # E||x|| >= ||E x|| (the triangle inequality)
    with pytest.raises(ValueError, match="search score"):
        search_sigma(p, CODEBOOK, 10, score="best")
    with pytest.raises(ValueError, match="draw"):
        search_sigma(p, CODEBOOK, 10, steps=2, draw="magic")


def test_simulate_train_adopts_the_same_search() -> None:
    p = _population()
    _, info = make_selector("dubhe", p, 10, np.random.default_rng(4), tries=5)
    seed = int(np.random.default_rng(4).integers(2**63))
    point, _ = search_sigma(p, CODEBOOK, 10, seed=seed)
    assert info["sigma"] == [*point, 0.0]
