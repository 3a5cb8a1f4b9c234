"""The start-up hold: capped in messages, bytes, and bytes per sender."""

from __future__ import annotations

from ursa.coordinator.startup_hold import StartupHold


def test_one_sender_cannot_fill_the_hold_for_the_others() -> None:
    hold = StartupHold(max_messages=10, max_bytes=100, max_sender_bytes=30)
    flood = [hold.offer("evil", "t/evil", b"x" * 10) for _ in range(5)]

    assert flood == [True, True, True, False, False]
    assert hold.offer("d1", "t/d1", b"y" * 30)
    assert hold.dropped == 2 and hold.dropped_bytes == 20
    assert hold.held_bytes == 60
    assert [topic for topic, _ in hold.take()] == ["t/evil"] * 3 + ["t/d1"]
    assert hold.held_bytes == 0 and hold.take() == []
    assert hold.offer("evil", "t/evil", b"x" * 30)  # a new start, a new share


def test_the_total_and_the_count_are_capped_too() -> None:
    hold = StartupHold(max_messages=3, max_bytes=25, max_sender_bytes=100)
    assert hold.offer("a", "t", b"1" * 10)
    assert hold.offer("b", "t", b"2" * 10)
    assert not hold.offer("c", "t", b"3" * 10)  # 30 bytes > 25
    assert hold.offer("", "t", b"")  # no device: the totals only
    assert not hold.offer("d", "t", b"")  # a fourth message
    assert hold.dropped == 2
