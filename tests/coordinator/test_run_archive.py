"""`run_archive`: a finished store is recognised; a new run keeps the devices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ursa.coordinator.round_state import RoundState, Stage
from ursa.coordinator.run_archive import (
    RUNS_DIRNAME,
    NewRunError,
    finished_round,
    start_new_run,
)
from ursa.coordinator.stage_machine import STATE_KEY
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.crypto.identity import DeviceIdentity


def _store(state_dir: Path, stage: Stage) -> tuple[str, bytes]:
    """A store at `stage` with one enrolled device; its run and device identity."""
    store = CoordinatorStore(state_dir / DB_FILENAME)
    identity = DeviceIdentity.generate("dev0").public()
    store.enrol("dev0", identity.to_bytes(), identity.fingerprint(), 1.0)
    store.set_certificate("dev0", b"cert")
    store.set_meta(STATE_KEY, json.dumps(RoundState(stage=stage, round=2).to_json()))
    run = store.run_id()
    store.close()
    return run, identity.to_bytes()


def test_a_done_store_is_finished_and_a_new_run_keeps_its_devices(
    tmp_path: Path,
) -> None:
    old_run, identity = _store(tmp_path, Stage.DONE)
    assert finished_round(tmp_path) == 0  # no round record: none completed

    made = start_new_run(tmp_path, final_dir=tmp_path / "final")

    assert made.old_run == old_run != made.new_run
    assert made.devices == 1
    assert (tmp_path / RUNS_DIRNAME / old_run / DB_FILENAME).exists()
    assert finished_round(tmp_path) is None
    store = CoordinatorStore(tmp_path / DB_FILENAME)
    try:
        assert store.run_id() == made.new_run
        assert store.enrolled() == {"dev0": identity}
        assert store.certificates() == {"dev0": b"cert"}
        assert store.get_meta(STATE_KEY) is None  # the new run starts afresh
    finally:
        store.close()


def test_an_unfinished_run_is_ended_only_when_abandoned(tmp_path: Path) -> None:
    old_run, _ = _store(tmp_path, Stage.TRAINING)
    assert finished_round(tmp_path) is None

    with pytest.raises(NewRunError, match=r"not finished .*--abandon"):
        start_new_run(tmp_path)
    made = start_new_run(tmp_path, abandon=True)

    assert made.old_run == old_run


def test_no_store_has_no_run_to_archive(tmp_path: Path) -> None:
    assert finished_round(tmp_path) is None
    with pytest.raises(NewRunError, match="starts the first run"):
        start_new_run(tmp_path)
