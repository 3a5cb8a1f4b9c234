from __future__ import annotations

import numpy as np
import pytest

from ursa.lab.simulate.participants import make_selector
from ursa.tools.data.metrics import distributions
from ursa.tools.data.partition import dubhe_partition


def _population() -> np.ndarray:
    counts = dubhe_partition(200, 10, 10.0, 1.5, np.random.default_rng(0)).counts
    return distributions(counts)


def test_random_and_all() -> None:
    p = _population()
    select, info = make_selector("random", p, 20, np.random.default_rng(0))
    chosen = select(0)
    assert info["kind"] == "random" and len(set(chosen.tolist())) == 20
    everyone, info = make_selector("random", p, 200, np.random.default_rng(0))
    assert info["kind"] == "all" and everyone(3).tolist() == list(range(200))


def test_dubhe_picks_k_and_beats_random_on_class_balance() -> None:
    p = _population()
    dubhe, info = make_selector("dubhe", p, 20, np.random.default_rng(1), tries=10)
    rand, _ = make_selector("random", p, 20, np.random.default_rng(1))

    def distance(select) -> float:  # type: ignore[no-untyped-def]
        return float(
            np.mean([np.abs(p[select(r)].mean(0) - 0.1).sum() for r in range(30)])
        )

    assert info["kind"] == "dubhe" and len(info["sigma"]) == 3
    assert all(len(set(dubhe(r).tolist())) == 20 for r in range(5))
    assert distance(dubhe) < 0.6 * distance(rand)


def test_same_seed_same_sets_and_bad_requests() -> None:
    p = _population()
    a, _ = make_selector("dubhe", p, 10, np.random.default_rng(5), tries=5)
    b, _ = make_selector("dubhe", p, 10, np.random.default_rng(5), tries=5)
    assert [a(r).tolist() for r in range(3)] == [b(r).tolist() for r in range(3)]
    with pytest.raises(ValueError, match="unknown selection"):
        make_selector("greedy", p, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="K"):
        make_selector("random", p, 0, np.random.default_rng(0))
