"""`TrainingHealth`: failing after two failed rounds in a row, sitting out after N."""

from __future__ import annotations

import logging

import pytest

from ursa.coordinator.training_health import FailureStreak, TrainingHealth


def test_two_failures_in_a_row_make_a_device_failing() -> None:
    health = TrainingHealth(sit_out_after=3)
    assert health.failed("d1", 1, "training_failed") is False
    assert health.failing() == {}
    assert health.failed("d1", 2, "training_failed") is False
    assert health.failing() == {"d1": FailureStreak(2, 2, "training_failed")}
    assert health.sitting_out() == frozenset()


def test_the_nth_failure_starts_the_sit_out_once() -> None:
    health = TrainingHealth(sit_out_after=3)
    for round_index in (1, 2):
        health.failed("d1", round_index, "training_failed")
    assert health.failed("d1", 3, "model_mismatch") is True
    assert health.failed("d1", 4, "training_failed") is False  # already out
    assert health.sitting_out() == {"d1"}
    assert health.failing()["d1"].sits_out


def test_a_repeated_report_for_one_round_counts_once() -> None:
    health = TrainingHealth(sit_out_after=2)
    health.failed("d1", 1, "training_failed")
    assert health.failed("d1", 1, "training_failed") is False
    assert health.failing() == {}


def test_a_counted_contribution_ends_the_streak() -> None:
    health = TrainingHealth(sit_out_after=3)
    health.failed("d1", 1, "training_failed")
    health.failed("d2", 1, "training_failed")
    health.trained(["d1"])
    health.failed("d1", 2, "training_failed")
    health.failed("d2", 2, "training_failed")
    assert set(health.failing()) == {"d2"}


def test_zero_never_sits_a_device_out() -> None:
    health = TrainingHealth(sit_out_after=0)
    for round_index in range(1, 6):
        assert health.failed("d1", round_index, "training_failed") is False
    assert health.failing()["d1"].count == 5
    assert health.sitting_out() == frozenset()
    with pytest.raises(ValueError, match="sit_out_after"):
        TrainingHealth(sit_out_after=-1)


def test_streaks_survive_a_restart_through_json() -> None:
    health = TrainingHealth(sit_out_after=2)
    health.failed("d1", 4, "training_failed")
    health.failed("d1", 5, "training_failed")
    health.failed("d2", 5, "model_mismatch")

    restored = TrainingHealth(sit_out_after=2)
    restored.restore(health.to_json())

    assert restored.failing() == health.failing()
    assert restored.sitting_out() == {"d1"}
    assert restored.failed("d2", 6, "training_failed") is True


def test_unreadable_stored_streaks_restore_nothing_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = TrainingHealth(sit_out_after=2)
    health.failed("d1", 1, "x")
    with caplog.at_level(logging.WARNING, logger="ursa.coordinator"):
        health.restore('{"d1": [1, 2]}')
    assert health.failing() == {} and "unreadable" in caplog.text
    health.restore(None)
    assert health.sitting_out() == frozenset()


def test_a_new_key_epoch_takes_a_device_back_and_its_next_failure_sits_it_out() -> None:
    health = TrainingHealth(sit_out_after=2)
    health.failed("d1", 1, "failed")
    assert health.failed("d1", 2, "failed") is True
    health.new_epoch()
    assert health.sitting_out() == frozenset()
    assert health.failing()["d1"].count == 2
    assert health.failed("d1", 3, "failed") is True
