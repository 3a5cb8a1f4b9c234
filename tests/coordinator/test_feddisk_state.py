"""FedDisk's saved progress on the coordinator: round trip and a corrupt file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ursa.coordinator.feddisk_state import FeddiskState, FeddiskStateError, Role


def test_state_round_trips_through_its_file(tmp_path: Path) -> None:
    state = FeddiskState.load(tmp_path)
    assert state.made_rounds == 0 and state.role is None

    state.made_rounds = 3
    state.judged_version = 2
    state.best_version = 2
    state.enter(5, Role.LOSS, {"round": 5})
    loaded = FeddiskState.load(tmp_path)

    assert loaded == state
    state.switch_round = 6
    state.enter(6, Role.CLASSIFIER, None)
    assert FeddiskState.load(tmp_path) == state


def test_a_corrupt_state_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "feddisk.json").write_text('{"format": 1, "made_rounds": "x"}')
    with pytest.raises(FeddiskStateError, match="unusable"):
        FeddiskState.load(tmp_path)
