"""A read-only view of a coordinator's state dir, for `ursa coordinator status`.

It must never disturb a running coordinator: SQLite is opened read-only
(``mode=ro``; ``immutable=1`` when no coordinator has it open, so that no
``-wal``/``-shm`` files are left behind), all reads happen in one deferred
read transaction (a WAL snapshot: it takes no write lock and never blocks
the coordinator's writes), and model checkpoints are read from their
``latest.json``.

What the store persists, and so what status can show: the stage, key epoch
(agent, recipients, registrations), round, enrolled devices with their
fingerprints and presence, each round's volunteers and selection, the live
phases, the devices refusing this coordinator or sitting an epoch out (and
why) or failing their rounds (`ursa.coordinator.device_health`), and
the newest refusals (`CoordinatorStore.record_error`; at most
`SHOWN_PER_DEVICE` of one device, so one device's flood hides no other's),
each model's last
training round's figures (meta ``last_round.<model>``:
`ursa.coordinator.training.round_figures`) and the model version each round
produced (``models/<name>/latest.json``). Earlier rounds' figures are in the
log and in ``/metrics``.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ursa.coordinator.device_health import device_health
from ursa.coordinator.enrolled_devices import REFUSING_KEY
from ursa.coordinator.methods.registry import VOLUNTEER_ROWS
from ursa.coordinator.ready_devices import SAT_OUT_KEY
from ursa.coordinator.stage_machine import STATE_KEY
from ursa.coordinator.store import (
    DB_FILENAME,
    LAST_ROUND_PREFIX,
    RECENT_ERRORS_SQL,
    SHOWN_PER_DEVICE,
    ErrorRecord,
    error_record,
)

__all__ = [
    "DeviceStatus",
    "FederationStatus",
    "ModelStatus",
    "RoundStatus",
    "StatusError",
    "read_status",
]


class StatusError(Exception):
    """No store to read, or one that is not a coordinator's."""


@dataclass(frozen=True)
class DeviceStatus:
    """One enrolled device."""

    device_id: str
    fingerprint: str
    enrolled_at: float
    online: bool


@dataclass(frozen=True)
class RoundStatus:
    """What the store keeps of one round."""

    round: int
    epoch: int
    volunteers: int
    selected: tuple[str, ...] | None
    completed: bool


@dataclass(frozen=True)
class ModelStatus:
    """The newest checkpoint of one global model."""

    model: str
    version: int
    round: int


@dataclass(frozen=True)
class FederationStatus:
    """Everything `ursa coordinator status` prints."""

    stage: str
    epoch: int
    round: int
    deadline_at: float | None
    rekey: bool
    completed_rounds: int
    agent: str | None
    recipients: int
    registered: int
    devices: tuple[DeviceStatus, ...]
    refusing: tuple[str, ...]
    sat_out: dict[str, int]
    failing: dict[str, int]
    """Devices that failed two or more selected rounds in a row: how many."""
    sitting_out: dict[str, str]
    """Devices sitting the current key epoch out: why (`DeviceHealth`)."""
    last_round: RoundStatus | None
    trained: dict[str, dict[str, Any]]
    """Each model's last training round's figures (updates, accuracy, device
    metrics; `ursa.coordinator.training.round_figures`), by model."""
    models: tuple[ModelStatus, ...]
    live_phases: tuple[str, ...]
    errors: tuple[ErrorRecord, ...]

    @property
    def online(self) -> tuple[str, ...]:
        """Enrolled devices whose last status said online."""
        return tuple(d.device_id for d in self.devices if d.online)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (``--json``)."""
        data = asdict(self)
        data["online"] = list(self.online)
        return data


def read_status(state_dir: Path, *, errors: int = 10) -> FederationStatus:
    """Read the coordinator's state from ``state_dir`` without writing anything.

    Raises:
        StatusError: no store there, or it cannot be read.
    """
    path = Path(state_dir).resolve() / DB_FILENAME
    if not path.is_file():
        raise StatusError(f"no coordinator store at {path} (not started yet?)")
    # No write-ahead log: no coordinator has the store open, and a read-only
    # open would create the -wal and -shm files (owned by whoever runs status);
    # immutable=1 reads the file alone. A coordinator starting meanwhile
    # writes to its new log, not to the file read here.
    wal = path.with_name(f"{path.name}-wal")
    query = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    try:
        db = sqlite3.connect(f"{path.as_uri()}?{query}", uri=True, timeout=5.0)
        with closing(db):
            db.execute("BEGIN")  # deferred: one read snapshot, no write lock
            status = _read(db, errors)
            db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StatusError(f"cannot read {path}: {exc}") from None
    models = _models(Path(state_dir) / "models")
    return FederationStatus(**status, models=models)


def _read(db: sqlite3.Connection, errors: int) -> dict[str, Any]:
    tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master")}
    if "meta" not in tables:
        raise StatusError("not a coordinator store")
    meta = {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
    state = json.loads(meta[STATE_KEY]) if STATE_KEY in meta else {}
    epoch = int(state.get("epoch", 0))
    online = {
        str(r[0]) for r in db.execute("SELECT device_id FROM presence WHERE online = 1")
    }
    devices = tuple(
        DeviceStatus(str(d), str(f), float(at), str(d) in online)
        for d, f, at in db.execute(
            "SELECT device_id, fingerprint, enrolled_at FROM devices ORDER BY device_id"
        )
    )
    agent, recipients, registered = None, 0, 0
    row = db.execute("SELECT agent, recipients FROM epochs WHERE epoch = ?", (epoch,))
    found = row.fetchone()
    if found is not None:
        agent, recipients = str(found[0]), len(json.loads(found[1]))
        registered = int(
            db.execute(
                "SELECT COUNT(*) FROM registrations WHERE epoch = ?", (epoch,)
            ).fetchone()[0]
        )
    completed = int(
        db.execute("SELECT COUNT(*) FROM rounds WHERE completed = 1").fetchone()[0]
    )
    recent: tuple[ErrorRecord, ...] = ()
    if "errors" in tables:  # a store written before refusals were kept has none
        rows = db.execute(RECENT_ERRORS_SQL, (SHOWN_PER_DEVICE, errors))
        recent = tuple(error_record(tuple(r)) for r in rows)
    phases = tuple(str(r[0]) for r in db.execute("SELECT key FROM phases ORDER BY key"))
    deadline = state.get("deadline_at")
    health = device_health(meta.get, epoch)
    return {
        "stage": str(state.get("stage", "enrolment")),  # none saved: the first
        "epoch": epoch,
        "round": int(state.get("round", 0)),
        "deadline_at": None if deadline is None else float(deadline),
        "rekey": bool(state.get("rekey", False)),
        "completed_rounds": completed,
        "agent": agent,
        "recipients": recipients,
        "registered": registered,
        "devices": devices,
        "refusing": tuple(sorted(json.loads(meta.get(REFUSING_KEY, "[]")))),
        "sat_out": {
            str(d): int(e) for d, e in json.loads(meta.get(SAT_OUT_KEY, "{}")).items()
        },
        "failing": dict(health.failing),
        "sitting_out": dict(health.sitting_out),
        "last_round": _last_round(db, tables),
        "trained": _trained(meta),
        "live_phases": phases,
        "errors": recent,
    }


def _trained(meta: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The ``last_round.<model>`` figures (a store without them has none)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in meta.items():
        if not key.startswith(LAST_ROUND_PREFIX):
            continue
        try:
            figures = json.loads(value)
        except ValueError:
            continue
        if isinstance(figures, dict):
            out[key[len(LAST_ROUND_PREFIX) :]] = figures
    return out


def _last_round(db: sqlite3.Connection, tables: set[str]) -> RoundStatus | None:
    row = db.execute(
        "SELECT round, epoch, selected, completed FROM rounds "
        "ORDER BY round DESC LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    volunteers, (method, prefix) = 0, VOLUNTEER_ROWS
    if "method_rows" in tables:  # none before the coordinator moved Dubhe's rows
        volunteers = int(
            db.execute(
                "SELECT COUNT(*) FROM method_rows WHERE method = ? AND key = ?",
                (method, f"{prefix}{row[0]}"),
            ).fetchone()[0]
        )
    return RoundStatus(
        round=int(row[0]),
        epoch=int(row[1]),
        volunteers=volunteers,
        selected=None if row[2] is None else tuple(json.loads(row[2])),
        completed=bool(row[3]),
    )


def _models(root: Path) -> tuple[ModelStatus, ...]:
    """Each global model's newest checkpoint (``latest.json``), where readable."""
    found = []
    for latest in sorted(root.glob("*/latest.json")):
        try:
            data = json.loads(latest.read_text())
            found.append(
                ModelStatus(
                    latest.parent.name, int(data["version"]), int(data["round"])
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or foreign: status shows what it can
    return tuple(found)
