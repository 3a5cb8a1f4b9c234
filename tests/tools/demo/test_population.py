"""The demo's population: one seed, one dealing, whoever asks for it."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.tools.demo.population import demo_population
from ursa.tools.demo.settings import TrainingDemoSettings


def test_a_seed_deals_the_same_skewed_population_every_time() -> None:
    settings = TrainingDemoSettings(devices=10, seed=3)

    first, again = demo_population(settings), demo_population(settings)
    other = demo_population(TrainingDemoSettings(devices=10, seed=4))

    counts = np.asarray(first.counts)
    assert counts.shape == (10, 10)
    np.testing.assert_array_equal(counts, np.asarray(again.counts))
    assert not np.array_equal(counts, np.asarray(other.counts))
    top_share = counts.max(axis=1) / counts.sum(axis=1)
    assert top_share.mean() > 0.5  # skewed: most of a device's data is one class


def test_a_population_that_cannot_be_dealt_raises_value_error() -> None:
    with pytest.raises(ValueError):
        demo_population(TrainingDemoSettings(devices=10, rho=0.5))


def test_an_emd_out_of_reach_names_one_that_is_reachable() -> None:
    import re

    with pytest.raises(ValueError) as caught:
        demo_population(TrainingDemoSettings(devices=4, k=2, tries=2))
    hint = re.search(r"an EMD of at most ([0-9.]+) \(--emd\)", str(caught.value))
    assert hint is not None, str(caught.value)

    reachable = float(hint.group(1))
    population = demo_population(
        TrainingDemoSettings(devices=4, k=2, tries=2, emd=reachable)
    )
    assert np.asarray(population.counts).shape == (4, 10)
