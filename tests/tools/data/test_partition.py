from __future__ import annotations

import numpy as np
import pytest

from ursa.tools.data.metrics import distributions, emd_avg, imbalance_ratio
from ursa.tools.data.partition import (
    PartitionError,
    climb_partition,
    dirichlet_partition,
    dubhe_partition,
    half_normal_proportions,
    systematic_round,
    table_partition,
)


def test_half_normal_class_sizes_have_the_exact_ratio() -> None:
    p = half_normal_proportions(10, 10.0)
    assert p.sum() == pytest.approx(1.0)
    assert p[0] / p[-1] == pytest.approx(10.0)
    assert (np.diff(p) < 0).all()
    np.testing.assert_allclose(half_normal_proportions(4, 1.0), 0.25)


@pytest.mark.parametrize(
    ("classes", "rho", "emd"),
    [(10, 10.0, 1.5), (10, 10.0, 0.5), (10, 2.0, 1.0), (10, 5.0, 0.0), (52, 10.0, 1.5)],
)
def test_dubhe_partition_hits_rho_and_emd(classes: int, rho: float, emd: float) -> None:
    population = dubhe_partition(300, classes, rho, emd, np.random.default_rng(0))
    counts = population.counts
    assert counts.shape == (300, classes) and counts.dtype == np.int64
    assert (counts >= 0).all() and (counts.sum(axis=1) == 500).all()
    assert population.rho == pytest.approx(rho, rel=0.05)
    if emd > 0:
        assert population.emd_avg == pytest.approx(emd, rel=0.05)
    else:
        assert population.emd_avg < 0.05  # rounding only
    summary = population.summary()
    assert summary["requested_rho"] == rho and summary["requested_emd"] == emd
    assert summary["emd_avg"] == emd_avg(counts) and summary["rho"] == population.rho


def test_dubhe_partition_with_spread_skews_still_hits_the_request() -> None:
    population = dubhe_partition(
        400, 10, 10.0, 1.2, np.random.default_rng(1), skew_spread=0.8
    )
    assert population.emd_avg == pytest.approx(1.2, rel=0.05)
    assert population.rho == pytest.approx(10.0, rel=0.05)


def test_dubhe_partition_is_seeded() -> None:
    a = dubhe_partition(50, 10, 10.0, 1.0, np.random.default_rng(7)).counts
    b = dubhe_partition(50, 10, 10.0, 1.0, np.random.default_rng(7)).counts
    assert np.array_equal(a, b)


def test_unreachable_emd_raises_with_the_maximum() -> None:
    with pytest.raises(PartitionError, match=r"at most 1\.7"):
        dubhe_partition(200, 10, 10.0, 1.95, np.random.default_rng(0))
    with pytest.raises(PartitionError):
        dubhe_partition(200, 10, 10.0, -0.1, np.random.default_rng(0))
    with pytest.raises(PartitionError):
        dubhe_partition(200, 10, 0.5, 1.0, np.random.default_rng(0))


def test_systematic_round_keeps_row_sums_and_rounds_each_entry() -> None:
    rng = np.random.default_rng(2)
    values = rng.dirichlet(np.ones(6), size=100) * 37
    counts = systematic_round(values, rng.random(100))
    assert (counts.sum(axis=1) == 37).all()
    assert (np.abs(counts - values) < 1).all()


def test_climb_partition_keeps_minority_classes_at_one_over_rho() -> None:
    population = climb_partition(
        100, 10, 10.0, 0.1, np.random.default_rng(0), num_minority=3
    )
    totals = population.counts.sum(axis=0)
    assert totals[:3] / totals[3:].mean() == pytest.approx([0.1] * 3, rel=0.05)
    assert imbalance_ratio(population.counts) == pytest.approx(10.0, rel=0.05)
    # (1 - alpha) of each device comes from one label-sorted piece
    top = distributions(population.counts).max(axis=1)
    assert np.median(top) > 0.85


def test_climb_alpha_one_is_iid() -> None:
    population = climb_partition(50, 10, 5.0, 1.0, np.random.default_rng(0))
    assert population.emd_avg < 0.05


def test_dirichlet_partition() -> None:
    skewed = dirichlet_partition(200, 10, 0.05, np.random.default_rng(0))
    flat = dirichlet_partition(200, 10, 100.0, np.random.default_rng(0))
    assert (skewed.counts.sum(axis=1) == 500).all()
    assert skewed.emd_avg > 1.2 > 0.3 > flat.emd_avg
    with pytest.raises(PartitionError):
        dirichlet_partition(
            10, 3, 1.0, np.random.default_rng(), prior=np.array([1, 0, 1])
        )


def test_table_partition() -> None:
    population = table_partition([[10, 0, 5], [1, 2, 3]])
    assert population.counts.tolist() == [[10, 0, 5], [1, 2, 3]]
    assert population.rho == pytest.approx(11 / 2)
    for bad in ([[1, -1]], [[0, 0], [1, 1]], [[1.5, 2.0]], [1, 2]):
        with pytest.raises(PartitionError):
            table_partition(bad)  # type: ignore[arg-type]
