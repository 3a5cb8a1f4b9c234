"""FedDisk's device state: the record in the store, the best MADE, the weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ursa.edge_sdk.methods.feddisk.made_stopper import (
    MadeStopper,
    apply_validation_loss,
)
from ursa.edge_sdk.methods.feddisk.state import (
    FeddiskRecord,
    read_made,
    read_weights,
    record_from_json,
    record_to_json,
    write_made,
    write_weights,
)
from ursa.edge_sdk.state_dir import METHODS_FILE, DeviceStateDir

FRESH = MadeStopper(patience=2, max_rounds=1000)


def save(tmp_path: Path, record: FeddiskRecord) -> None:
    DeviceStateDir(tmp_path).save_method_state("feddisk", record_to_json(record))


def load(tmp_path: Path, fresh: MadeStopper = FRESH) -> FeddiskRecord | None:
    data = DeviceStateDir(tmp_path).method_state("feddisk")
    return None if data is None else record_from_json(data, fresh)


def test_no_state_is_no_record(tmp_path: Path) -> None:
    assert load(tmp_path) is None


def test_a_phase_one_record_round_trips_with_the_fresh_settings(
    tmp_path: Path,
) -> None:
    stopper = apply_validation_loss(apply_validation_loss(FRESH, 3.0), 3.5)
    record = FeddiskRecord("made", stopper, (1, 4, 3), best_version=2)
    save(tmp_path, record)

    assert load(tmp_path) == record
    other = load(tmp_path, MadeStopper(patience=5, max_rounds=7))
    assert other is not None and other.stopper.patience == 5
    assert other.stopper.since_best == 1 and other.stopper.best_loss == 3.0


def test_an_infinite_best_loss_is_saved_as_null(tmp_path: Path) -> None:
    save(tmp_path, FeddiskRecord("made", FRESH))
    data = json.loads((tmp_path / METHODS_FILE).read_text())["feddisk"]

    assert data["best_loss"] is None and data["applied"] is None
    loaded = load(tmp_path)
    assert loaded is not None and math.isinf(loaded.stopper.best_loss)


def test_phase_two_reads_only_the_phase_and_weighted(tmp_path: Path) -> None:
    assert record_from_json({"phase": "classifier"}, FRESH) == FeddiskRecord(
        "classifier", FRESH, weighted=True
    )

    save(tmp_path, FeddiskRecord("classifier", FRESH, made_version=3))
    loaded = load(tmp_path)
    assert loaded is not None and not loaded.weighted


def test_a_feddisk_json_of_an_older_version_is_read_then_replaced(
    tmp_path: Path,
) -> None:
    (tmp_path / "feddisk.json").write_text('{"phase": "classifier", "weighted": false}')
    loaded = load(tmp_path)
    assert loaded == FeddiskRecord("classifier", FRESH, weighted=False)

    save(tmp_path, FeddiskRecord("classifier", FRESH, weighted=True))
    assert not (tmp_path / "feddisk.json").exists()
    assert load(tmp_path) == FeddiskRecord("classifier", FRESH, weighted=True)


def test_a_garbled_phase_one_record_raises() -> None:
    with pytest.raises(KeyError):
        record_from_json({"phase": "made", "rounds": 1}, FRESH)


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
