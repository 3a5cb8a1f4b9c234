"""The key epoch's registry: categories, slots, the one-hot vector."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ursa.edge_sdk.registration import (
    RegistrationError,
    categorize,
    is_one_hot,
    registry_indices,
    registry_vector,
    thresholds_for,
)
from ursa.protocol.codebook import Codebook

CB = Codebook.default(4)  # G = {1, 2, 4}: 4 + 6 + 1 = 11 slots
SIGMA = thresholds_for(CB, (0.6, 0.3))


@pytest.mark.parametrize(
    ("p", "category"),
    [
        ([0.7, 0.1, 0.1, 0.1], (0,)),  # top-1 >= sigma_1
        ([0.1, 0.5, 0.05, 0.35], (1, 3)),  # 2nd largest 0.35 >= sigma_2
        ([0.3, 0.3, 0.2, 0.2], (0, 1)),  # tie: lower class index first
        ([0.4, 0.25, 0.2, 0.15], (0, 1, 2, 3)),  # nothing dominates: sigma_C = 0
        ([0.6, 0.4, 0.0, 0.0], (0,)),  # >= is inclusive
    ],
)
def test_algorithm_1_categories(p: list[float], category: tuple[int, ...]) -> None:
    assert categorize(np.array(p), CB, SIGMA) == category


def test_vectorised_registration_matches_one_device_at_a_time() -> None:
    p = np.random.default_rng(0).dirichlet(np.full(4, 0.5), size=300)
    got = registry_indices(p, CB, SIGMA)
    want = [CB.index_of(categorize(row, CB, SIGMA)) for row in p]
    assert got.tolist() == want


def test_registry_vector_is_one_hot() -> None:
    vector = registry_vector(CB.index_of((1, 3)), CB)
    assert vector.sum() == 1 and vector[4 + 4] == 1  # (1, 3) is the 5th pair


def test_thresholds_validation() -> None:
    assert thresholds_for(CB, (0.7, 0.1)) == {1: 0.7, 2: 0.1, 4: 0.0}
    with pytest.raises(RegistrationError, match="2 sigma values"):
        thresholds_for(CB, (0.7,))
    with pytest.raises(RegistrationError, match=r"\[0, 1\]"):
        thresholds_for(CB, (1.5, 0.1))
    with pytest.raises(RegistrationError, match="sigma_C"):
        registry_indices(np.ones((1, 4)) / 4, CB, {1: 0.5, 2: 0.2, 4: 0.1})


def test_bad_distributions_raise() -> None:
    with pytest.raises(RegistrationError):
        registry_indices(np.ones((2, 3)), CB, SIGMA)
    with pytest.raises(RegistrationError):
        registry_indices(np.array([[0.5, -0.1, 0.3, 0.3]]), CB, SIGMA)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_only_one_one_and_zeros_is_one_hot(values: list[int]) -> None:
    honest = values.count(1) == 1 and values.count(0) == len(values) - 1
    assert is_one_hot(values) is honest
