"""`RefusalLimiter`: a few recorded refusals per device per window, the rest summed."""

from __future__ import annotations

import pytest

from ursa.coordinator.refusal_limits import Note, RefusalLimiter, RefusalLimits


def test_a_device_records_its_lines_then_is_counted() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=3, window_s=60.0))
    notes = [limiter.admit("d1", 100.0 + i) for i in range(10)]
    assert notes[:3] == [Note(True)] * 3
    assert notes[3:] == [Note(False)] * 7


def test_the_next_window_opens_with_the_count_once() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=2, window_s=60.0))
    for _ in range(7):
        limiter.admit("d1", 0.0)
    assert limiter.admit("d1", 60.0) == Note(True, suppressed=5)
    assert limiter.admit("d1", 61.0) == Note(True)  # the count came back once
    assert limiter.overdue(1000.0) == []


def test_overdue_reports_a_closed_window_once() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=1, window_s=10.0))
    for _ in range(4):
        limiter.admit("d1", 0.0)
    limiter.admit("d2", 0.0)  # within its limit: nothing to report
    assert limiter.overdue(9.0) == []
    assert limiter.overdue(10.0) == [("d1", 3)]
    assert limiter.overdue(20.0) == []
    assert limiter.admit("d1", 21.0) == Note(True)  # and not again here


def test_devices_have_their_own_windows() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=1, window_s=60.0))
    assert limiter.admit("flood", 0.0).record
    for _ in range(1000):
        assert not limiter.admit("flood", 1.0).record
    assert limiter.admit("honest", 2.0).record
    assert limiter.admit(None, 2.0).record  # unknown senders share one window


def test_tracked_devices_are_bounded_least_recent_first() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=1, window_s=60.0, tracked=3))
    for device in ("a", "b", "c"):
        limiter.admit(device, 0.0)
        limiter.admit(device, 0.0)  # one suppressed each
    limiter.admit("a", 1.0)  # a is recent again: b goes first
    limiter.admit("d", 1.0)
    assert limiter.admit("b", 2.0) == Note(True)  # forgotten: a fresh window
    assert limiter.admit("a", 2.0) == Note(False)  # still tracked: still full
    assert [device for device, _ in limiter.overdue(60.0)] == ["a"]  # c went too


def test_a_clock_stepping_back_opens_a_new_window() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=1, window_s=60.0))
    limiter.admit("d1", 100.0)
    limiter.admit("d1", 100.0)
    assert limiter.admit("d1", 50.0) == Note(True, suppressed=1)


@pytest.mark.parametrize(
    "limits", [{"lines": 0}, {"kinds": -1}, {"window_s": 0.0}, {"tracked": 0}]
)
def test_limits_must_be_positive(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="positive"):
        RefusalLimits(**limits)  # type: ignore[arg-type]


def test_a_new_kind_is_recorded_once_past_the_budget() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=2, kinds=2, window_s=60.0))
    flood = [limiter.admit("d1", 0.0, "wrong_run").record for _ in range(100)]
    assert flood.count(True) == 2
    assert limiter.admit("d1", 1.0, "coordinator_identity_mismatch").record
    assert not limiter.admit("d1", 1.0, "coordinator_identity_mismatch").record
    assert limiter.admit("d1", 1.0, "malformed").record
    assert not limiter.admit("d1", 1.0, "oversize").record  # kinds spent
    assert not limiter.admit("d1", 1.0).record  # no kind: the budget only
    assert limiter.overdue(60.0) == [("d1", 98 + 1 + 1 + 1)]


def test_kinds_start_again_with_each_window() -> None:
    limiter = RefusalLimiter(RefusalLimits(lines=1, kinds=1, window_s=60.0))
    limiter.admit("d1", 0.0, "a")
    assert limiter.admit("d1", 0.0, "b").record
    assert not limiter.admit("d1", 0.0, "c").record
    assert limiter.admit("d1", 60.0, "a") == Note(True, suppressed=1)
    assert limiter.admit("d1", 60.0, "c").record
