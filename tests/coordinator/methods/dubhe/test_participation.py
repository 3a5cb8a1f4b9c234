"""The participation cap: at most a share of any window of rounds, per device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ursa.coordinator.methods.dubhe.participation import ParticipationCap


def test_a_device_at_the_limit_of_its_window_is_capped_until_it_slides() -> None:
    cap = ParticipationCap(0.5, 4)  # 2 of any 4 rounds
    assert cap.limit == 2
    cap.record(1, ("a", "b"))
    assert cap.capped(2) == set()  # once: a short run never meets the cap
    cap.record(2, ("a",))
    assert cap.capped(3) == {"a"}  # twice in rounds 1..3
    cap.record(3, ("b",))
    assert cap.capped(4) == {"a", "b"}
    cap.record(4, ("c",))
    assert cap.capped(5) == set()  # rounds 2..4: a, b, c once each
    cap.record(5, ("c",))
    assert cap.capped(6) == {"c"}  # rounds 3..5: b once, c twice


def test_a_round_recorded_again_replaces_its_first_record() -> None:
    cap = ParticipationCap(0.5, 10)
    cap.record(1, ("a",))
    cap.record(1, ("b",))
    assert cap.count("a") == 0 and cap.count("b") == 1


def test_restore_rebuilds_the_counts_and_a_full_share_is_no_cap() -> None:
    cap = ParticipationCap(0.5, 4)
    cap.restore([(3, ("a",)), (1, ("a",)), (2, ("b",))])
    assert cap.count("a") == 2 and cap.capped(4) == {"a"}
    assert ParticipationCap(1.0, 4).capped(2) == frozenset()
    with pytest.raises(ValueError):
        ParticipationCap(0.0, 4)
    with pytest.raises(ValueError):
        ParticipationCap(0.5, 0)


@settings(max_examples=60)
@given(
    share=st.floats(0.05, 0.95),
    window=st.integers(1, 12),
    wants=st.lists(st.booleans(), min_size=1, max_size=60),
)
def test_a_device_that_always_asks_never_exceeds_the_share_of_any_window(
    share: float, window: int, wants: list[bool]
) -> None:
    cap, mine = ParticipationCap(share, window), []
    for r, asks in enumerate(wants, start=1):
        if asks and "x" not in cap.capped(r):
            cap.record(r, ("x",))
            mine.append(r)
        else:
            cap.record(r, ("y",))
    for end in range(1, len(wants) + 1):
        inside = sum(1 for r in mine if end - window < r <= end)
        assert inside <= cap.limit
