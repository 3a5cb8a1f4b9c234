"""SQLite persistence of the coordinator: the one store of its state.

Core tables (devices, key epochs, rounds, seen ids), each method's progress
(``method_state``: one JSON value per method and key; ``method_rows``: one
bytes value per method, key and device, for the answers a method keeps per
device, e.g. one per round) and the records of live
phases (``phases``: `ursa.coordinator.gather.Gather`,
`ursa.coordinator.wait.Wait`, `ursa.coordinator.relay.Relay` as JSON), so no
method keeps files of its own. A gather over the whole fleet saves its full
record when it opens and closes; between, each reply adds one row of its
device (``phase_replies``) and replaces the record's few changing fields
(``phase_progress``), so a reply costs O(1) writes, not a record of every
answered id (`save_phase_reply`); `phase` merges them back. Model
checkpoints are artefacts, not state: they stay files
(`ursa.coordinator.model_store`).

One file, ``<state_dir>/coordinator.sqlite3`` (WAL, ``synchronous=NORMAL``:
a committed transaction survives a process kill; a power cut may lose the
last few). Group commit: every state change and the message id that caused
it are one atomic unit (`CoordinatorStore.transaction`, a savepoint), and
the units join one open SQLite transaction that is committed every
`CommitPolicy.interval_s` or every `CommitPolicy.max_records` writes,
whichever comes first (`flush_if_due`), or at once when something is to be
published (`commit_through`, the outbox's gate: nothing that reveals a state
change leaves before the change is committed), and on `close`. A commit per
message cost about a fifth of the coordinator's handling time. After
``kill -9`` the coordinator resumes where the last committed batch left it;
the messages of the lost batch were never answered in a way that reveals
them, and the devices send them again (same ids) when the restarted
coordinator re-publishes what its stage waits on.

De-duplication: a message stored as a record with a natural key (a
method row's method, key and device, a registration's epoch and device:
`NaturalKey`) is recognised by that record (`has_record`); other messages by
a ``seen`` row of their message id.

Schema changes of a state dir written by an earlier version run once, each in
one transaction recorded in ``meta`` under ``schema.<name>`` (`migrate`); a
method's own migration lives in its folder and is run through the registry.

What is stored is what the coordinator may know (docs/threat_model.md): device public
identities, who is online, the agent, public keys, ciphertexts (running
registry sum), the selection and the signed notices it published, and what
each method keeps (ciphertexts, public answers and one-time public keys:
never a plaintext), and each registrant's registry ciphertext until its key
epoch's check is over. Never a plaintext category, registry or secret
key: the coordinator has none.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ursa.coordinator.store_batches import BatchedConnection, CommitPolicy, StoreStats
from ursa.protocol.untrusted_text import escape

__all__ = [
    "DB_FILENAME",
    "LAST_ROUND_PREFIX",
    "MAX_ERRORS",
    "MAX_ERRORS_PER_DEVICE",
    "RECENT_ERRORS_SQL",
    "RUN_KEY",
    "SCHEMA_PREFIX",
    "SHOWN_PER_DEVICE",
    "CoordinatorStore",
    "EpochRecord",
    "ErrorRecord",
    "NaturalKey",
    "RoundRecord",
    "SchemaSql",
]

logger = logging.getLogger("ursa.coordinator.store")

LAST_ROUND_PREFIX = "last_round."
"""Meta keys ``last_round.<model>``: a model's last training round's figures
(JSON: updates, accuracy, device metrics), for `ursa coordinator status`."""

DB_FILENAME = "coordinator.sqlite3"
RUN_KEY = "run"
"""Meta key of this store's run id (made once, with the store)."""
SCHEMA_PREFIX = "schema."
"""Meta keys ``schema.<name>``: the version a migration brought the store to."""
DEFAULT_MAX_SEEN = 200_000
"""Message ids kept for de-duplication. An older id may be forgotten safely: a
message that old is for a finished round or epoch and is refused as late."""
_PRUNE_EVERY = 1_000
MAX_ERRORS = 100
"""Refusals kept for `ursa coordinator status` (the newest; the log has the rest)."""
MAX_ERRORS_PER_DEVICE = 5
"""Refusals kept per device (None, an unknown sender, counts as one): a flood
from one device replaces its own, never the others'."""
SHOWN_PER_DEVICE = 2
"""Refusals per device `recent_errors` (and status) list, newest first."""
RECENT_ERRORS_SQL = """
SELECT at, device, what, code, reason FROM (
    SELECT id, at, device, what, code, reason,
        ROW_NUMBER() OVER (PARTITION BY device ORDER BY id DESC) AS nth
    FROM errors)
WHERE nth <= ? ORDER BY id DESC LIMIT ?"""
"""The newest refusals, at most (first parameter) per device, (second) in all."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, identity BLOB NOT NULL,
    fingerprint TEXT NOT NULL, enrolled_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS certificates (
    device_id TEXT PRIMARY KEY, certificate BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS presence (
    device_id TEXT PRIMARY KEY, online INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS epochs (
    epoch INTEGER PRIMARY KEY, agent TEXT NOT NULL, recipients TEXT NOT NULL,
    notice BLOB NOT NULL, public_key_msg BLOB, running_sum BLOB,
    registry_sum_msg BLOB);
CREATE TABLE IF NOT EXISTS registrations (
    epoch INTEGER NOT NULL, device_id TEXT NOT NULL,
    PRIMARY KEY (epoch, device_id));
CREATE TABLE IF NOT EXISTS registries (
    epoch INTEGER NOT NULL, device_id TEXT NOT NULL, registry BLOB NOT NULL,
    PRIMARY KEY (epoch, device_id));
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, epoch INTEGER NOT NULL, announce BLOB NOT NULL,
    selected TEXT, try_index INTEGER, result BLOB,
    completed INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS seen (message_id TEXT PRIMARY KEY, seen_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS method_state (
    method TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (method, key));
CREATE TABLE IF NOT EXISTS method_rows (
    method TEXT NOT NULL, key TEXT NOT NULL, device_id TEXT NOT NULL,
    value BLOB NOT NULL, PRIMARY KEY (method, key, device_id));
CREATE TABLE IF NOT EXISTS phases (
    key TEXT PRIMARY KEY, round INTEGER NOT NULL, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS phase_progress (key TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS phase_replies (
    key TEXT NOT NULL, device_id TEXT NOT NULL, PRIMARY KEY (key, device_id));
CREATE TABLE IF NOT EXISTS errors (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, device TEXT,
    what TEXT NOT NULL, code TEXT NOT NULL, reason TEXT NOT NULL);
"""


@dataclass(frozen=True)
class NaturalKey:
    """A record that identifies a message by what it is, not by its id.

    A device sends one registration per key epoch, and a method may take one
    answer per device and key (its round), kept as a method row: the stored
    record is the de-duplication and the message needs no ``seen`` row.
    """

    device: str
    key: str
    """The method row's key, or the key epoch (a registration) in decimal."""
    method: str | None = None
    """The method whose row it is; None: a key epoch's registration."""

    @classmethod
    def registration(cls, epoch: int, device: str) -> NaturalKey:
        """A device's registration in key epoch ``epoch``."""
        return cls(device, str(epoch))

    @classmethod
    def method_row(cls, method: str, key: str, device: str) -> NaturalKey:
        """A method's row of ``device`` under ``key`` (`add_method_row`)."""
        return cls(device, key, method)

    def query(self) -> tuple[str, tuple[object, ...]]:
        """The sub-query finding the record (a constant text), and its arguments."""
        if self.method is None:
            return _REGISTRATION_SQL, (int(self.key), self.device)
        return _METHOD_ROW_SQL, (self.method, self.key, self.device)


_REGISTRATION_SQL = "SELECT 1 FROM registrations WHERE epoch = ? AND device_id = ?"
_METHOD_ROW_SQL = (
    "SELECT 1 FROM method_rows WHERE method = ? AND key = ? AND device_id = ?"
)
_DUPLICATE_SQL = {
    sql: f"SELECT EXISTS ({sql}) OR EXISTS (SELECT 1 FROM seen WHERE message_id = ?)"
    for sql in (_REGISTRATION_SQL, _METHOD_ROW_SQL)
}
"""`CoordinatorStore.is_duplicate`'s one statement per kind of natural key."""


class SchemaSql(Protocol):
    """The SQL a migration runs in its transaction (`CoordinatorStore.migrate`)."""

    def read(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        """Run a query."""

    def write(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        """Run a change."""


@dataclass(frozen=True)
class EpochRecord:
    """A key epoch as persisted (ciphertexts and signed notices as bytes)."""

    epoch: int
    agent: str
    recipients: tuple[str, ...]
    notice: bytes
    public_key_msg: bytes | None
    running_sum: bytes | None
    registry_sum_msg: bytes | None
    registered: frozenset[str]


@dataclass(frozen=True)
class RoundRecord:
    """A round as persisted."""

    round: int
    epoch: int
    announce: bytes
    selected: tuple[str, ...] | None
    try_index: int | None
    result: bytes | None
    completed: bool


@dataclass(frozen=True)
class ErrorRecord:
    """A refused message or enrolment, as `ursa coordinator status` shows it."""

    at: float
    device: str | None
    what: str
    code: str
    reason: str


class CoordinatorStore:
    """The coordinator's SQLite file; thread-safe (one connection, one lock).

    Writes go through a `BatchedConnection` (group commit); reads see the
    open batch, other connections (`ursa coordinator status`) see only what
    is committed.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_seen: int = DEFAULT_MAX_SEEN,
        commit: CommitPolicy | None = None,
    ) -> None:
        """Open (or create) the database at `path`; keep `max_seen` newest ids.

        ``commit``: when batches are committed (default: `CommitPolicy()`).
        """
        if max_seen < 1:
            raise ValueError("max_seen must be at least 1")
        self._max_seen = max_seen
        self._inserts = 0
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._conn = BatchedConnection(self.path, _SCHEMA, commit or CommitPolicy())
        self._lock = self._conn.lock

    @property
    def policy(self) -> CommitPolicy:
        """When batches are committed."""
        return self._conn.policy

    def close(self) -> None:
        """Commit the open batch and close the connection (idempotent)."""
        self._conn.close()

    def transaction(self) -> AbstractContextManager[None]:
        """One atomic unit of writes (a message): all of it stays, or none.

        See `BatchedConnection.transaction`; nested uses join the outer unit.
        """
        return self._conn.transaction()

    @property
    def pending(self) -> int:
        """Writes in the open batch, not committed yet."""
        return self._conn.pending

    def flush(self) -> None:
        """Commit the open batch now (e.g. on a clean stop)."""
        self._conn.flush()

    def flush_if_due(self) -> bool:
        """Commit the open batch if the policy says so (the service's tick)."""
        return self._conn.flush_if_due()

    def position(self) -> int:
        """The write position now (`BatchedConnection.position`)."""
        return self._conn.position()

    def commit_through(self, position: int) -> bool:
        """Make every write up to ``position`` durable: the outbox's gate."""
        return self._conn.commit_through(position)

    def stats(self) -> StoreStats:
        """Statements, commits and writes so far."""
        return self._conn.stats()

    def _exec(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        return self._conn.read(sql, args)

    def _write(self, sql: str, args: tuple[object, ...] = ()) -> sqlite3.Cursor:
        return self._conn.write(sql, args)

    def has_record(self, key: NaturalKey) -> bool:
        """Whether the record a message would store exists (its de-duplication)."""
        return self._exec(*key.query()).fetchone() is not None

    def is_duplicate(self, message_id: str, key: NaturalKey | None) -> bool:
        """Whether a message was handled before: its record exists, or its id is seen.

        One statement. A message with a natural key that was accepted has no
        ``seen`` row (its record is the proof); one that was refused has.
        """
        if key is None:
            return self.is_seen(message_id)
        sql, args = key.query()
        row = self._exec(_DUPLICATE_SQL[sql], (*args, message_id))
        return bool(row.fetchone()[0])

    def migrate(
        self, name: str, version: int, step: Callable[[SchemaSql], None]
    ) -> bool:
        """Bring the store to ``version`` of schema ``name`` once; True if it ran.

        ``step`` runs only when ``meta`` has an older ``schema.<name>`` (or
        none), in one transaction with the new version, committed at once:
        a crash leaves the old form whole, and a second open does nothing.
        """
        meta = SCHEMA_PREFIX + name
        with self._lock:
            found = self.get_meta(meta)
            if found is not None and int(found) >= version:
                return False
            with self.transaction():
                step(self._conn)
                self.set_meta(meta, str(version))
            self.flush()
        logger.info("store schema %s: version %d", name, version)
        return True

    # --- meta and dedup -----------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """A value from the key/value table, or None."""
        row = self._exec("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a value in the key/value table."""
        self._write("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def run_id(self) -> str:
        """This store's run id, made (random, 32 hex digits) the first time it is asked.

        A store is one run of the federation: the id is stable across
        restarts with the same state dir, and an empty store starts a new run.
        """
        with self._lock:
            run = self.get_meta(RUN_KEY)
            if run is None:
                run = secrets.token_hex(16)
                self.set_meta(RUN_KEY, run)
            return run

    def is_seen(self, message_id: str) -> bool:
        """Whether a message with this id was handled before."""
        row = self._exec("SELECT 1 FROM seen WHERE message_id = ?", (message_id,))
        return row.fetchone() is not None

    def mark_seen(self, message_id: str, now: float) -> None:
        """Record a handled message id (the oldest beyond `max_seen` are pruned)."""
        with self.transaction():
            self._write("INSERT OR IGNORE INTO seen VALUES (?, ?)", (message_id, now))
            self._inserts += 1
            if self._inserts % min(_PRUNE_EVERY, self._max_seen) == 0:
                self._write(
                    "DELETE FROM seen WHERE rowid <= (SELECT MAX(rowid) FROM seen) - ?",
                    (self._max_seen,),
                )

    # --- methods' progress and live phases ------------------------------------

    def method_state(self, method: str, key: str) -> Any:
        """A method's saved JSON value under ``key``, or None.

        Raises:
            ValueError: the saved value is not JSON.
        """
        row = self._exec(
            "SELECT value FROM method_state WHERE method = ? AND key = ?",
            (method, key),
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def set_method_state(self, method: str, key: str, value: Any) -> None:
        """Save a method's JSON-able value under ``key``."""
        self._write(
            "INSERT OR REPLACE INTO method_state VALUES (?, ?, ?)",
            (method, key, json.dumps(value)),
        )

    def add_method_row(self, method: str, key: str, device: str, value: bytes) -> None:
        """A method's one row of ``device`` under ``key`` (a second one raises).

        Its `NaturalKey.method_row` then recognises a re-sent message.
        """
        self._write(
            "INSERT INTO method_rows VALUES (?, ?, ?, ?)", (method, key, device, value)
        )

    def method_rows(self, method: str, key: str) -> dict[str, bytes]:
        """Device -> value of a method's rows under ``key``."""
        rows = self._exec(
            "SELECT device_id, value FROM method_rows WHERE method = ? AND key = ?",
            (method, key),
        ).fetchall()
        return {str(d): bytes(v) for d, v in rows}

    def drop_method_rows(self, method: str, key: str) -> None:
        """Forget a method's rows under ``key`` (their use is over)."""
        self._write(
            "DELETE FROM method_rows WHERE method = ? AND key = ?", (method, key)
        )

    def count_method_rows(self, method: str, key: str) -> int:
        """How many rows a method keeps under ``key``."""
        row = self._exec(
            "SELECT COUNT(*) FROM method_rows WHERE method = ? AND key = ?",
            (method, key),
        ).fetchone()
        return int(row[0])

    def phase(self, key: str) -> dict[str, Any] | None:
        """A live phase's record, or None (with the replies saved since, merged).

        The fields saved by `save_phase_reply` replace the record's, and
        its devices join the record's ``answered``.

        Raises:
            ValueError: the saved record is not a JSON object.
        """
        row = self._exec("SELECT record FROM phases WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        record = json.loads(row[0])
        if not isinstance(record, dict):
            raise ValueError(f"phase {key}: the record is not an object")
        progress = self._exec(
            "SELECT record FROM phase_progress WHERE key = ?", (key,)
        ).fetchone()
        if progress is not None:
            fields = json.loads(progress[0])
            if not isinstance(fields, dict):
                raise ValueError(f"phase {key}: the progress is not an object")
            record.update(fields)
        replies = self._exec(
            "SELECT device_id FROM phase_replies WHERE key = ? ORDER BY device_id",
            (key,),
        ).fetchall()
        if replies:
            answered = record.get("answered")
            if not isinstance(answered, list):
                raise ValueError(f"phase {key}: replies saved, but no 'answered'")
            record["answered"] = sorted({*answered, *(str(r[0]) for r in replies)})
        return record

    def save_phase(self, key: str, round_index: int, record: dict[str, Any]) -> None:
        """Save (or replace) a live phase's whole record, opened in ``round_index``.

        Replies saved by `save_phase_reply` are in ``record`` now: they go.
        """
        with self.transaction():
            self._write(
                "INSERT OR REPLACE INTO phases VALUES (?, ?, ?)",
                (key, round_index, json.dumps(record)),
            )
            self._forget_replies(key)

    def save_phase_reply(self, key: str, device: str, fields: dict[str, Any]) -> None:
        """One more reply of a saved phase: ``device`` answered; ``fields`` changed.

        O(1) in the phase's size: one row of the device, and the record's
        changing fields (``fields``, e.g. a gather's folded state) replaced.
        """
        with self.transaction():
            self._write(
                "INSERT OR IGNORE INTO phase_replies VALUES (?, ?)", (key, device)
            )
            self._write(
                "INSERT OR REPLACE INTO phase_progress VALUES (?, ?)",
                (key, json.dumps(fields)),
            )

    def drop_phase(self, key: str) -> None:
        """Forget a finished phase."""
        with self.transaction():
            self._write("DELETE FROM phases WHERE key = ?", (key,))
            self._forget_replies(key)

    def _forget_replies(self, key: str) -> None:
        self._write("DELETE FROM phase_progress WHERE key = ?", (key,))
        self._write("DELETE FROM phase_replies WHERE key = ?", (key,))

    def phase_keys(self) -> list[str]:
        """The keys of the live phases (inspection, tests)."""
        rows = self._exec("SELECT key FROM phases ORDER BY key").fetchall()
        return [str(r[0]) for r in rows]

    # --- devices and presence -----------------------------------------------

    def enrolled(self) -> dict[str, bytes]:
        """Device id -> `DevicePublicIdentity.to_bytes()` of every enrolled device."""
        rows = self._exec("SELECT device_id, identity FROM devices").fetchall()
        return {str(d): bytes(i) for d, i in rows}

    def enrol(
        self, device_id: str, identity: bytes, fingerprint: str, now: float
    ) -> None:
        """Add an enrolled device (its identity never changes afterwards)."""
        self._write(
            "INSERT INTO devices VALUES (?, ?, ?, ?)",
            (device_id, identity, fingerprint, now),
        )

    def certificates(self) -> dict[str, bytes]:
        """Device id -> the operator certificate its last accepted Hello carried."""
        rows = self._exec("SELECT device_id, certificate FROM certificates")
        return {str(d): bytes(c) for d, c in rows.fetchall()}

    def set_certificate(self, device_id: str, certificate: bytes) -> None:
        """Keep a device's operator certificate (a renewed one replaces it)."""
        self._write(
            "INSERT OR REPLACE INTO certificates VALUES (?, ?)",
            (device_id, certificate),
        )

    def online(self) -> set[str]:
        """Devices whose last status said online."""
        rows = self._exec("SELECT device_id FROM presence WHERE online = 1")
        return {str(r[0]) for r in rows.fetchall()}

    def set_online(self, device_id: str, online: bool) -> None:
        """Record a device's liveness."""
        self._write(
            "INSERT OR REPLACE INTO presence VALUES (?, ?)", (device_id, int(online))
        )

    def unenrol(self, device_id: str) -> None:
        """Forget an enrolled device (revoked, or re-enrolled with new keys)."""
        with self.transaction():
            self._write("DELETE FROM devices WHERE device_id = ?", (device_id,))
            self._write("DELETE FROM certificates WHERE device_id = ?", (device_id,))
            self._write("DELETE FROM presence WHERE device_id = ?", (device_id,))

    # --- recent errors ------------------------------------------------------

    def record_error(
        self, at: float, device: str | None, what: str, code: str, reason: str
    ) -> None:
        """Keep a refusal for status, its texts escaped (`untrusted_text`).

        Only the newest `MAX_ERRORS_PER_DEVICE` of a device and the newest
        `MAX_ERRORS` in all are kept.
        """
        with self.transaction():
            self._write(
                "INSERT INTO errors (at, device, what, code, reason) "
                "VALUES (?, ?, ?, ?, ?)",
                (at, device, escape(what, 64), escape(code, 64), escape(reason)),
            )
            self._write(
                "DELETE FROM errors WHERE device IS ? AND id NOT IN "
                "(SELECT id FROM errors WHERE device IS ? ORDER BY id DESC LIMIT ?)",
                (device, device, MAX_ERRORS_PER_DEVICE),
            )
            self._write(  # rows, not ids: the per-device deletes leave id gaps
                "DELETE FROM errors WHERE id NOT IN "
                "(SELECT id FROM errors ORDER BY id DESC LIMIT ?)",
                (MAX_ERRORS,),
            )

    def recent_errors(
        self, limit: int = MAX_ERRORS, *, per_device: int = SHOWN_PER_DEVICE
    ) -> list[ErrorRecord]:
        """The newest refusals, newest first, at most ``per_device`` of each device."""
        rows = self._exec(RECENT_ERRORS_SQL, (per_device, limit)).fetchall()
        return [error_record(row) for row in rows]

    # --- key epochs ---------------------------------------------------------

    def add_epoch(
        self, epoch: int, agent: str, recipients: tuple[str, ...], notice: bytes
    ) -> None:
        """A new key epoch with its agent, recipients and signed notice.

        The earlier epochs' registry ciphertexts go: their check is over.
        """
        self._write(
            "INSERT INTO epochs (epoch, agent, recipients, notice) VALUES (?, ?, ?, ?)",
            (epoch, agent, json.dumps(list(recipients)), notice),
        )
        self._write("DELETE FROM registries WHERE epoch < ?", (epoch,))

    def set_public_key(self, epoch: int, message: bytes) -> None:
        """The agent's signed public-key message, as relayed."""
        self._write(
            "UPDATE epochs SET public_key_msg = ? WHERE epoch = ?", (message, epoch)
        )

    def add_registration(
        self,
        epoch: int,
        device_id: str,
        running_sum: bytes,
        registry: bytes | None = None,
    ) -> None:
        """One more registrant, its registry ciphertext and the new running sum.

        ``registry`` is kept for the agent's one-hot check (`registry_blobs`);
        what a method keeps of the registration it writes in the same
        transaction, under its own name (`SelectionMethod.registered`).
        """
        with self.transaction():
            self._write("INSERT INTO registrations VALUES (?, ?)", (epoch, device_id))
            self._write(
                "UPDATE epochs SET running_sum = ? WHERE epoch = ?",
                (running_sum, epoch),
            )
            if registry is not None:
                self._write(
                    "INSERT INTO registries VALUES (?, ?, ?)",
                    (epoch, device_id, registry),
                )

    def registry_blobs(self, epoch: int) -> dict[str, bytes]:
        """Device -> registry ciphertext of an epoch's registrants (the check's)."""
        rows = self._exec(
            "SELECT device_id, registry FROM registries WHERE epoch = ?", (epoch,)
        ).fetchall()
        return {str(r[0]): bytes(r[1]) for r in rows}

    def drop_registrations(
        self, epoch: int, devices: Sequence[str], running_sum: bytes | None
    ) -> None:
        """Registrants the agent's check left out, and the sum of the others."""
        with self.transaction():
            for device in devices:
                for table in ("registrations", "registries"):
                    self._write(
                        f"DELETE FROM {table} WHERE epoch = ? AND device_id = ?",
                        (epoch, device),
                    )
            self._write(
                "UPDATE epochs SET running_sum = ? WHERE epoch = ?",
                (running_sum, epoch),
            )

    def set_registry_sum(self, epoch: int, message: bytes) -> None:
        """The published RegistrySum message (closes registration)."""
        self._write(
            "UPDATE epochs SET registry_sum_msg = ? WHERE epoch = ?", (message, epoch)
        )

    def epoch(self, epoch: int) -> EpochRecord | None:
        """Load one key epoch."""
        row = self._exec(
            "SELECT epoch, agent, recipients, notice, public_key_msg, running_sum, "
            "registry_sum_msg FROM epochs WHERE epoch = ?",
            (epoch,),
        ).fetchone()
        if row is None:
            return None
        registered = self._exec(
            "SELECT device_id FROM registrations WHERE epoch = ?", (epoch,)
        ).fetchall()
        return EpochRecord(
            epoch=int(row[0]),
            agent=str(row[1]),
            recipients=tuple(json.loads(row[2])),
            notice=bytes(row[3]),
            public_key_msg=_opt_bytes(row[4]),
            running_sum=_opt_bytes(row[5]),
            registry_sum_msg=_opt_bytes(row[6]),
            registered=frozenset(str(r[0]) for r in registered),
        )

    # --- rounds ---------------------------------------------------------------

    def add_round(self, round_index: int, epoch: int, announce: bytes) -> None:
        """Open a round with its announce message."""
        self._write(
            "INSERT INTO rounds (round, epoch, announce) VALUES (?, ?, ?)",
            (round_index, epoch, announce),
        )

    def set_announce(self, round_index: int, announce: bytes) -> None:
        """Replace the announce (a re-announce with a fresh deadline)."""
        self._write(
            "UPDATE rounds SET announce = ? WHERE round = ?", (announce, round_index)
        )

    def set_selection(
        self,
        round_index: int,
        selected: tuple[str, ...],
        try_index: int | None,
        result: bytes,
    ) -> None:
        """The final exactly-K set and the signed SelectionResult."""
        self._write(
            "UPDATE rounds SET selected = ?, try_index = ?, result = ? WHERE round = ?",
            (json.dumps(list(selected)), try_index, result, round_index),
        )

    def complete_round(self, round_index: int) -> bool:
        """Mark a round complete; False if it already was (never counted twice)."""
        cursor = self._write(
            "UPDATE rounds SET completed = 1 WHERE round = ? AND completed = 0",
            (round_index,),
        )
        return cursor.rowcount == 1

    def completed_rounds(self) -> int:
        """How many rounds are complete."""
        row = self._exec("SELECT COUNT(*) FROM rounds WHERE completed = 1").fetchone()
        return int(row[0])

    def rounds_in_epoch(self, epoch: int) -> int:
        """How many rounds were opened in a key epoch."""
        row = self._exec("SELECT COUNT(*) FROM rounds WHERE epoch = ?", (epoch,))
        return int(row.fetchone()[0])

    def last_result(self) -> bytes | None:
        """The most recent published SelectionResult (re-published on restart)."""
        row = self._exec(
            "SELECT result FROM rounds WHERE result IS NOT NULL "
            "ORDER BY round DESC LIMIT 1"
        ).fetchone()
        return None if row is None else bytes(row[0])

    def round(self, round_index: int) -> RoundRecord | None:
        """Load one round (its selection method keeps its own progress)."""
        row = self._exec(
            "SELECT round, epoch, announce, selected, try_index, result, completed "
            "FROM rounds WHERE round = ?",
            (round_index,),
        ).fetchone()
        if row is None:
            return None
        return RoundRecord(
            round=int(row[0]),
            epoch=int(row[1]),
            announce=bytes(row[2]),
            selected=None if row[3] is None else tuple(json.loads(row[3])),
            try_index=None if row[4] is None else int(row[4]),
            result=_opt_bytes(row[5]),
            completed=bool(row[6]),
        )


def error_record(row: tuple[Any, ...]) -> ErrorRecord:
    """An `ErrorRecord` from an ``errors`` row (at, device, what, code, reason).

    Escaped again on the way out (a no-op on rows `record_error` wrote): a
    store written before texts were escaped must not forge status lines.
    """
    at, device, what, code, reason = row
    return ErrorRecord(
        float(at),
        None if device is None else escape(str(device), 64),
        escape(str(what), 64),
        escape(str(code), 64),
        escape(str(reason)),
    )


def _opt_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)
