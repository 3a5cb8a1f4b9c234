"""Who is online, as the coordinator acts on it: an outage is not a departure.

A device's retained status and last will tell the coordinator when it comes
and goes, and phases close early once every *online* device they wait on has
answered. That is right for a device that died, and wrong for a broker
outage: then every device "leaves" at once, or the coordinator itself is cut
off, and the fleet comes back minutes later with its updates still queued in
the broker. `Presence` tells the two apart and holds departures while the
fleet may be coming back:

* the coordinator's own connection drops: departures are held until
  ``grace_s`` after it is back;
* at least half of the online fleet (and at least two devices) leaves within
  ``burst_window_s``: that is an outage seen from the devices' side; the
  departures of the burst are taken back and held for ``grace_s``.

A held departure is applied when its hold ends, unless the device came back
meanwhile. Arrivals always apply at once. Pure: the caller passes the time.
``on_change`` hears every device entering or leaving the online set, so the
caller can keep sets derived from it up to date per device, never per fleet.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["Presence", "churn", "fleet_change"]

logger = logging.getLogger("ursa.coordinator")


class Presence:
    """The online set with held departures.

    Args:
        grace_s: How long departures are held after an outage.
        burst_window_s: Departures this close together count as one burst.
        burst_fraction: A burst this large a part of the online fleet is an
            outage.
        on_change: Called with ``(device, online)`` whenever a device enters
            or leaves the online set (not by `restore`).
    """

    def __init__(
        self,
        *,
        grace_s: float = 30.0,
        burst_window_s: float = 2.0,
        burst_fraction: float = 0.5,
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._on_change = on_change
        self._grace_s = grace_s
        self._burst_window_s = burst_window_s
        self._burst_fraction = burst_fraction
        self.online: set[str] = set()
        """Devices the coordinator counts as online (held departures included)."""
        self._held: set[str] = set()
        self._hold_until: float | None = None
        self._disconnected_at: float | None = None
        self._recent: deque[tuple[float, str]] = deque()

    @property
    def held(self) -> frozenset[str]:
        """Devices that left but are still counted online (an outage's grace)."""
        return frozenset(self._held)

    @property
    def holding(self) -> bool:
        """True while departures are held (disconnected, or in a grace period)."""
        return self._disconnected_at is not None or self._hold_until is not None

    def restore(self, online: Iterable[str]) -> None:
        """Start from the stored online set (after a restart)."""
        self.online.clear()  # in place: the service shares this set
        self.online.update(online)

    def arrived(self, device: str) -> bool:
        """A device is online; True if the online set changed."""
        self._held.discard(device)
        if device in self.online:
            return False
        self.online.add(device)
        self._changed(device, True)
        return True

    def left(self, device: str, now: float) -> bool:
        """A device went offline; True if it leaves the online set now (not held)."""
        if device not in self.online:
            return False
        if self.holding:
            self._held.add(device)
            return False
        self._recent.append((now, device))
        while self._recent and now - self._recent[0][0] > self._burst_window_s:
            self._recent.popleft()
        burst = {d for _, d in self._recent}
        fleet = len(self.online) + len(burst - self.online)
        if len(burst) >= 2 and len(burst) >= self._burst_fraction * fleet:
            logger.warning(
                "%d of %d devices went offline within %.0f s: treating it as a "
                "broker outage, holding their departures for %.0f s",
                len(burst),
                fleet,
                self._burst_window_s,
                self._grace_s,
            )
            for taken_back in sorted(burst - self.online):
                self.online.add(taken_back)
                self._changed(taken_back, True)
            self._held |= burst
            self._recent.clear()
            self._hold_until = now + self._grace_s
            return False
        self.online.discard(device)
        self._changed(device, False)
        return True

    def _changed(self, device: str, online: bool) -> None:
        if self._on_change is not None:
            self._on_change(device, online)

    def connection_lost(self, now: float) -> None:
        """The coordinator's own connection dropped: hold every departure."""
        if self._disconnected_at is None:
            self._disconnected_at = now

    def connection_back(self, now: float) -> float:
        """Connected again: hold departures ``grace_s`` more; the outage's length."""
        since = self._disconnected_at
        self._disconnected_at = None
        self._hold_until = now + self._grace_s
        return 0.0 if since is None else now - since

    def release(self, now: float) -> set[str]:
        """Devices whose held departure applies now (the hold ended)."""
        if self._disconnected_at is not None:
            return set()
        if self._hold_until is None or now < self._hold_until:
            return set()
        self._hold_until = None
        gone, self._held = self._held & self.online, set()
        for device in sorted(gone):
            self.online.discard(device)
            self._changed(device, False)
        if gone:
            logger.info("grace over: %d devices still offline", len(gone))
        return gone


def fleet_change(
    registered: Iterable[str], online: Iterable[str], *, joiners: bool = True
) -> float:
    """How far the online fleet moved from the one a key epoch started with.

    The devices that left plus those that joined, over the ones it started
    with (1.0 when it started with none and someone is online). Without
    ``joiners`` only departures count (an epoch whose key went to as many
    devices as it can seal to).
    """
    before, now = set(registered), set(online)
    return churn(len(before), len(before & now), len(now), joiners=joiners)


def churn(started: int, stayed: int, online: int, *, joiners: bool = True) -> float:
    """`fleet_change` from counts kept per event, so a round's check is O(1).

    ``started``: the devices the key epoch started with; ``stayed``: those of
    them online now; ``online``: every device online now.
    """
    moved = (started - stayed) + (online - stayed if joiners else 0)
    return moved / started if started else float(moved > 0)
