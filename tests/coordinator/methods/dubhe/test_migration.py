"""A state dir written before Dubhe's records moved opens, moves once, resumes.

`write_as_before` also serves the service's restart test
(``test_restart_from_sqlite_mid_round_resumes_without_double_counting``),
which restarts on a store rewritten in the old form.

The old forms are written by hand (`LEGACY_SCHEMA`, the old DDL's only
copy), as the coordinators of the versions before wrote them: before
version 1, Dubhe's rows in core ``volunteers`` and ``distributions`` tables,
tries and candidates as columns of ``rounds``, no ``method_rows`` table and
no ``schema.dubhe`` in ``meta``; before version 2 too, each registrant's
registry ciphertext and rank key in a core ``rank_entries`` table.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from ursa.coordinator.methods.dubhe import DubheStep
from ursa.coordinator.methods.dubhe.migration import LEGACY_SCHEMA, VERSION
from ursa.coordinator.methods.dubhe.records import (
    RANK_KEYS,
    DubheRecords,
    natural_key,
)
from ursa.coordinator.methods.registry import migrate_store
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.crypto.paillier_keys import generate_keypair
from ursa.protocol.messages import EncryptedDistribution, TryAssignment, Volunteer

from .test_selection import FED, FakeContext, distribution, method, request

TRIES = (("d0", "d1"), ("d0", "d2"))
REGISTRY = {"d0": b"registry-0", "d1": b"registry-1", "d2": b"registry-2"}
RANK_KEY = {"d0": bytes(range(32)), "d1": bytes(range(1, 33)), "d2": b""}
"""d2 registered under the paper draw's form: no rank key (``b""``)."""


@pytest.fixture(scope="module")
def keys() -> tuple[PaillierPublicKey, PaillierSecretKey]:
    return generate_keypair(512)


def _tables(db: sqlite3.Connection) -> set[str]:
    rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    return {str(r[0]) for r in rows}


def write_old_store(path: Path, blob: bytes) -> None:
    """Round 1 mid-distributions, as the old coordinator left it: d0 delivered."""
    with closing(sqlite3.connect(path)) as db:
        db.executescript(LEGACY_SCHEMA)
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(
            "INSERT INTO rounds (round, epoch, announce, tries) VALUES (1, 1, ?, ?)",
            (b"announce", json.dumps([list(t) for t in TRIES])),
        )
        for device, draws in (("d0", [True, True]), ("d1", [True, False])):
            db.execute(
                "INSERT INTO volunteers VALUES (1, ?, ?)", (device, json.dumps(draws))
            )
        db.execute("INSERT INTO distributions VALUES (1, 'd0', ?)", (blob,))
        db.executemany(
            "INSERT INTO rank_entries VALUES (1, ?, ?, ?)",
            [(d, REGISTRY[d], RANK_KEY[d]) for d in REGISTRY],
        )
        db.commit()


def write_as_before(path: Path) -> None:
    """Rewrite a store of this version in the old form (what it was before)."""
    with closing(sqlite3.connect(path)) as db:
        db.execute("ALTER TABLE rounds ADD COLUMN tries TEXT")
        db.execute("ALTER TABLE rounds ADD COLUMN candidates TEXT")
        db.executescript(LEGACY_SCHEMA)
        rows = db.execute(
            "SELECT key, device_id, value FROM method_rows WHERE method = 'dubhe' "
            "AND key NOT LIKE ? || '%'",
            (RANK_KEYS,),
        ).fetchall()
        for key, device, value in rows:
            table, _, round_index = str(key).partition(".")
            old = bytes(value).decode() if table == "volunteers" else bytes(value)
            db.execute(
                f"INSERT INTO {table} VALUES (?, ?, ?)", (int(round_index), device, old)
            )
        states = db.execute(
            "SELECT key, value FROM method_state WHERE method = 'dubhe'"
        ).fetchall()
        for key, value in states:
            column, _, round_index = str(key).partition(".")
            if column in ("tries", "candidates"):
                db.execute(
                    f"UPDATE rounds SET {column} = ? WHERE round = ?",
                    (value, int(round_index)),
                )
                db.execute(
                    "DELETE FROM method_state WHERE method = 'dubhe' AND key = ?",
                    (key,),
                )
        db.execute(
            "INSERT INTO rank_entries SELECT r.epoch, r.device_id, r.registry, "
            "coalesce(k.value, x'') FROM registries r LEFT JOIN method_rows k "
            "ON k.method = 'dubhe' AND k.key = ? || r.epoch "
            "AND k.device_id = r.device_id",
            (RANK_KEYS,),
        )
        db.execute("DROP TABLE registries")
        db.execute("DROP TABLE method_rows")
        db.execute("DELETE FROM meta WHERE key = 'schema.dubhe'")
        db.commit()


def test_the_old_rows_move_once_into_dubhes_records(
    tmp_path: Path, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    path = tmp_path / "c.sqlite3"
    blob = distribution(keys[0], "d0", [1.0, 0, 0, 0])
    write_old_store(path, blob)

    store = CoordinatorStore(path)
    migrate_store(store)
    assert store.get_meta("schema.dubhe") == str(VERSION)
    kept = DubheRecords(store).round(1)
    assert kept.volunteers == {"d0": (True, True), "d1": (True, False)}
    assert kept.tries == TRIES
    assert kept.distributions == {"d0": blob}
    assert kept.candidates is None
    again = Volunteer(federation=FED, round=1, sender="d1", draws=(True, False))
    assert store.is_duplicate(again.message_id, natural_key(again))
    record = store.round(1)
    assert record is not None and (record.epoch, record.selected) == (1, None)
    store.set_meta("after", "x")
    assert store.registry_blobs(1) == REGISTRY
    assert store.method_rows("dubhe", f"{RANK_KEYS}1") == {
        d: k for d, k in RANK_KEY.items() if k
    }
    assert not store.migrate("dubhe", VERSION, lambda sql: pytest.fail("twice"))
    store.close()

    with closing(sqlite3.connect(path)) as db:  # committed, the old form gone
        assert not {"volunteers", "distributions", "rank_entries"} & _tables(db)
        columns = {str(r[1]) for r in db.execute("PRAGMA table_info(rounds)")}
    if sqlite3.sqlite_version_info >= (3, 35, 0):
        assert not {"tries", "candidates"} & columns
    store = CoordinatorStore(path)
    migrate_store(store)  # a second open: nothing moves again
    assert DubheRecords(store).round(1) == kept
    assert store.count_method_rows("dubhe", "volunteers.1") == 2
    store.close()


def test_the_moved_round_resumes_and_counts_a_resent_answer_once(
    tmp_path: Path, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> None:
    public = keys[0]
    path = tmp_path / "c.sqlite3"
    blob = distribution(public, "d0", [1.0, 0, 0, 0])
    write_old_store(path, blob)
    store = CoordinatorStore(path)
    migrate_store(store)
    ctx = FakeContext(store, public)
    dubhe, router = method(ctx, tries=2)

    dubhe.resume(request(ctx, 100.0))

    assert dubhe.step is DubheStep.DISTRIBUTIONS
    assert sorted(d for _, d in ctx.of(TryAssignment)) == ["d1", "d2"]  # not d0
    router.dispatch(
        EncryptedDistribution(federation=FED, round=1, sender="d0", distribution=blob)
    )  # a re-sent answer: ignored
    assert list(DubheRecords(store).round(1).distributions) == ["d0"]
    store.close()


def _store_at_version_1(path: Path) -> None:
    """What the version before wrote: Dubhe's rounds moved, rank entries core."""
    store = CoordinatorStore(path)
    store.set_meta("schema.dubhe", "1")
    store.add_method_row("dubhe", "volunteers.1", "d0", b"[true]")
    store.close()
    with closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE registries")
        db.executescript(LEGACY_SCHEMA)
        db.executemany(
            "INSERT INTO rank_entries VALUES (?, ?, ?, ?)",
            [(e, d, REGISTRY[d], RANK_KEY[d]) for e in (1, 2) for d in REGISTRY],
        )
        db.commit()


def test_a_store_at_version_1_moves_only_its_rank_entries(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    _store_at_version_1(path)

    store = CoordinatorStore(path)
    migrate_store(store)
    assert store.get_meta("schema.dubhe") == str(VERSION)
    records = DubheRecords(store)
    assert store.method_rows("dubhe", "volunteers.1") == {"d0": b"[true]"}
    for epoch in (1, 2):
        assert store.registry_blobs(epoch) == REGISTRY
        assert records.rank_entries(epoch) == {
            d: (REGISTRY[d], k) for d, k in RANK_KEY.items() if k
        }
    store.close()
    with closing(sqlite3.connect(path)) as db:
        assert "rank_entries" not in _tables(db)


def test_a_registrant_the_check_dropped_has_no_rank_entry(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite3")
    records = DubheRecords(store)
    for device in ("d0", "d1"):
        store.add_registration(1, device, b"sum", REGISTRY[device])
        records.add_rank_key(1, device, RANK_KEY[device])
    store.drop_registrations(1, ["d1"], b"sum")

    assert records.rank_entries(1) == {"d0": (REGISTRY["d0"], RANK_KEY["d0"])}
    records.drop_rank_keys(1)
    assert records.rank_entries(1) == {}
    assert store.registry_blobs(1) == {"d0": REGISTRY["d0"]}  # the key epoch's
    store.close()
