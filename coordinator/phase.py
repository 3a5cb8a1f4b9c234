"""What every persisted phase shares: its status and its record's checks.

A phase (`ursa.coordinator.gather.Gather`, `ursa.coordinator.wait.Wait`,
`ursa.coordinator.relay.Relay`) is a small state machine with no I/O: it is
told the time, sends through a callback, and round-trips through a JSON-able
record (`to_record` / `from_record`) that the coordinator's store keeps in the
same transaction as the message that changed it, so a restart resumes it.
"""

from __future__ import annotations

from typing import Any

from ursa._compat import StrEnum

__all__ = ["PhaseRecordError", "PhaseStatus", "Record", "check_record"]

Record = dict[str, Any]
"""A phase's JSON-able record (``json.dumps`` / ``json.loads`` round-trip it)."""


class PhaseRecordError(ValueError):
    """A record that is not the phase it is restored as."""


class PhaseStatus(StrEnum):
    """Where a phase is; only ``OPEN`` phases take messages."""

    OPEN = "open"
    DONE = "done"
    """It got what it waited for (a gather: at least ``min_replies`` replies)."""
    FALLBACK = "fallback"
    """It closed without it (deadline, last wills): the owner's fallback applies."""


def check_record(record: Record, kind: str) -> None:
    """Raise unless ``record`` is a record of a ``kind`` phase.

    Raises:
        PhaseRecordError: another kind, or not a record at all.
    """
    if not isinstance(record, dict) or record.get("kind") != kind:
        raise PhaseRecordError(f"not a {kind} record: {record!r:.80}")
