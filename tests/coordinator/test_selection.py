from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.selection import (
    SelectionError,
    choose_try,
    draw_tries,
    finalize_selections,
    sigma_grid,
)
from ursa.protocol.codebook import Codebook


def test_surplus_volunteers_are_trimmed_to_k_of_them() -> None:
    volunteers = np.zeros(50, dtype=bool)
    volunteers[[3, 7, 9, 20, 33, 41]] = True
    chosen = finalize_selections(volunteers, 4, np.random.default_rng(0))
    assert chosen.shape == (4,)
    assert set(chosen) <= {3, 7, 9, 20, 33, 41}
    assert chosen.tolist() == sorted(chosen.tolist())


def test_shortfall_keeps_every_volunteer_and_tops_up() -> None:
    volunteers = np.zeros(50, dtype=bool)
    volunteers[[5, 6]] = True
    chosen = finalize_selections(volunteers, 10, np.random.default_rng(1))
    assert len(set(chosen)) == 10 and {5, 6} <= set(chosen)


def test_offline_devices_are_never_chosen() -> None:
    online = np.ones(30, dtype=bool)
    online[:20] = False
    volunteers = np.ones((100, 30), dtype=bool)  # even offline "volunteers"
    chosen = finalize_selections(volunteers, 10, np.random.default_rng(2), online)
    assert (chosen >= 20).all()
    assert all(len(set(row)) == 10 for row in chosen)


def test_trim_and_top_up_are_uniform() -> None:
    # 4 volunteers, K=2: each volunteer kept half the time;
    # 1 volunteer, K=3: each of the 9 others topped up 2/9 of the time.
    rng = np.random.default_rng(3)
    surplus = np.zeros((4000, 10), dtype=bool)
    surplus[:, :4] = True
    kept = np.bincount(finalize_selections(surplus, 2, rng).ravel(), minlength=10)
    np.testing.assert_allclose(kept[:4] / 4000, 0.5, atol=0.03)
    assert kept[4:].sum() == 0
    short = np.zeros((4000, 10), dtype=bool)
    short[:, 0] = True
    topped = np.bincount(finalize_selections(short, 3, rng).ravel(), minlength=10)
    assert topped[0] == 4000
    np.testing.assert_allclose(topped[1:] / 4000, 2 / 9, atol=0.03)


def test_k_equal_to_n_selects_everyone() -> None:
    chosen = finalize_selections(
        np.zeros((2, 5), dtype=bool), 5, np.random.default_rng()
    )
    assert chosen.tolist() == [[0, 1, 2, 3, 4]] * 2


def test_seeded_generator_reproduces_the_sets() -> None:
    volunteers = np.random.default_rng(4).random((20, 100)) < 0.1
    a = finalize_selections(volunteers, 10, np.random.default_rng(9))
    b = finalize_selections(volunteers, 10, np.random.default_rng(9))
    assert np.array_equal(a, b)


def test_bad_requests_raise() -> None:
    rng = np.random.default_rng()
    with pytest.raises(SelectionError, match="online"):
        finalize_selections(np.zeros(5, dtype=bool), 6, rng)
    with pytest.raises(SelectionError, match="online"):
        finalize_selections(np.zeros(5, dtype=bool), 3, rng, np.array([1, 1, 0, 0, 0]))
    with pytest.raises(SelectionError):
        finalize_selections(np.zeros((1, 1, 5), dtype=bool), 1, rng)


def test_choose_try_returns_the_agents_set() -> None:
    tries = np.array([[0, 1], [2, 3], [4, 5]])
    assert choose_try(tries, 1).tolist() == [2, 3]
    with pytest.raises(SelectionError, match="try 3"):
        choose_try(tries, 3)


def test_sigma_grid() -> None:
    grid = sigma_grid(Codebook.default(10))
    assert len(grid) == 100
    assert (0.7, 0.1) in grid  # the paper's optimum
    assert max(p[0] for p in grid) == 1.0 and max(p[1] for p in grid) == 0.5
    assert sigma_grid(Codebook(52, (1, 52)), 4) == [(0.25,), (0.5,), (0.75,), (1.0,)]
    with pytest.raises(SelectionError):
        sigma_grid(Codebook.default(10), 0)


class CountingDevices(IndexedDevices):
    """An `IndexedDevices` that counts the positions read (the draw's work)."""

    reads = 0

    def at(self, position: int) -> str:
        self.reads += 1
        return super().at(position)


def test_draw_tries_trims_and_tops_up_uniformly() -> None:
    # 20 eligible (sparse: at least 4·H·K). Try 0: 4 volunteers, K=2, each
    # kept half the time; try 1: 1 volunteer (v0), each of the 19 others
    # topped up 1/19 of the time.
    volunteers = {f"v{i}": (True, i == 0) for i in range(4)}
    ids = [f"v{i}" for i in range(4)] + [f"s{i:02d}" for i in range(16)]
    eligible = CountingDevices(ids)
    rng = np.random.default_rng(5)
    kept: dict[str, int] = dict.fromkeys(ids, 0)
    topped: dict[str, int] = dict.fromkeys(ids, 0)
    for _ in range(4000):
        first, second = draw_tries(volunteers, eligible, 2, 2, rng)
        assert "v0" in second and len(set(first)) == len(set(second)) == 2
        for d in first:
            kept[d] += 1
        for d in second:
            topped[d] += 1
    assert eligible.reads > 0  # the sparse draw, by position
    np.testing.assert_allclose([kept[d] / 4000 for d in ids[:4]], 0.5, atol=0.03)
    assert sum(kept[d] for d in ids[4:]) == 0
    others = [topped[d] / 4000 for d in ids[1:]]
    np.testing.assert_allclose(others, 1 / 19, atol=0.015)


def test_draw_tries_reads_o_k_positions_of_a_large_eligible_set() -> None:
    eligible = CountingDevices(f"d{i:06d}" for i in range(50_000))
    volunteers = {"d000001": (True, False, True)}
    tries = draw_tries(volunteers, eligible, 20, 3, np.random.default_rng(0))
    assert [len(set(t)) for t in tries] == [20, 20, 20]
    assert "d000001" in tries[0] and "d000001" in tries[2]
    assert eligible.reads < 3 * 64 * 2  # a few batches, not 50,000


def test_draw_tries_of_a_small_fleet_ignores_order_and_refuses_too_few() -> None:
    eligible = IndexedDevices(["a", "b", "c", "d"])
    volunteers = {"a": (True,), "b": (True,), "gone": (True,)}  # gone: offline
    shuffled = IndexedDevices(["d", "c", "b", "a"])
    for seed in range(20):
        (chosen,) = draw_tries(volunteers, eligible, 4, 1, np.random.default_rng(seed))
        assert set(chosen) in ({"a", "b", "gone", "c"}, {"a", "b", "gone", "d"})
        again = draw_tries(volunteers, shuffled, 4, 1, np.random.default_rng(seed))
        assert again == (chosen,)  # a small fleet: whatever its order
    with pytest.raises(SelectionError):
        draw_tries(volunteers, eligible, 6, 1, np.random.default_rng(0))


def test_draw_tries_is_reproducible_for_the_same_order() -> None:
    eligible = IndexedDevices(f"d{i}" for i in range(1000))
    volunteers = {"d3": (True, False), "d7": (False, True)}
    a = draw_tries(volunteers, eligible, 5, 2, np.random.default_rng(11))
    b = draw_tries(dict(reversed(volunteers.items())), eligible, 5, 2,
                   np.random.default_rng(11))  # fmt: skip
    assert a == b


@pytest.mark.parametrize("size", [8, 400], ids=["dense", "sparse"])
def test_draw_tries_never_puts_an_excluded_device_in_a_try(size: int) -> None:
    devices = IndexedDevices(f"d{i:03d}" for i in range(size))
    held = {"d000", "d001", "d002"}
    volunteers = {d: (True, True) for d in ("d000", "d001", "d003")}
    for seed in range(20):
        tries = draw_tries(volunteers, devices, 3, 2, np.random.default_rng(seed), held)
        assert all(len(t) == 3 and not held & set(t) for t in tries)
        assert all("d003" in t for t in tries)  # the one volunteer left is kept
