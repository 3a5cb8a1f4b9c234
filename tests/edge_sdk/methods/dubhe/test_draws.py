"""Dubhe's volunteer draws: eq. (6)'s coin and the stratified quotas."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.edge_sdk.methods.dubhe.draws import (
    assign_ranks,
    participation_probabilities,
    participation_probability,
    stratified_quotas,
    stratified_volunteer,
    stratified_volunteers,
    volunteer,
)
from ursa.edge_sdk.registration import (
    RegistrationError,
)


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
