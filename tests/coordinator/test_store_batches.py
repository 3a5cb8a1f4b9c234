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
from ursa.protocol.messages import Heartbeat, Registration
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
            store.add_method_row("m", "answers.1", "a", b"yes")
        assert store.pending == 2
        assert store.method_rows("m", "answers.1") == {"a": b"yes"}
        assert _committed(path, "SELECT device_id FROM method_rows") == []

        store.flush()
        assert store.pending == 0
        assert _committed(path, "SELECT device_id FROM method_rows") == [("a",)]
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
        key = NaturalKey.method_row("m", "answers.1", "a")
        assert not store.is_duplicate("id1", key)
        with store.transaction():
            store.add_method_row("m", "answers.1", "a", b"yes")  # no seen row
        assert store.is_duplicate("id2", key)  # a copy with a fresh id too
        assert store.has_record(key)
        for other in (
            NaturalKey.method_row("m", "answers.2", "a"),
            NaturalKey.method_row("m", "answers.1", "b"),
            NaturalKey.method_row("n", "answers.1", "a"),
        ):
            assert not store.is_duplicate("id1", other)
        assert store._exec("SELECT COUNT(*) FROM seen").fetchone()[0] == 0

        registration = Registration(
            federation="f", round=0, sender="b", epoch=3, registry=b"r"
        )
        assert natural_key(registration) == NaturalKey.registration(3, "b")
        assert not store.is_duplicate("fresh", natural_key(registration))
        store.add_epoch(3, "b", ("b",), b"notice")
        store.add_registration(3, "b", b"sum")
        assert store.is_duplicate("fresh", natural_key(registration))
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
        key = NaturalKey.method_row("m", "answers.1", "a")
        with store.transaction():  # refused: no record, a seen row
            store.mark_seen("garbled", 1.0)
        assert store.is_duplicate("garbled", key)
        assert not store.is_duplicate("fixed", key)
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
        store.add_method_row("m", "answers.1", device, b"yes")
store.flush()
for device in ("c", "d"):
    with store.transaction():
        store.add_method_row("m", "answers.1", device, b"yes")
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
        assert store.round(1) is not None
        assert sorted(store.method_rows("m", "answers.1")) == ["a", "b"]
        again = NaturalKey.method_row("m", "answers.1", "c")
        assert not store.is_duplicate("c1", again)
        with store.transaction():  # the device's retransmission refills it
            store.add_method_row("m", "answers.1", "c", b"yes")
        store.flush()
    finally:
        store.close()
    assert _committed(path, "SELECT device_id FROM method_rows ORDER BY 1") == [
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
