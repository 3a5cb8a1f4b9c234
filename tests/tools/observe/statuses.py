"""A coordinator status for the HTTP view's tests (no coordinator needed)."""

from __future__ import annotations

import time

from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.site_links import SiteLink
from ursa.coordinator.telemetry import Telemetry


def fixed_status(
    telemetry: Telemetry | None = None, round_index: int = 2
) -> ServiceStatus:
    """Round ``round_index`` of 5, d1 and d2 of three devices online, two site links."""
    return ServiceStatus(
        federation="fed",
        stage="training",
        epoch=1,
        round=round_index,
        rounds_total=5,
        rounds_completed=round_index - 1,
        enrolled=("d1", "d2", "d3"),
        online=frozenset({"d1", "d2"}),
        connected=True,
        messages_sent=10,
        messages_received=20,
        bytes_sent=1000,
        bytes_received=3000,
        crypto_s=0.5,
        telemetry=(telemetry or Telemetry()).snapshot(),
        collected_at=time.time(),
        site_links={"site-a": SiteLink(True, 1.0), "site-b": SiteLink(False, 2.0)},
    )
