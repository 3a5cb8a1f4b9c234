"""Broker outages: while the coordinator cannot hear devices, no phase times out.

When our own broker link drops, the presence holds departures (a burst of
last wills is likely the outage, not the fleet leaving); when it is back, or
a site bridge's link is, every live phase is given the outage's time back.
The live phases are known here once (the stage's deadline, `StageMachine`;
the key epoch's agent clocks, `KeyEpoch`: a sealing or a registry check is
not nudged for the outage's time; the selection method's windows; the
methods' before-training steps, `StepRunner`; the training plugin's round
and secure aggregation; the balancing method's ring hop, reply and
redundancy deadlines): an outage extends them all in one loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from ursa.coordinator.presence import Presence
from ursa.coordinator.site_links import SiteLink, SiteLinks
from ursa.protocol.transport import Transport

__all__ = ["BrokerOutage", "LivePhase"]

logger = logging.getLogger("ursa.coordinator")


class LivePhase(Protocol):
    """Anything with a deadline that an outage must not run out."""

    def extend_deadlines(self, seconds: float) -> None:
        """Move every open deadline ``seconds`` later."""


class BrokerOutage:
    """Our broker link and the site links; gives live phases an outage back.

    Args:
        presence: Holds departures while our own link is down.
        phases: Every live phase (each extended by every outage).
    """

    def __init__(self, presence: Presence, phases: Sequence[LivePhase]) -> None:
        self._presence = presence
        self._phases = tuple(phases)
        self._connected = False
        self._site_links = SiteLinks()

    def started(self, connected: bool) -> None:
        """The link's state when the service starts (no outage to give back)."""
        self._connected = connected

    @property
    def site_links(self) -> dict[str, SiteLink]:
        """Every site bridge's last known state (read from any thread)."""
        return self._site_links.snapshot()

    def extend(self, outage_s: float) -> None:
        """Give every live phase back the time the broker was away."""
        if outage_s <= 0:
            return
        for phase in self._phases:
            phase.extend_deadlines(outage_s)

    def watch(self, transport: Transport | None, now: float) -> set[str]:
        """Tell the presence about our own connection; the devices whose hold ended."""
        connected = transport is not None and transport.is_connected
        if connected != self._connected:
            self._connected = connected
            if not connected:
                logger.warning("lost the broker: holding phases open")
                self._presence.connection_lost(now)
            else:
                self.extend(self._presence.connection_back(now))
        return self._presence.release(now)

    def site_link(self, site: str, up: bool, now: float) -> None:
        """A site bridge's state: log it; give open windows a link outage back."""
        outage = self._site_links.update(site, up, now)
        if not up:
            logger.warning(
                "site link %s is down: its devices cannot reach us until it is back",
                site,
            )
        elif outage > 0:
            logger.info("site link %s is back after %.0f s", site, outage)
            self.extend(outage)
