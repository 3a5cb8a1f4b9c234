from __future__ import annotations

import numpy as np
import pytest

from ursa.lab.simulate.baselines import (
    BaselineError,
    greedy_selection,
    random_selection,
)


def _greedy_oracle(p: np.ndarray, k: int, start: int) -> list[int]:
    """Astraea-style greedy, one device at a time, straight from the definition."""
    c = p.shape[1]
    chosen = [start]
    while len(chosen) < k:
        best, best_kl = -1, np.inf
        for j in range(p.shape[0]):
            if j in chosen:
                continue
            mean = p[[*chosen, j]].mean(axis=0)
            nz = mean > 0
            kl = float(np.sum(mean[nz] * np.log(mean[nz] * c)))  # KL(p || uniform)
            if kl < best_kl - 1e-12:
                best, best_kl = j, kl
        chosen.append(best)
    return sorted(chosen)


def test_random_selection_is_distinct_sorted_and_seeded() -> None:
    a = random_selection(30, 7, 50, np.random.default_rng(1))
    b = random_selection(30, 7, 50, np.random.default_rng(1))
    assert a.shape == (50, 7) and np.array_equal(a, b)
    assert all(len(set(row)) == 7 and list(row) == sorted(row) for row in a)
    assert (
        random_selection(4, 4, 2, np.random.default_rng()).tolist()
        == [[0, 1, 2, 3]] * 2
    )


def test_greedy_matches_the_definition() -> None:
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(5, 0.3), size=40)
    got = greedy_selection(p, 6, 8, np.random.default_rng(2))
    starts = np.random.default_rng(2).integers(40, size=8)
    for row, start in zip(got, starts, strict=True):
        assert row.tolist() == _greedy_oracle(p, 6, int(start))


def test_greedy_balances_one_hot_devices_perfectly() -> None:
    p = np.repeat(np.eye(4), [10, 3, 1, 6], axis=0)  # skewed: class 2 has one device
    chosen = greedy_selection(p, 4, 20, np.random.default_rng(0))
    np.testing.assert_array_equal(p[chosen].mean(axis=1), np.full((20, 4), 0.25))


def test_greedy_chunks_give_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    p = np.random.default_rng(6).dirichlet(np.ones(3), size=25)
    whole = greedy_selection(p, 5, 9, np.random.default_rng(3))
    monkeypatch.setattr("ursa.lab.simulate.baselines.GREEDY_CHUNK_ELEMENTS", 1)
    assert np.array_equal(greedy_selection(p, 5, 9, np.random.default_rng(3)), whole)


def test_bad_requests_raise() -> None:
    with pytest.raises(BaselineError):
        random_selection(5, 6, 1, np.random.default_rng())
    with pytest.raises(BaselineError):
        greedy_selection(np.ones((3, 2)) / 2, 0, 1, np.random.default_rng())
    with pytest.raises(BaselineError):
        greedy_selection(np.ones(3), 1, 1, np.random.default_rng())
