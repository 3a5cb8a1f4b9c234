"""The one-time move of Dubhe's state out of the core tables (schema ``dubhe`` 1).

Before, the core store kept Dubhe's rounds in tables of its own: a
``volunteers`` and a ``distributions`` table, and ``tries`` and
``candidates`` columns of ``rounds``. A state dir written then still opens:
`migrate` moves those rows into Dubhe's records (`ursa.coordinator.methods.
dubhe.records`) and drops the old tables and columns, in one transaction
recorded in ``meta`` as ``schema.dubhe`` = 1 (`CoordinatorStore.migrate`),
so it runs once and a crash halfway leaves the old form whole. A round that
was open resumes from the moved rows; a re-sent answer finds its row and is
still counted once. Its DDL below is the only copy of the old one.
"""

from __future__ import annotations

import sqlite3

from ursa.coordinator.methods.dubhe.records import (
    CANDIDATES,
    DISTRIBUTIONS,
    NAMESPACE,
    TRIES,
    VOLUNTEERS,
)
from ursa.coordinator.store import CoordinatorStore, SchemaSql

__all__ = ["LEGACY_SCHEMA", "SCHEMA", "VERSION", "migrate"]

SCHEMA = NAMESPACE
"""The schema's name in ``meta`` (``schema.dubhe``)."""
VERSION = 1
"""Dubhe's records in the method tables."""

LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, announce BLOB NOT NULL,
    tries TEXT, candidates TEXT, selected TEXT, try_index INTEGER,
    result BLOB, completed INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS volunteers (
    round INTEGER NOT NULL, device_id TEXT NOT NULL, draws TEXT NOT NULL,
    PRIMARY KEY (round, device_id));
CREATE TABLE IF NOT EXISTS distributions (
    round INTEGER NOT NULL, device_id TEXT NOT NULL, blob BLOB NOT NULL,
    PRIMARY KEY (round, device_id));
"""
"""The tables Dubhe's rounds were kept in before (for tests of the move)."""

_ROWS = (("volunteers", "draws", VOLUNTEERS), ("distributions", "blob", DISTRIBUTIONS))
_COLUMNS = (("tries", TRIES), ("candidates", CANDIDATES))
_DROP_COLUMN = sqlite3.sqlite_version_info >= (3, 35, 0)


def migrate(store: CoordinatorStore) -> bool:
    """Move a store's old Dubhe tables into Dubhe's records once; True if it ran."""
    return store.migrate(SCHEMA, VERSION, _move)


def _move(sql: SchemaSql) -> None:
    tables = {
        str(r[0]) for r in sql.read("SELECT name FROM sqlite_master WHERE type='table'")
    }
    for table, column, prefix in _ROWS:
        if table not in tables:
            continue
        sql.write(
            "INSERT OR IGNORE INTO method_rows "
            f"SELECT ?, ? || round, device_id, CAST({column} AS BLOB) FROM {table}",
            (NAMESPACE, prefix),
        )
        sql.write(f"DROP TABLE {table}")
    columns = {str(r[1]) for r in sql.read("PRAGMA table_info(rounds)")}
    for column, prefix in _COLUMNS:
        if column not in columns:
            continue
        sql.write(
            "INSERT OR IGNORE INTO method_state "
            f"SELECT ?, ? || round, {column} FROM rounds WHERE {column} IS NOT NULL",
            (NAMESPACE, prefix),
        )
        if _DROP_COLUMN:
            sql.write(f"ALTER TABLE rounds DROP COLUMN {column}")
        else:  # an old SQLite: the column stays, empty and unread
            sql.write(f"UPDATE rounds SET {column} = NULL")
