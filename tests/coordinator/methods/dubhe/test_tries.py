"""Dubhe's tentative sets: exactly K per try, reproducible, repaired when short."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.methods.dubhe.tries import (
    complete_tries,
    fallback_selection,
    make_tries,
)
from ursa.coordinator.selection import SelectionError


def test_make_tries_gives_exactly_k_per_try_preferring_volunteers() -> None:
    draws = {f"d{i}": (i < 2, i < 6, True) for i in range(8)}
    tries = make_tries(draws, 4, 3, np.random.default_rng(0))
    assert [len(t) for t in tries] == [4, 4, 4]
    assert {"d0", "d1"} <= set(tries[0])  # 2 volunteers, topped up with 2 others
    assert set(tries[1]) <= {f"d{i}" for i in range(6)}  # 6 volunteers, trimmed
    assert all(len(set(t)) == 4 for t in tries)


def test_make_tries_is_reproducible_and_refuses_too_few() -> None:
    draws = {f"d{i}": (bool(i % 2),) for i in range(5)}
    a = make_tries(draws, 2, 1, np.random.default_rng(3))
    b = make_tries(dict(reversed(list(draws.items()))), 2, 1, np.random.default_rng(3))
    assert a == b
    with pytest.raises(SelectionError):
        make_tries(draws, 6, 1, np.random.default_rng(0))


def test_complete_tries_and_fallback() -> None:
    tries = [("a", "b"), ("b", "c"), ("c", "d")]
    assert complete_tries(tries, {"a", "b", "c"}) == (0, 1)
    assert fallback_selection(tries, (1,), ["a"], 2, np.random.default_rng(0)) == (
        1,
        ("b", "c"),
    )
    h, chosen = fallback_selection(
        tries, (), ["b", "d", "e"], 2, np.random.default_rng(0)
    )
    assert h is None and "b" in chosen and len(chosen) == 2 and "a" not in chosen
