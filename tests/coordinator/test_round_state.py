"""The coordinator's state machine and pure round steps."""

from __future__ import annotations

import pytest

from ursa.coordinator.round_state import (
    TRANSITIONS,
    RoundState,
    Stage,
    TransitionError,
    advance,
    check_transition,
)


def test_every_stage_has_a_transition_entry() -> None:
    assert set(TRANSITIONS) == set(Stage)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (Stage.ENROLMENT, Stage.SELECTING),
        (Stage.REGISTRATION, Stage.TRAINING),
        (Stage.SELECTING, Stage.DONE),
        (Stage.DONE, Stage.KEY_EPOCH),
    ],
)
def test_check_transition_refuses_skips(current: Stage, new: Stage) -> None:
    with pytest.raises(TransitionError, match=f"from {current} to {new}"):
        check_transition(current, new)


def test_advance_returns_a_new_frozen_state() -> None:
    state = RoundState()
    moved = advance(state, Stage.KEY_EPOCH, epoch=1, deadline_at=5.0)
    assert moved == RoundState(Stage.KEY_EPOCH, 1, 0, 5.0, False)
    assert state.stage is Stage.ENROLMENT
    with pytest.raises(AttributeError):
        moved.stage = Stage.DONE  # type: ignore[misc]


def test_round_state_json_round_trip() -> None:
    state = RoundState(Stage.SELECTING, 3, 12, 99.5, True)
    assert RoundState.from_json(state.to_json()) == state


def test_a_state_saved_at_a_former_dubhe_stage_resumes_in_selecting() -> None:
    for old in ("volunteering", "distributions", "agent"):
        saved = RoundState(Stage.SELECTING, 2, 5, None, False).to_json()
        saved["stage"] = old
        assert RoundState.from_json(saved).stage is Stage.SELECTING
