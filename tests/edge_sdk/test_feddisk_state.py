"""FedDisk's device state files: the record, the best MADE and the sample weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ursa.edge_sdk.feddisk_state import (
    FEDDISK_STATE_FILE,
    FeddiskRecord,
    load_state,
    read_made,
    read_weights,
    save_state,
    write_made,
    write_weights,
)
from ursa.edge_sdk.made_stop import MadeStopper, apply_validation_loss

FRESH = MadeStopper(patience=2, max_rounds=1000)


def test_no_file_is_no_record(tmp_path: Path) -> None:
    assert load_state(tmp_path, FRESH) is None


def test_a_phase_one_record_round_trips_with_the_fresh_settings(
    tmp_path: Path,
) -> None:
    stopper = apply_validation_loss(apply_validation_loss(FRESH, 3.0), 3.5)
    record = FeddiskRecord("made", stopper, (1, 4, 3), best_version=2)
    save_state(tmp_path, record)

    assert load_state(tmp_path, FRESH) == record
    other = load_state(tmp_path, MadeStopper(patience=5, max_rounds=7))
    assert other is not None and other.stopper.patience == 5
    assert other.stopper.since_best == 1 and other.stopper.best_loss == 3.0


def test_an_infinite_best_loss_is_saved_as_null(tmp_path: Path) -> None:
    save_state(tmp_path, FeddiskRecord("made", FRESH))
    data = json.loads((tmp_path / FEDDISK_STATE_FILE).read_text())

    assert data["best_loss"] is None and data["applied"] is None
    loaded = load_state(tmp_path, FRESH)
    assert loaded is not None and math.isinf(loaded.stopper.best_loss)


def test_phase_two_reads_only_the_phase_and_weighted(tmp_path: Path) -> None:
    (tmp_path / FEDDISK_STATE_FILE).write_text('{"phase": "classifier"}')
    assert load_state(tmp_path, FRESH) == FeddiskRecord(
        "classifier", FRESH, weighted=True
    )

    save_state(tmp_path, FeddiskRecord("classifier", FRESH, made_version=3))
    loaded = load_state(tmp_path, FRESH)
    assert loaded is not None and not loaded.weighted


def test_a_garbled_phase_one_record_raises(tmp_path: Path) -> None:
    (tmp_path / FEDDISK_STATE_FILE).write_text('{"phase": "made", "rounds": 1}')
    with pytest.raises(KeyError):
        load_state(tmp_path, FRESH)


def test_made_and_weights_round_trip_and_leave_no_temporary(tmp_path: Path) -> None:
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    weights = np.array([0.5, 1.0, 1.5])
    write_made(tmp_path, arrays)
    write_weights(tmp_path, weights)

    made = read_made(tmp_path)
    assert list(made) == ["w"]
    np.testing.assert_array_equal(made["w"], arrays["w"])
    np.testing.assert_array_equal(read_weights(tmp_path), weights)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
