"""Dubhe's tentative sets: exactly K per try, reproducible, repaired when short."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.methods.dubhe.tries import (
    common_suspects,
    complete_tries,
    fallback_selection,
    make_tries,
    short_tries,
    without,
)
from ursa.coordinator.selection import SelectionError


def test_make_tries_gives_exactly_k_per_try_preferring_volunteers() -> None:
    draws = {f"d{i}": (i < 2, i < 6, True) for i in range(8)}
    tries = make_tries(draws, draws, 4, 3, np.random.default_rng(0))
    assert [len(t) for t in tries] == [4, 4, 4]
    assert {"d0", "d1"} <= set(tries[0])  # 2 volunteers, topped up with 2 others
    assert set(tries[1]) <= {f"d{i}" for i in range(6)}  # 6 volunteers, trimmed
    assert all(len(set(t)) == 4 for t in tries)


def test_the_top_up_draws_from_silent_eligible_devices_never_offline_ones() -> None:
    volunteers = {"v0": (True, False), "gone": (False, True)}  # gone: now offline
    eligible = {"v0", "s1", "s2", "s3"}  # s*: silent (they drew no everywhere)
    seen: set[str] = set()
    for seed in range(40):
        first, second = make_tries(
            volunteers, eligible, 2, 2, np.random.default_rng(seed)
        )
        assert "v0" in first and "gone" not in first and len(set(first)) == 2
        assert "gone" in second and len(set(second)) == 2
        seen |= set(first) | set(second)
    assert seen == {"v0", "gone", "s1", "s2", "s3"}  # every silent one is drawn


def test_make_tries_is_reproducible_and_refuses_too_few() -> None:
    draws = {f"d{i}": (bool(i % 2),) for i in range(5)}
    a = make_tries(draws, set(draws), 2, 1, np.random.default_rng(3))
    backwards = dict(reversed(list(draws.items())))
    b = make_tries(backwards, sorted(draws), 2, 1, np.random.default_rng(3))
    assert a == b
    with pytest.raises(SelectionError):
        make_tries(draws, draws, 6, 1, np.random.default_rng(0))


def test_short_tries_only_when_fewer_than_k_to_choose_from() -> None:
    assert not short_tries({}, {"a", "b"}, 2)  # nobody volunteered: top-up
    assert short_tries({}, {"a"}, 2)
    assert short_tries({"x": (True, False)}, {"a"}, 2)  # try 1 has only a
    assert not short_tries({"x": (True, True)}, {"a"}, 2)


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


def test_without_takes_members_out_and_an_emptied_try_is_never_complete() -> None:
    tries = (("a", "b"), ("b", "c"), ("c",))
    left = without(tries, {"b", "c"})
    assert left == (("a",), (), ())
    assert complete_tries(left, frozenset({"a"})) == (0,)


def test_the_common_suspects_are_the_members_of_every_bad_try() -> None:
    tries = (("a", "b", "x"), ("c", "x"), ("b", "d", "x"))
    assert common_suspects(tries, [0, 1, 2]) == ("x",)
    assert common_suspects(tries, [0, 2]) == ("b", "x")
    assert common_suspects((("a",), ("b",)), [0, 1]) == ()
    assert common_suspects(tries, []) == ()
