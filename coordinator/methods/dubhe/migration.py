"""The one-time move of Dubhe's state out of the core tables (schema ``dubhe`` 2).

Before, the core store kept Dubhe's rounds in tables of its own: a
``volunteers`` and a ``distributions`` table, and ``tries`` and
``candidates`` columns of ``rounds`` (moved by version 1); and each key
epoch's registrants in a ``rank_entries`` table holding, per device, the
registry ciphertext (the key epoch's, for the agent's check) beside the
stratified draw's one-time rank key (Dubhe's; ``b""`` under the paper draw).
A state dir written by either earlier version still opens: `migrate` moves
those rows into Dubhe's records (`ursa.coordinator.methods.dubhe.records`)
and the registry ciphertexts into the core ``registries`` table, and drops
the old tables and columns, in one transaction recorded in ``meta`` as
``schema.dubhe`` = 2 (`CoordinatorStore.migrate`), so it runs once and a
crash halfway leaves the old form whole. Every step looks for what it moves,
so a store at version 1 takes only the second. A round that was open
resumes from the moved rows; a re-sent answer finds its row and is still
counted once; an epoch's rank hand-out resumes with its keys. Its DDL below
is the only copy of the old one.
"""

from __future__ import annotations

import sqlite3

from ursa.coordinator.methods.dubhe.records import (
    CANDIDATES,
    DISTRIBUTIONS,
    NAMESPACE,
    RANK_KEYS,
    TRIES,
    VOLUNTEERS,
)
from ursa.coordinator.store import CoordinatorStore, SchemaSql

__all__ = ["LEGACY_SCHEMA", "SCHEMA", "VERSION", "migrate"]

SCHEMA = NAMESPACE
"""The schema's name in ``meta`` (``schema.dubhe``)."""
VERSION = 2
"""Dubhe's records in the method tables (1: rounds; 2: rank keys too)."""

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
CREATE TABLE IF NOT EXISTS rank_entries (
    epoch INTEGER NOT NULL, device_id TEXT NOT NULL, registry BLOB NOT NULL,
    rank_key BLOB NOT NULL, PRIMARY KEY (epoch, device_id));
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
    if "rank_entries" in tables:
        _move_rank_entries(sql)
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


def _move_rank_entries(sql: SchemaSql) -> None:
    """Registries to the key epoch's core table, rank keys to Dubhe's rows."""
    sql.write(
        "INSERT OR IGNORE INTO registries "
        "SELECT epoch, device_id, registry FROM rank_entries"
    )
    sql.write(
        "INSERT OR IGNORE INTO method_rows "
        "SELECT ?, ? || epoch, device_id, rank_key FROM rank_entries "
        "WHERE length(rank_key) > 0",
        (NAMESPACE, RANK_KEYS),
    )
    sql.write("DROP TABLE rank_entries")
