"""RandomSelection: exactly K eligible devices, uniformly, reproducibly."""

from __future__ import annotations

import numpy as np

from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.selection_method import SelectionRequest


def request(eligible: set[str], k: int, seed: int = 0) -> SelectionRequest:
    return SelectionRequest(
        round=1,
        epoch=1,
        k=k,
        eligible=frozenset(eligible),
        rng=np.random.default_rng(seed),
    )


def test_waits_while_fewer_than_k_are_eligible() -> None:
    assert RandomSelection().select(request({"a", "b"}, k=3)) is None


def test_names_k_distinct_eligible_devices_sorted() -> None:
    eligible = {f"d{i:02d}" for i in range(10)}
    selection = RandomSelection().select(request(eligible, k=4))
    assert selection is not None and selection.try_index is None
    chosen = selection.selected
    assert len(set(chosen)) == 4 and set(chosen) <= eligible
    assert list(chosen) == sorted(chosen)


def test_the_same_seed_draws_the_same_set_whatever_the_set_order() -> None:
    eligible = [f"d{i:02d}" for i in range(10)]
    first = RandomSelection().select(request(set(eligible), k=3, seed=5))
    again = RandomSelection().select(request(set(reversed(eligible)), k=3, seed=5))
    assert first == again


def test_every_device_is_chosen_about_k_over_n_of_the_time() -> None:
    n, k, draws = 10, 3, 4000
    eligible = {f"d{i:02d}" for i in range(n)}
    method, rng = RandomSelection(), np.random.default_rng(1)
    counts = dict.fromkeys(eligible, 0)
    for _ in range(draws):
        selection = method.select(
            SelectionRequest(
                round=1, epoch=1, k=k, eligible=frozenset(eligible), rng=rng
            )
        )
        assert selection is not None
        for device in selection.selected:
            counts[device] += 1
    expected = draws * k / n  # 1200; a binomial sd of about 29
    assert all(abs(c - expected) < 6 * 29 for c in counts.values()), counts
