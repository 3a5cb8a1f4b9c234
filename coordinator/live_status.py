"""A running coordinator's live status: one snapshot for ``/api/status``, ``/metrics``.

`service_status` joins what the service's `Telemetry` counted with the state
it already keeps elsewhere (stage and round, the store's enrolled and online
devices, the transport's byte counts, the process's crypto time), so the
HTTP view (`ursa.tools.observe`) reads one typed object from another thread
without reaching into the service. Once the service stopped (a finished
federation: its store and broker link are closed) the devices and completed
rounds are read from the store's file, read-only (`ursa.coordinator.status`),
so the view of a finished federation shows what it did, not zeros; before
there is any store the device lists are empty. Nothing here raises.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ursa.coordinator.device_health import DeviceHealth, device_health
from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.status import StatusError, read_status
from ursa.coordinator.telemetry import DeviceRounds, TelemetrySnapshot
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
    health: DeviceHealth = field(default_factory=DeviceHealth)
    """Devices failing their rounds or sitting the key epoch out (and why)."""

    @property
    def link(self) -> str:
        """The broker link: ``up``, ``closed`` (the federation finished) or ``down``."""
        if self.connected:
            return "up"
        return "closed" if self.stage == "done" else "down"

    def to_json(self) -> dict[str, Any]:
        """The ``/api/status`` document (JSON-able; no secrets, no device data)."""
        t = self.telemetry
        now = self.collected_at
        none = DeviceRounds()
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
                **asdict(t.device_rounds.get(device, none)),
                "failing": self.health.failing.get(device),
                "sitting_out": self.health.sitting_out.get(device),
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
            "link": self.link,
            "site_links": {
                site: {"up": link.up, "since": link.since}
                for site, link in sorted(self.site_links.items())
            },
            "devices": {
                "enrolled": len(self.enrolled),
                "online": len(self.online & set(self.enrolled)),
                "failing": len(self.health.failing),
                "sitting_out": len(self.health.sitting_out),
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
            "round_figures": list(t.round_figures),
            "errors": [e.to_json() for e in t.errors],
            "collected_at": now,
        }


def service_status(service: CoordinatorService) -> ServiceStatus:
    """Snapshot ``service`` now (safe from any thread, before start and after stop)."""
    state = service.state
    enrolled, online, completed, health = _store_figures(service, state.epoch)
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
        health=health,
    )


def _store_figures(
    service: CoordinatorService, epoch: int
) -> tuple[tuple[str, ...], frozenset[str], int, DeviceHealth]:
    """Enrolled and online devices, completed rounds, the devices in trouble.

    From the store, or (once it is closed) from its file.
    """
    try:
        store = service.store
        return (
            tuple(sorted(store.enrolled())),
            frozenset(store.online()),
            store.completed_rounds(),
            device_health(store.get_meta, epoch),
        )
    except (AttributeError, sqlite3.ProgrammingError):
        pass  # not started yet, or stopped: the store is closed
    try:
        found = read_status(service.config.state_dir, errors=0)
    except StatusError:
        return (), frozenset(), 0, DeviceHealth()  # no store yet
    enrolled = tuple(d.device_id for d in found.devices)
    health = DeviceHealth(found.failing, found.sitting_out)
    return enrolled, frozenset(found.online), found.completed_rounds, health
