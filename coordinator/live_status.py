"""A running coordinator's live status: one snapshot for ``/api/status``, ``/metrics``.

`service_status` joins what the service's `Telemetry` counted with the state
it already keeps elsewhere (stage and round, the store's enrolled and online
devices, the transport's byte counts, the process's crypto time), so the
HTTP view (`ursa.tools.observe`) reads one typed object from another thread
without reaching into the service. A store that is closed (the service
stopped) or not open yet leaves the device lists empty, never raises.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.telemetry import TelemetrySnapshot
from ursa.crypto.timing import crypto_seconds

if TYPE_CHECKING:
    from ursa.coordinator.service import CoordinatorService

__all__ = ["ServiceStatus", "service_status"]


@dataclass(frozen=True)
class ServiceStatus:
    """What an operator sees of one coordinator at one moment."""

    federation: str
    stage: str
    epoch: int
    round: int
    rounds_total: int
    rounds_completed: int
    enrolled: tuple[str, ...]
    online: frozenset[str]
    connected: bool
    messages_sent: int
    messages_received: int
    bytes_sent: int
    bytes_received: int
    crypto_s: float
    telemetry: TelemetrySnapshot
    collected_at: float
    site_links: dict[str, SiteLink] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``/api/status`` document (JSON-able; no secrets, no device data)."""
        t = self.telemetry
        now = self.collected_at
        devices = [
            {
                "id": device,
                "online": device in self.online,
                "last_seen": t.last_seen.get(device),
                "last_seen_ago_s": (
                    None
                    if device not in t.last_seen
                    else max(0.0, now - t.last_seen[device])
                ),
            }
            for device in self.enrolled
        ]
        return {
            "federation": self.federation,
            "stage": self.stage,
            "stage_since": t.stage_since,
            "epoch": self.epoch,
            "round": self.round,
            "rounds_total": self.rounds_total,
            "rounds_completed": self.rounds_completed,
            "methods": list(t.methods),
            "connected": self.connected,
            "site_links": {
                site: {"up": link.up, "since": link.since}
                for site, link in sorted(self.site_links.items())
            },
            "devices": {
                "enrolled": len(self.enrolled),
                "online": len(self.online & set(self.enrolled)),
                "list": devices,
            },
            "traffic": {
                "messages_sent": self.messages_sent,
                "messages_received": self.messages_received,
                "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received,
            },
            "crypto_s": self.crypto_s,
            "updates": t.updates,
            "accuracy": dict(t.accuracy),
            "epsilon": t.epsilon,
            "rejected": dict(t.rejected),
            "rounds": [r.to_json() for r in t.rounds],
            "errors": [e.to_json() for e in t.errors],
            "collected_at": now,
        }


def service_status(service: CoordinatorService) -> ServiceStatus:
    """Snapshot ``service`` now (safe from any thread, before start and after stop)."""
    state = service.state
    enrolled: tuple[str, ...] = ()
    online: frozenset[str] = frozenset()
    completed = 0
    try:
        store = service.store
        enrolled = tuple(sorted(store.enrolled()))
        online = frozenset(store.online())
        completed = store.completed_rounds()
    except (AttributeError, sqlite3.ProgrammingError):
        pass  # not started yet, or stopped: no store to read
    traffic = service.transport_stats
    return ServiceStatus(
        federation=service.federation,
        stage=str(state.stage),
        epoch=state.epoch,
        round=state.round,
        rounds_total=service.config.rounds,
        rounds_completed=completed,
        enrolled=enrolled,
        online=online,
        connected=service.is_connected,
        messages_sent=traffic.messages_sent,
        messages_received=traffic.messages_received,
        bytes_sent=traffic.bytes_sent,
        bytes_received=traffic.bytes_received,
        crypto_s=crypto_seconds(),
        telemetry=service.telemetry.snapshot(),
        collected_at=time.time(),
        site_links=service.site_links,
    )
