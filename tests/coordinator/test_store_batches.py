"""Group commit: batches, what another reader sees, de-duplication, a crash."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from ursa.coordinator.natural_keys import natural_key
from ursa.coordinator.store import CoordinatorStore, NaturalKey
from ursa.coordinator.store_batches import CommitPolicy
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import Heartbeat, Registration, Volunteer
from ursa.protocol.outbox import Outbox

LONG = CommitPolicy(interval_s=3600.0, max_records=10_000)
"""Nothing is due by time or count: only an explicit flush commits."""


def _committed(path: Path, sql: str) -> list[tuple[object, ...]]:
    """What another connection (another process, a crash survivor) reads."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute(sql).fetchall()


def test_records_are_visible_to_the_store_at_once_and_to_others_after_flush(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=LONG)
    try:
        store.add_round(1, 1, b"announce")
        with store.transaction():
            store.add_volunteer(1, "a", (True,))
        assert store.pending == 2
        record = store.round(1)
        assert record is not None and record.volunteers == {"a": (True,)}
        assert _committed(path, "SELECT device_id FROM volunteers") == []

        store.flush()
        assert store.pending == 0
        assert _committed(path, "SELECT device_id FROM volunteers") == [("a",)]
    finally:
        store.close()


def test_a_batch_commits_at_its_record_count(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=CommitPolicy(3600.0, max_records=3))
    try:
        for i in range(7):
            with store.transaction():
                store.mark_seen(f"m{i}", 1.0)
        assert store.stats().commits == 2
        assert len(_committed(path, "SELECT * FROM seen")) == 6
        assert store.pending == 1
    finally:
        store.close()
    assert len(_committed(path, "SELECT * FROM seen")) == 7  # close flushes


def test_every_commits_each_unit_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=CommitPolicy.every())
    try:
        with store.transaction():
            store.mark_seen("m1", 1.0)
            store.set_meta("k", "v")
        assert store.pending == 0 and store.stats().commits == 1
        assert _committed(path, "SELECT value FROM meta WHERE key = 'k'") == [("v",)]
    finally:
        store.close()


def test_a_failed_unit_rolls_back_alone_and_the_batch_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=LONG)
    try:
        with store.transaction():
            store.mark_seen("kept", 1.0)
        with pytest.raises(RuntimeError), store.transaction():
            store.mark_seen("lost", 1.0)
            raise RuntimeError("the handler failed")
        assert store.pending == 1
        store.flush()
        assert _committed(path, "SELECT message_id FROM seen") == [("kept",)]
    finally:
        store.close()


def test_a_retransmission_is_a_duplicate_by_its_natural_key(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3", commit=LONG)
    try:
        volunteer = Volunteer(federation="f", round=1, sender="a", draws=(True,))
        key = natural_key(volunteer)
        assert key == NaturalKey("volunteers", 1, "a")
        assert not store.is_duplicate(volunteer.message_id, key)
        store.add_round(1, 1, b"announce")
        with store.transaction():
            store.add_volunteer(1, "a", volunteer.draws)  # no seen row
        again = volunteer.model_copy()
        assert store.is_duplicate(again.message_id, natural_key(again))
        other = Volunteer(federation="f", round=2, sender="a", draws=(True,))
        assert not store.is_duplicate(other.message_id, natural_key(other))
        assert store._exec("SELECT COUNT(*) FROM seen").fetchone()[0] == 0

        registration = Registration(
            federation="f", round=0, sender="b", epoch=3, registry=b"r"
        )
        assert natural_key(registration) == NaturalKey("registrations", 3, "b")
        heartbeat = Heartbeat(federation="f", round=1, sender="a", seq=1)
        assert natural_key(heartbeat) is None
        with store.transaction():
            store.mark_seen(heartbeat.message_id, 1.0)
        assert store.is_duplicate(heartbeat.message_id, None)
    finally:
        store.close()


def test_a_refused_message_with_a_natural_key_is_remembered_by_its_id(
    tmp_path: Path,
) -> None:
    store = CoordinatorStore(tmp_path / "db.sqlite3", commit=LONG)
    try:
        garbled = Volunteer(federation="f", round=1, sender="a", draws=(True,))
        with store.transaction():  # refused: no record, a seen row
            store.mark_seen(garbled.message_id, 1.0)
        assert store.is_duplicate(garbled.message_id, natural_key(garbled))
    finally:
        store.close()


def test_the_outbox_gate_commits_what_was_written_before_a_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=LONG)
    try:
        with store.transaction():
            store.set_meta("state", "selecting")
            inside = store.position()
            assert not store.commit_through(inside)  # half a unit: not now
        queued = store.position()
        assert _committed(path, "SELECT * FROM meta") == []
        assert store.commit_through(queued)
        assert _committed(path, "SELECT * FROM meta") == [("state", "selecting")]
        commits = store.stats().commits
        assert store.commit_through(queued)  # already durable: no second commit
        assert store.stats().commits == commits
    finally:
        store.close()


_CRASH = """
import os, signal, sys
from pathlib import Path
from ursa.coordinator.store import CoordinatorStore
from ursa.coordinator.store_batches import CommitPolicy
store = CoordinatorStore(
    Path(sys.argv[1]), commit=CommitPolicy(interval_s=3600.0, max_records=10_000)
)
store.add_round(1, 1, b"announce")
for device in ("a", "b"):
    with store.transaction():
        store.add_volunteer(1, device, (True,))
store.flush()
for device in ("c", "d"):
    with store.transaction():
        store.add_volunteer(1, device, (True,))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_before_the_flush_loses_only_the_open_batch(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    crash = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CRASH), str(path)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert crash.returncode == -9, crash.stderr.decode()

    store = CoordinatorStore(path, commit=LONG)
    try:
        record = store.round(1)
        assert record is not None
        assert sorted(record.volunteers) == ["a", "b"]
        again = Volunteer(federation="f", round=1, sender="c", draws=(True,))
        assert not store.is_duplicate(again.message_id, natural_key(again))
        with store.transaction():  # the device's retransmission refills it
            store.add_volunteer(1, "c", again.draws)
        store.flush()
    finally:
        store.close()
    assert _committed(path, "SELECT device_id FROM volunteers ORDER BY 1") == [
        ("a",),
        ("b",),
        ("c",),
    ]


def test_a_queued_message_leaves_only_once_its_batch_is_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    store = CoordinatorStore(path, commit=LONG)
    seen_at_delivery: list[list[tuple[object, ...]]] = []
    with InMemoryBus() as bus:
        rx = InMemoryTransport(bus, "rx")
        rx.set_handler(
            lambda topic, payload: seen_at_delivery.append(
                _committed(path, "SELECT value FROM meta WHERE key = 'state'")
            )
        )
        rx.connect()
        rx.subscribe("x/#")
        tx = InMemoryTransport(bus, "tx")
        tx.connect()
        outbox = Outbox("tx")
        outbox.wait_for(store)
        try:
            with store.transaction():
                store.set_meta("state", "selected")
                outbox.put("x/result", b"r", 1)
                outbox.flush(tx)  # inside the unit: it must wait
            assert len(outbox) == 1
            outbox.flush(tx)
            bus.flush()
        finally:
            tx.close()
            rx.close()
            store.close()
    assert seen_at_delivery == [[("selected",)]]
