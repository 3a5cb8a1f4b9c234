"""The service publishes nothing that its committed store does not hold yet."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from ursa.coordinator.config import StoreConfig
from ursa.coordinator.store import DB_FILENAME
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.inmemory import InMemoryTransport

from .conftest import FEDERATION

LONG = StoreConfig(commit_interval_s=60, commit_max_records=100_000)
"""Batches are committed only when something is published (or on stop)."""


def _committed(db: Any, sql: str, args: tuple[object, ...]) -> list[Any]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


def test_what_a_publication_reveals_is_committed_before_it_leaves(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, tries=2, rounds=2, store=LONG)
    db = fed.config.state_dir / DB_FILENAME
    checked: list[tuple[str, bool]] = []

    def check(topic: str, payload: bytes) -> None:
        try:
            message = decode(payload)
        except ProtocolError:
            return
        if message.kind == "enrol_result" and message.accepted:
            device = topic.split("/dev/")[1].split("/")[0]
            rows = _committed(
                db, "SELECT 1 FROM devices WHERE device_id = ?", (device,)
            )
            checked.append(("enrol_result", bool(rows)))
        elif message.kind == "registry_sum":
            sql = "SELECT registry_sum_msg IS NOT NULL FROM epochs WHERE epoch = ?"
            rows = _committed(db, sql, (message.epoch,))
            checked.append(("registry_sum", rows == [(1,)]))
        elif message.kind == "selection_result":
            sql = "SELECT result IS NOT NULL FROM rounds WHERE round = ?"
            rows = _committed(db, sql, (message.round,))
            checked.append(("selection_result", rows == [(1,)]))

    spy = InMemoryTransport(fed.bus, "commit-spy")
    spy.set_handler(check)
    spy.subscribe(f"ursa/v1/{FEDERATION}/#")
    spy.connect()
    try:
        fed.start()
        assert fed.coordinator.is_done
    finally:
        spy.close()

    kinds = {kind for kind, _ in checked}
    assert kinds == {"enrol_result", "registry_sum", "selection_result"}
    assert [c for c in checked if not c[1]] == []
    assert fed.coordinator.store.stats().commits < len(fed.captured)
