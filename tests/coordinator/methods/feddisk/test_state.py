"""FedDisk's saved progress on the coordinator: round trip and a corrupt value."""

from __future__ import annotations

from pathlib import Path

import pytest

from ursa.coordinator.methods.feddisk.state import (
    FeddiskRoundKind,
    FeddiskState,
    FeddiskStateError,
)
from ursa.coordinator.store import CoordinatorStore


def test_state_round_trips_through_the_store(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    state = FeddiskState.load(store)
    assert state.made_rounds == 0 and state.role is None

    state.made_rounds = 3
    state.judged_version = 2
    state.best_version = 2
    state.enter(5, FeddiskRoundKind.LOSS)
    loaded = FeddiskState.load(store)

    assert loaded == state
    state.switch_round = 6
    state.enter(6, FeddiskRoundKind.CLASSIFIER)
    store.close()
    reopened = CoordinatorStore(tmp_path / "db.sqlite3")
    assert FeddiskState.load(reopened) == state
    reopened.close()


def test_corrupt_progress_is_an_error(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.set_method_state("feddisk", "progress", {"format": 2, "made_rounds": "x"})
    with pytest.raises(FeddiskStateError, match="saved progress"):
        FeddiskState.load(store)
    store.set_method_state("feddisk", "progress", [1])
    with pytest.raises(FeddiskStateError):
        FeddiskState.load(store)
    store.close()


def test_a_state_without_a_store_lives_in_memory() -> None:
    state = FeddiskState()
    state.enter(1, FeddiskRoundKind.MADE)
    assert (state.round, state.role) == (1, FeddiskRoundKind.MADE)
