"""The discrete Gaussian sampler, the per-device std and conditional rounding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ursa.crypto.discrete_gaussian import (
    ConditionalRoundingError,
    RoundedVector,
    device_sigma,
    inflated_l2,
    round_conditionally,
    sample_discrete_gaussian,
)
from ursa.crypto.errors import EncodingError


def _exact_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    """N_Z(0, sigma^2) on ``support`` (which must hold all but a negligible mass)."""
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2.0 * sigma * sigma))
    return weights / weights.sum()


@pytest.mark.parametrize("sigma", [1.0, 7.5, 1000.0])
def test_samples_have_mean_zero_and_variance_sigma_squared(sigma: float) -> None:
    rng = np.random.default_rng(1)

    samples = sample_discrete_gaussian(sigma, 200_000, rng)

    assert samples.dtype == np.int64
    assert samples.shape == (200_000,)
    standard_error = sigma / math.sqrt(samples.size)
    assert abs(samples.mean()) < 5 * standard_error
    # The sample variance's relative std is sqrt(2 / n) ~ 0.3 %.
    assert samples.var() / sigma**2 == pytest.approx(1.0, abs=0.02)


def test_frequencies_match_the_exact_pmf() -> None:
    sigma, n = 2.0, 400_000
    support = np.arange(-30, 31)
    pmf = _exact_pmf(sigma, support)

    samples = sample_discrete_gaussian(sigma, n, np.random.default_rng(2))
    counts = np.array([(samples == k).sum() for k in support])

    assert counts.sum() == n  # nothing outside +-15 sigma
    mask = pmf * n >= 20
    chi2 = float((((counts - n * pmf) ** 2) / (n * pmf))[mask].sum())
    dof = int(mask.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)  # ~6 std above its mean


def test_small_sigma_follows_the_discrete_not_the_continuous_variance() -> None:
    # N_Z(0, 0.25) has variance ~0.86 * 0.25: the integer lattice is coarse there.
    sigma = 0.5
    support = np.arange(-20, 21)
    exact_variance = float((_exact_pmf(sigma, support) * support**2).sum())

    samples = sample_discrete_gaussian(sigma, 200_000, np.random.default_rng(3))

    assert samples.var() == pytest.approx(exact_variance, rel=0.02)


def test_zero_sigma_and_zero_size_give_zeros() -> None:
    rng = np.random.default_rng(0)
    assert np.array_equal(sample_discrete_gaussian(0.0, 5, rng), np.zeros(5))
    assert sample_discrete_gaussian(3.0, 0, rng).shape == (0,)


def test_the_same_seed_gives_the_same_noise() -> None:
    first = sample_discrete_gaussian(10.0, 1000, np.random.default_rng(9))
    second = sample_discrete_gaussian(10.0, 1000, np.random.default_rng(9))
    assert np.array_equal(first, second)


@pytest.mark.parametrize("sigma", [-1.0, math.nan, math.inf, 2.0**60])
def test_bad_sigma_is_refused(sigma: float) -> None:
    with pytest.raises(ValueError, match="sigma"):
        sample_discrete_gaussian(sigma, 3, np.random.default_rng(0))


def test_sum_over_devices_has_n_times_the_device_variance() -> None:
    # Arrange: 12 devices, each with the per-device std for a threshold of 12.
    parties, dimension = 12, 50_000
    sigma_dev = device_sigma(1.1, 0.5, 2.0**10, parties)
    rng = np.random.default_rng(4)

    # Act
    total = sum(
        (sample_discrete_gaussian(sigma_dev, dimension, rng) for _ in range(parties)),
        start=np.zeros(dimension, dtype=np.int64),
    )

    # Assert: the sum carries the central std noise_multiplier * sensitivity * scale.
    assert total.var() == pytest.approx(parties * sigma_dev**2, rel=0.03)
    assert math.sqrt(total.var()) / 2.0**10 == pytest.approx(1.1 * 0.5, rel=0.02)


def test_device_sigma_formula() -> None:
    assert device_sigma(1.0, 2.0, 2.0**8, 4) == pytest.approx(2.0 * 256 / 2.0)
    assert device_sigma(0.0, 2.0, 2.0**8, 4) == 0.0


@pytest.mark.parametrize(
    ("noise_multiplier", "sensitivity", "scale", "parties"),
    [(-1.0, 1.0, 1.0, 1), (1.0, -1.0, 1.0, 1), (1.0, 1.0, 0.0, 1), (1.0, 1.0, 1.0, 0)],
)
def test_device_sigma_refuses_bad_arguments(
    noise_multiplier: float, sensitivity: float, scale: float, parties: int
) -> None:
    with pytest.raises(ValueError):
        device_sigma(noise_multiplier, sensitivity, scale, parties)


def test_inflated_bound_is_the_smaller_of_the_two_terms() -> None:
    c, d, beta = 100.0, 400, math.exp(-0.5)
    tail = math.sqrt(2 * math.log(1 / beta))
    conditional = math.sqrt(c * c + d / 4 + tail * (c + 10))
    assert inflated_l2(c, d, beta) == pytest.approx(min(c + 20.0, conditional))
    assert inflated_l2(c, d, 0.0) == pytest.approx(c + 20.0)
    assert inflated_l2(c, d, beta) < inflated_l2(c, d, 0.0)


def _clipped(rng: np.random.Generator, dimension: int, norm: float) -> np.ndarray:
    direction = rng.normal(size=dimension)
    return direction * (norm / np.linalg.norm(direction))


def test_rounding_stays_within_the_inflated_bound() -> None:
    rng = np.random.default_rng(5)
    values = _clipped(rng, 64, 20.0)

    for _ in range(300):
        rounded = round_conditionally(values, 20.0, rng)
        assert isinstance(rounded, RoundedVector)
        assert rounded.values.dtype == np.int64
        assert np.all(np.abs(rounded.values - values) < 1.0)
        assert np.linalg.norm(rounded.values) <= rounded.bound_l2
    assert rounded.bound_l2 == pytest.approx(inflated_l2(20.0, 64))


def test_plain_stochastic_rounding_is_unbiased() -> None:
    rng = np.random.default_rng(6)
    values = _clipped(rng, 32, 10.0)
    trials = 20_000

    rounded = [round_conditionally(values, 10.0, rng, beta=0.0) for _ in range(trials)]
    mean = np.mean([r.values for r in rounded], axis=0)

    # Per coordinate std of the mean is <= 0.5 / sqrt(trials) ~ 0.0035.
    assert np.max(np.abs(mean - values)) < 0.02


def test_conditional_rounding_is_nearly_unbiased() -> None:
    # Conditioning on the norm shrinks slightly; the paper's beta keeps it small.
    rng = np.random.default_rng(7)
    values = _clipped(rng, 32, 10.0)
    trials = 20_000

    mean = np.mean(
        [round_conditionally(values, 10.0, rng).values for _ in range(trials)], axis=0
    )

    assert np.max(np.abs(mean - values)) < 0.05
    assert abs(float(np.linalg.norm(mean)) - 10.0) < 0.25


def test_an_unclipped_input_is_refused() -> None:
    with pytest.raises(ValueError, match="clip"):
        round_conditionally(np.full(4, 3.0), 1.0, np.random.default_rng(0))


class _AlwaysUp:
    """Randomness that rounds every coordinate up: the longest possible vector."""

    def random(self, size: int) -> np.ndarray:
        return np.zeros(size)


def test_a_bound_never_met_raises_a_typed_error() -> None:
    values = np.full(400, 0.5)  # norm 10; all rounded up, norm 20 > bound ~14.8
    with pytest.raises(ConditionalRoundingError) as caught:
        round_conditionally(values, 10.0, _AlwaysUp(), max_tries=3)  # type: ignore[arg-type]
    assert isinstance(caught.value, EncodingError)
