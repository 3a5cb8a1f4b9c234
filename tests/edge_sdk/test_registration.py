from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ursa.edge_sdk.registration import (
    RegistrationError,
    assign_ranks,
    best_try,
    categorize,
    is_one_hot,
    participation_probabilities,
    participation_probability,
    plausible_try_sum,
    registry_indices,
    registry_vector,
    search_score,
    stratified_quotas,
    stratified_volunteer,
    stratified_volunteers,
    thresholds_for,
    try_distances,
    volunteer,
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


def test_participation_probability_is_eq_6() -> None:
    registry = np.array([3, 0, 1, 0, 0, 0, 0, 0, 0, 0, 6])  # ||R_A||_0 = 3
    assert participation_probability(registry, 0, 2) == pytest.approx(2 / 9)
    assert participation_probability(registry, 2, 2) == pytest.approx(2 / 3)
    assert participation_probability(registry, 2, 5) == 1.0  # capped
    indices = np.repeat([0, 2, 10], [3, 1, 6])
    # expected volunteers sum to K when K < ||R_A||_0 (eq. 7)
    assert participation_probabilities(registry, indices, 2).sum() == pytest.approx(2)


def test_probability_rejects_inconsistent_registry() -> None:
    with pytest.raises(RegistrationError, match="own slot"):
        participation_probability(np.array([1, 0, 2]), 1, 1)
    with pytest.raises(RegistrationError):
        participation_probability(np.array([1.0, 2.0]), 0, 1)


def test_coin() -> None:
    rng = np.random.default_rng(0)
    assert not volunteer(0.0, rng)
    assert volunteer(1.0, rng)
    hits = sum(volunteer(0.25, rng) for _ in range(4000))
    assert 900 < hits < 1100


def test_agent_picks_the_try_nearest_uniform() -> None:
    sums = np.array([[2.0, 0.0], [1.2, 0.8], [0.8, 1.2], [1.0, 1.0]])
    counts = np.array([2, 2, 2, 2])
    np.testing.assert_allclose(try_distances(sums, counts), [1.0, 0.2, 0.2, 0.0])
    assert best_try(sums, counts) == 3
    assert best_try(sums[:3], counts[:3]) == 1  # first on ties
    assert best_try(sums, counts, target=np.array([0.6, 0.4])) == 1
    # search score: distance of the mean p_o over tries: mean is (0.625, 0.375)
    assert search_score(sums, counts) == pytest.approx(0.25)


def test_assign_ranks_counts_earlier_entries_of_the_same_slot() -> None:
    assert assign_ranks(np.array([2, 0, 2, 2, 0, 5])).tolist() == [0, 0, 1, 2, 1, 0]


REGISTRY = np.array([0, 5, 1, 1, 30, 0, 2, 100, 0, 0, 0])


@pytest.mark.parametrize("k", [1, 3, 7, 20, 50, 139, 500])
def test_stratified_quotas_sum_exactly_and_fit_their_slots(k: int) -> None:
    quotas = np.array([stratified_quotas(REGISTRY, k, 9, r, 0) for r in range(300)])
    assert (quotas.sum(axis=1) == min(k, REGISTRY.sum())).all()
    assert (quotas <= REGISTRY).all()
    assert (quotas[:, REGISTRY == 0] == 0).all()


def test_stratified_quotas_average_the_water_filled_share() -> None:
    # K=20 over 6 non-empty slots of sizes 5,1,1,30,2,100: level 5.5 -> 5,1,1,5.5,2,5.5
    quotas = np.array([stratified_quotas(REGISTRY, 20, 4, r, 1) for r in range(2000)])
    want = np.array([0, 5, 1, 1, 5.5, 0, 2, 5.5, 0, 0, 0])
    np.testing.assert_allclose(quotas.mean(axis=0), want, atol=0.05)
    assert set(np.unique(quotas[:, 4])) == {5, 6}


def test_each_slot_sends_exactly_its_quota_and_devices_agree() -> None:
    indices = np.repeat(np.arange(REGISTRY.size), REGISTRY)
    ranks = assign_ranks(indices[::-1])[::-1]  # any per-slot permutation
    for round_index in range(5):
        quotas = stratified_quotas(REGISTRY, 20, 11, round_index, 2)
        chosen = stratified_volunteers(REGISTRY, indices, ranks, 20, 11, round_index, 2)
        assert np.bincount(indices[chosen], minlength=REGISTRY.size).tolist() == (
            quotas.tolist()
        )
        one_by_one = [
            stratified_volunteer(REGISTRY, int(i), int(r), 20, 11, round_index, 2)
            for i, r in zip(indices, ranks, strict=True)
        ]
        assert one_by_one == chosen.tolist()


def test_stratified_marginals_equal_the_papers_probability() -> None:
    registry = np.array([40, 10, 0, 25, 5])
    indices = np.repeat(np.arange(5), registry)
    ranks = assign_ranks(indices)
    rounds = 3000
    hits = np.zeros(indices.size)
    for r in range(rounds):
        hits += stratified_volunteers(registry, indices, ranks, 3, 5, r, 0)
    want = participation_probabilities(registry, indices, 3)  # 3 / (R(u) * 4)
    np.testing.assert_allclose(hits / rounds, want, atol=0.02)


def test_stratified_draw_changes_with_round_and_try() -> None:
    indices = np.repeat(np.arange(REGISTRY.size), REGISTRY)
    ranks = assign_ranks(indices)
    a = stratified_volunteers(REGISTRY, indices, ranks, 20, 1, 0, 0)
    b = stratified_volunteers(REGISTRY, indices, ranks, 20, 1, 1, 0)
    c = stratified_volunteers(REGISTRY, indices, ranks, 20, 1, 0, 1)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_stratified_input_errors() -> None:
    with pytest.raises(RegistrationError, match="rank"):
        stratified_volunteer(REGISTRY, 2, 1, 5, 0, 0, 0)  # slot 2 has one device
    with pytest.raises(RegistrationError, match="empty"):
        stratified_quotas(np.zeros(4, dtype=int), 5, 0, 0, 0)
    with pytest.raises(RegistrationError, match="non-negative"):
        stratified_quotas(REGISTRY, 5, -1, 0, 0)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_only_one_one_and_zeros_is_one_hot(values: list[int]) -> None:
    honest = values.count(1) == 1 and values.count(0) == len(values) - 1
    assert is_one_hot(values) is honest


def test_a_try_sum_is_plausible_only_as_count_distributions() -> None:
    assert plausible_try_sum(np.array([1.5, 0.5, 0.0, 1.0]), 3)
    assert plausible_try_sum(np.array([3.0, 0.0]), 3)
    assert not plausible_try_sum(np.array([3.5, -0.5]), 3)  # a negative class
    assert not plausible_try_sum(np.array([2.0, 0.5]), 3)  # short of the count
    assert not plausible_try_sum(np.array([4.0, 0.0]), 3)  # over it
    assert not plausible_try_sum(np.array([np.nan, 3.0]), 3)
    assert not plausible_try_sum(np.array([1.0]), 0)
