"""`ursa coordinator status` reads a running coordinator's store read-only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.status import StatusError, read_status
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.messages import Volunteer
from ursa.tools.cli.app import main

from .methods.dubhe.test_migration import write_as_before


def _config_file(fed: Any) -> Path:
    path = fed.tmp_path / "coordinator.toml"
    path.write_text(
        f'federation = "{fed.config.federation}"\n'
        f'state_dir = "{fed.config.state_dir}"\n'
        f"min_devices = {fed.config.min_devices}\nk = {fed.config.k}\n"
        f"rounds = {fed.config.rounds}\n"
        '[enrolment]\nmode = "tofu"\n'
    )
    return path


def _clear_ursa_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("URSA_"):
            monkeypatch.delenv(name)


def test_status_of_a_running_federation(federation: Any) -> None:
    fed = federation(num_devices=4, k=2, rounds=2)
    fed.coordinator.start()
    for device_id in fed.device_ids[:3]:
        fed.new_device(device_id).start()
    fed.send_as("zz", Volunteer(federation="fed", round=1, sender="zz", draws=(True,)))

    waiting = read_status(fed.config.state_dir)

    assert (waiting.stage, waiting.epoch, waiting.round) == ("enrolment", 0, 0)
    assert waiting.online == tuple(fed.device_ids[:3])
    enrolled = fed.coordinator.store.enrolled()
    assert {d.device_id: d.fingerprint for d in waiting.devices} == {
        d: DevicePublicIdentity.from_bytes(i).fingerprint() for d, i in enrolled.items()
    }
    assert [(e.device, e.code) for e in waiting.errors] == [("zz", "unknown_device")]
    assert waiting.last_round is None

    fed.new_device(fed.device_ids[3]).start()  # the coordinator goes on writing
    assert fed.coordinator.is_done

    done = read_status(fed.config.state_dir)
    assert (done.stage, done.epoch, done.round, done.completed_rounds) == (
        "done",
        1,
        2,
        2,
    )
    assert done.agent in fed.device_ids and done.registered == done.recipients == 4
    assert done.last_round is not None and done.last_round.round == 2
    assert done.last_round.selected is not None and len(done.last_round.selected) == 2
    assert done.last_round.completed


def test_status_never_waits_for_the_coordinators_write_lock(federation: Any) -> None:
    fed = federation(num_devices=3, k=2, rounds=1)
    fed.start()
    store = fed.coordinator.store
    with store.transaction():  # the coordinator is in the middle of a write
        store.set_meta("probe", "1")
        status = read_status(fed.config.state_dir)
        store.record_error(1.0, "d00", "update", "late", "after the read")
    assert status.stage == "done" and status.errors == ()
    store.flush()  # status reads committed batches
    assert [e.reason for e in read_status(fed.config.state_dir).errors] == [
        "after the read"
    ]


def test_one_devices_flood_hides_no_other_devices_errors(tmp_path: Path) -> None:
    from ursa.coordinator.store import SHOWN_PER_DEVICE, CoordinatorStore

    store = CoordinatorStore(tmp_path / "coordinator.sqlite3")
    for i, device in enumerate(("d01", "d02", "d03")):
        store.record_error(float(i), device, "update", "late", "after the deadline")
    for i in range(500):
        store.record_error(10.0 + i, "d00", "error", "wrong_run", "x\ny\x1b[2K")
    store.close()

    shown = read_status(tmp_path).errors

    assert [e.device for e in shown] == ["d00"] * SHOWN_PER_DEVICE + [
        "d03",
        "d02",
        "d01",
    ]
    assert shown[0].reason == "x\\ny\\x1b[2K"


def test_status_escapes_a_raw_reason_of_an_older_store(tmp_path: Path) -> None:
    import sqlite3

    from ursa.coordinator.store import CoordinatorStore

    CoordinatorStore(tmp_path / "coordinator.sqlite3").close()
    with sqlite3.connect(tmp_path / "coordinator.sqlite3") as db:  # as once written
        db.execute(
            "INSERT INTO errors (at, device, what, code, reason) "
            "VALUES (1.0, 'd00', 'error', 'late', 'x\nERROR forged\x1b[2K')"
        )
    db.close()

    (error,) = read_status(tmp_path).errors

    assert error.reason == "x\\nERROR forged\\x1b[2K"


def test_status_command_prints_text_and_json(
    federation: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_ursa_env(monkeypatch)
    fed = federation(num_devices=3, k=2, rounds=1)
    fed.start()
    config = str(_config_file(fed))

    assert main(["coordinator", "status", "--config", config]) == 0
    text = capsys.readouterr().out
    assert "stage: done (key epoch 1, round 1" in text
    assert "rounds completed: 1 of 1" in text
    assert "devices: 3 enrolled, 3 online (tofu enrolment)" in text
    fingerprint = read_status(fed.config.state_dir).devices[0].fingerprint
    assert fingerprint in text and "recent errors: none" in text

    assert main(["coordinator", "status", "--config", config, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["federation"], data["stage"], data["completed_rounds"]) == (
        "fed",
        "done",
        1,
    )
    assert data["online"] == fed.device_ids
    assert data["devices"][0]["fingerprint"] == fingerprint


def test_status_before_the_first_start(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_ursa_env(monkeypatch)
    with pytest.raises(StatusError, match="not started yet"):
        read_status(tmp_path)
    config = tmp_path / "c.toml"
    config.write_text(f'federation = "f"\nstate_dir = "{tmp_path}"\n')
    assert main(["coordinator", "status", "--config", str(config)]) == 1
    assert "no coordinator store" in capsys.readouterr().err


def test_status_of_a_stopped_coordinator_creates_no_files(federation: Any) -> None:
    fed = federation(num_devices=3, k=2, rounds=1)
    fed.start()
    fed.coordinator.stop()
    files = sorted(p.name for p in fed.config.state_dir.iterdir())

    status = read_status(fed.config.state_dir)

    assert (status.stage, status.completed_rounds) == ("done", 1)
    assert sorted(p.name for p in fed.config.state_dir.iterdir()) == files


def test_status_counts_the_last_rounds_volunteers_from_dubhes_rows(
    tmp_path: Path,
) -> None:
    store = CoordinatorStore(tmp_path / DB_FILENAME)
    store.add_round(1, 1, b"announce")
    store.add_round(2, 1, b"announce")
    records = DubheRecords(store)
    for device in ("a", "b", "c"):
        records.add_volunteer(1, device, (True,))
    for device in ("a", "b"):
        records.add_volunteer(2, device, (True,))
    store.close()

    last = read_status(tmp_path).last_round
    assert last is not None and (last.round, last.volunteers) == (2, 2)


def test_status_of_a_store_not_moved_yet_counts_no_volunteers(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / DB_FILENAME)
    store.add_round(1, 1, b"announce")
    DubheRecords(store).add_volunteer(1, "a", (True,))
    store.close()
    write_as_before(tmp_path / DB_FILENAME)  # as the version before left it

    last = read_status(tmp_path).last_round
    assert last is not None and (last.round, last.volunteers) == (1, 0)
