"""The cross-round disaggregation attack on per-round sums of bias changes."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ursa.bench.disaggregation import (
    NO_EVIDENCE,
    SolverUnavailableError,
    disaggregate,
    dominant_class_recovery,
    participation_matrix,
    synthetic_federation,
)

POPULATION = {"devices": 20, "classes": 10, "per_round": 8, "rounds": 25}


def _recovery(seed: int, noise_std: float) -> float:
    federation = synthetic_federation(
        np.random.default_rng(seed), noise_std=noise_std, **POPULATION
    )
    attack = disaggregate(
        federation.round_sums,
        federation.participation,
        baseline=federation.global_share,
    )
    return dominant_class_recovery(federation.counts, attack.dominant)


def test_noise_free_sums_give_away_most_dominant_classes() -> None:
    # Arrange
    federation = synthetic_federation(np.random.default_rng(0), **POPULATION)

    # Act
    attack = disaggregate(
        federation.round_sums,
        federation.participation,
        baseline=federation.global_share,
    )

    # Assert: 25 rounds of 8 pin down all 20 devices' class shares.
    shares = federation.counts / federation.counts.sum(axis=1, keepdims=True)
    assert dominant_class_recovery(federation.counts, attack.dominant) >= 0.9
    assert np.allclose(attack.profiles, shares, atol=1e-6)


def test_noise_free_recovery_holds_across_populations() -> None:
    recoveries = [_recovery(seed, 0.0) for seed in range(10)]
    assert min(recoveries) >= 0.9


def test_heavy_noise_brings_the_attack_down_to_chance() -> None:
    # noise std 10 class shares per round sum, against a signal of ~1.
    recoveries = [_recovery(seed, 10.0) for seed in range(20)]
    chance = 1 / POPULATION["classes"]
    assert np.mean(recoveries) == pytest.approx(chance, abs=0.08)


def test_recovery_degrades_as_noise_grows() -> None:
    means = [
        np.mean([_recovery(seed, std) for seed in range(10)])
        for std in (0.0, 0.3, 10.0)
    ]
    assert means[0] > means[1] > means[2]


def test_a_linear_calibration_maps_bias_changes_to_shares() -> None:
    federation = synthetic_federation(np.random.default_rng(1), **POPULATION)
    learning_rate = 0.05
    bias_changes = learning_rate * federation.round_sums
    classes = POPULATION["classes"]

    attack = disaggregate(
        bias_changes,
        federation.participation,
        calibration=np.eye(classes) / learning_rate,
        baseline=federation.global_share,
    )

    plain = disaggregate(
        federation.round_sums,
        federation.participation,
        baseline=federation.global_share,
    )
    assert np.array_equal(attack.dominant, plain.dominant)
    assert np.allclose(attack.profiles, plain.profiles, atol=1e-9)


def test_a_device_in_no_round_has_no_evidence() -> None:
    federation = synthetic_federation(np.random.default_rng(2), **POPULATION)
    participation = federation.participation.copy()
    participation[:, 0] = 0
    sums = participation @ (
        federation.counts / federation.counts.sum(axis=1, keepdims=True)
    )

    attack = disaggregate(sums, participation)

    assert attack.dominant[0] == NO_EVIDENCE
    assert np.all(attack.profiles[0] == 0.0)


def test_participation_matrix_from_round_members() -> None:
    devices = ["a", "b", "c"]

    matrix = participation_matrix([{"a", "c"}, {"b"}, set()], devices)

    assert matrix.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="unknown"):
        participation_matrix([{"z"}], devices)


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="participation"):
        disaggregate(np.zeros((3, 2)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match="calibration"):
        disaggregate(np.zeros((3, 2)), np.zeros((3, 5)), calibration=np.eye(3))
    with pytest.raises(ValueError, match="baseline"):
        disaggregate(np.zeros((3, 2)), np.zeros((3, 5)), baseline=np.zeros(3))


def test_recovery_counts_ties_and_refuses_no_evidence() -> None:
    counts = np.array([[5, 5, 0], [0, 1, 9], [3, 2, 1], [1, 1, 1]])

    score = dominant_class_recovery(counts, np.array([1, 2, 1, NO_EVIDENCE]))

    assert score == pytest.approx(2 / 4)


def test_missing_scipy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(SolverUnavailableError, match=r"ursa-fl\[sim\]"):
        disaggregate(np.zeros((2, 2)), np.ones((2, 2)))
