"""The coordinator's SQLite store: round trips, atomicity, complete-once."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from ursa.coordinator import store as store_module
from ursa.coordinator.store import CoordinatorStore, SchemaSql


def test_epoch_and_round_round_trip(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.add_epoch(1, "a", ("a", "b"), b"notice")
    store.set_public_key(1, b"pk")
    store.add_registration(1, "a", b"sum1")
    store.add_registration(1, "b", b"sum2")
    store.add_round(1, 1, b"announce")
    store.add_method_row("m", "answers.1", "a", b"\x00yes")
    store.set_method_state("m", "plan.1", [["a"], ["b"]])
    store.set_selection(1, ("a",), 0, b"result")
    store.close()

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    epoch = store.epoch(1)
    assert epoch is not None
    assert (epoch.agent, epoch.recipients, epoch.registered) == (
        "a",
        ("a", "b"),
        {"a", "b"},
    )
    assert (epoch.public_key_msg, epoch.running_sum) == (b"pk", b"sum2")
    record = store.round(1)
    assert record is not None
    assert (record.epoch, record.announce) == (1, b"announce")
    assert (record.selected, record.try_index, record.result) == (("a",), 0, b"result")
    assert store.method_rows("m", "answers.1") == {"a": b"\x00yes"}
    assert store.method_rows("m", "answers.2") == {}
    assert store.count_method_rows("m", "answers.1") == 1
    assert store.method_state("m", "plan.1") == [["a"], ["b"]]
    assert store.last_result() == b"result"
    assert store.rounds_in_epoch(1) == 1
    store.close()


def test_a_round_completes_once(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.add_round(1, 1, b"a")
    assert store.complete_round(1)
    assert not store.complete_round(1)
    assert store.completed_rounds() == 1
    store.close()


def test_transactions_roll_back_together(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    with pytest.raises(RuntimeError), store.transaction():
        store.mark_seen("m1", 1.0)
        store.enrol("a", b"id", "f" * 32, 1.0)
        raise RuntimeError("crash mid-message")
    assert not store.is_seen("m1")
    assert store.enrolled() == {}
    with store.transaction():
        store.mark_seen("m1", 1.0)
    assert store.is_seen("m1")
    store.close()


def test_presence_and_meta(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.set_online("a", True)
    store.set_online("b", True)
    store.set_online("b", False)
    store.set_meta("state", "{}")
    assert store.online() == {"a"}
    assert store.get_meta("state") == "{}"
    assert store.get_meta("missing") is None
    store.close()


def test_seen_ids_are_pruned_to_the_newest(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3", max_seen=10)
    for i in range(35):
        store.mark_seen(f"m{i}", float(i))

    assert store.is_seen("m34") and store.is_seen("m25")
    assert not store.is_seen("m0") and not store.is_seen("m19")
    count = store._exec("SELECT COUNT(*) FROM seen").fetchone()[0]
    assert count <= 2 * 10
    store.close()


def test_max_seen_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_seen"):
        CoordinatorStore(tmp_path / "db.sqlite3", max_seen=0)


def test_method_state_and_phase_records_survive_a_reopen(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.set_method_state("feddisk", "progress", {"made_rounds": 2})
    store.save_phase("climb.dual/m/3", 3, {"kind": "gather", "answered": ["d0"]})
    store.save_phase("climb.dual/m/3", 3, {"kind": "gather", "answered": ["d1"]})
    store.save_phase("wait/3", 3, {"kind": "wait"})
    store.drop_phase("wait/3")
    store.close()

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    assert store.method_state("feddisk", "progress") == {"made_rounds": 2}
    assert store.method_state("feddisk", "other") is None
    assert store.phase_keys() == ["climb.dual/m/3"]
    assert store.phase("climb.dual/m/3") == {"kind": "gather", "answered": ["d1"]}
    assert store.phase("wait/3") is None
    store.close()


def test_a_phase_record_rolls_back_with_its_message(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    with pytest.raises(RuntimeError), store.transaction():
        store.mark_seen("m1", 1.0)
        store.save_phase("p", 1, {"kind": "gather"})
        store.set_method_state("feddisk", "progress", 1)
        raise RuntimeError("crash before commit")

    assert not store.is_seen("m1") and store.phase("p") is None
    assert store.method_state("feddisk", "progress") is None
    store.close()


def test_a_store_is_one_run_kept_across_reopens(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "a" / "db")
    run = store.run_id()
    assert run == store.run_id()
    store.close()
    again = CoordinatorStore(tmp_path / "a" / "db")
    other = CoordinatorStore(tmp_path / "b" / "db")  # an empty store: a new run
    try:
        assert again.run_id() == run
        assert other.run_id() != run
    finally:
        again.close()
        other.close()


def test_recent_errors_are_bounded_and_newest_first(tmp_path: Path) -> None:
    from ursa.coordinator.store import MAX_ERRORS

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    for i in range(MAX_ERRORS + 5):
        store.record_error(float(i), f"d{i}", "update", "late", "x" * 300)
    errors = store.recent_errors()
    store.close()
    assert len(errors) == MAX_ERRORS
    assert [e.at for e in errors[:2]] == [MAX_ERRORS + 4.0, MAX_ERRORS + 3.0]
    assert errors[-1].device == "d5" and errors[0].reason == "x" * 300


def test_one_device_keeps_only_its_newest_errors(tmp_path: Path) -> None:
    from ursa.coordinator.store import MAX_ERRORS_PER_DEVICE, SHOWN_PER_DEVICE

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.record_error(0.0, "honest", "update", "late", "after the deadline")
    store.record_error(0.0, None, "message", "malformed", "no device")
    for i in range(3000):
        store.record_error(1.0 + i, "flood", "error", "wrong_run", f"flood {i}")
    every = store.recent_errors(per_device=1000)
    shown = store.recent_errors()
    store.close()
    devices = [e.device for e in every]
    assert devices.count("flood") == MAX_ERRORS_PER_DEVICE
    assert devices.count("honest") == 1 and devices.count(None) == 1
    assert every[0].reason == "flood 2999"
    assert [e.device for e in shown] == ["flood"] * SHOWN_PER_DEVICE + [None, "honest"]


def test_stored_texts_are_escaped_and_bounded(tmp_path: Path) -> None:
    from ursa.protocol.untrusted_text import DEFAULT_LIMIT

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.record_error(0.0, "d1", "up\ndate", "late\x1b", "a\nb\r\u202e" + "z" * 9999)
    (error,) = store.recent_errors()
    store.close()
    assert error.what == "up\\ndate" and error.code == "late\\x1b"
    assert error.reason.startswith("a\\nb\\r\\u202ezzz")
    assert len(error.reason) <= DEFAULT_LIMIT


def test_unenrol_forgets_identity_and_presence(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.enrol("a", b"id-a", "f" * 32, 1.0)
    store.enrol("b", b"id-b", "e" * 32, 1.0)
    store.set_online("a", True)
    store.unenrol("a")
    assert (set(store.enrolled()), store.online()) == ({"b"}, set())
    store.close()


def test_a_phase_reply_is_a_row_merged_into_the_record(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    expected = [f"d{i}" for i in range(100)]
    store.save_phase("mean/3", 3, {"answered": ["d5"], "expected": expected, "n": 0})
    store.save_phase_reply("mean/3", "d1", {"n": 1})
    store.save_phase_reply("mean/3", "d9", {"n": 2})
    with pytest.raises(RuntimeError), store.transaction():
        store.save_phase_reply("mean/3", "d7", {"n": 3})  # rolled back with its message
        raise RuntimeError("crash before commit")
    store.close()

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    saved = {"answered": ["d1", "d5", "d9"], "expected": expected, "n": 2}
    assert store.phase("mean/3") == saved
    raw = store._exec("SELECT record FROM phases WHERE key = 'mean/3'").fetchone()
    assert '"answered": ["d5"]' in raw[0]  # the big record was not rewritten
    store.save_phase("mean/3", 3, {"answered": ["d1"], "expected": [], "n": 9})
    assert store.phase("mean/3") == {"answered": ["d1"], "expected": [], "n": 9}
    store.save_phase_reply("mean/3", "d2", {"n": 10})
    store.drop_phase("mean/3")
    store.save_phase("mean/3", 3, {"answered": [], "n": 0})  # a new one: no leftovers
    assert store.phase("mean/3") == {"answered": [], "n": 0}
    store.close()


def test_a_fresh_store_has_only_core_and_generic_method_tables(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    tables = {
        str(r[0])
        for r in store._exec("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    columns = {str(r[1]) for r in store._exec("PRAGMA table_info(rounds)")}
    store.close()
    assert not {"volunteers", "distributions"} & tables  # a method's, not core
    assert {"method_state", "method_rows", "phases"} <= tables
    assert not {"tries", "candidates"} & columns


def test_a_second_method_row_of_a_device_is_refused(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    store.add_method_row("m", "answers.1", "a", b"one")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_method_row("m", "answers.1", "a", b"two")
    assert store.method_rows("m", "answers.1") == {"a": b"one"}
    store.close()


def test_a_migration_runs_once_and_records_its_version(tmp_path: Path) -> None:
    runs: list[int] = []

    def step(sql: SchemaSql) -> None:
        runs.append(1)
        sql.write("INSERT OR REPLACE INTO meta VALUES ('moved', 'yes')")

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    assert store.migrate("m", 1, step)
    assert not store.migrate("m", 1, step)
    store.close()
    store = CoordinatorStore(tmp_path / "db.sqlite3")
    assert not store.migrate("m", 1, step)  # recorded across a reopen
    assert store.migrate("m", 2, step)  # a newer version runs
    assert (store.get_meta("schema.m"), store.get_meta("moved")) == ("2", "yes")
    store.close()
    assert runs == [1, 1]


def test_a_failed_migration_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    def step(sql: SchemaSql) -> None:
        sql.write("INSERT INTO meta VALUES ('half', 'done')")
        raise RuntimeError("crash mid-migration")

    store = CoordinatorStore(tmp_path / "db.sqlite3")
    with pytest.raises(RuntimeError):
        store.migrate("m", 1, step)
    assert (store.get_meta("half"), store.get_meta("schema.m")) == (None, None)
    store.close()


def test_the_core_store_names_no_methods_concept() -> None:
    """Dubhe's (or any method's) words stay in its folder, not in the core store."""
    text = Path(store_module.__file__).read_text().lower()
    words = (
        *("volunteer", "distribution", "draws", "tries", "candidate", "dubhe"),
        *("rank", "stratified"),
    )
    found = [w for w in words if re.search(rf"\b{w}", text)]
    assert not found, f"coordinator/store.py names {found}"
