"""The site links a coordinator depends on: Mosquitto bridges from site brokers.

A fleet spread over sites reaches the core broker through one bridge per
site (`ursa.tools.broker.bridge`). When a bridge drops, its devices stay
connected to their own broker: no last will reaches the coordinator, so
without this they look online and merely silent. Each bridge publishes its
state on the core (`ursa/bridge/<site>/state`, retained ``1``, will ``0``);
`SiteLinks` keeps those states and, when a link comes back, says how long it
was down, so the coordinator gives its open windows that time back, as it
does after its own broker outage. Pure: the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SiteLink", "SiteLinks"]


@dataclass(frozen=True, slots=True)
class SiteLink:
    """One bridge's last known state and when the coordinator learnt it."""

    up: bool
    since: float


class SiteLinks:
    """The last known state of every site bridge that has published one."""

    def __init__(self) -> None:
        self._links: dict[str, SiteLink] = {}

    def update(self, site: str, up: bool, now: float) -> float:
        """Record a state message; seconds the link was down if it just came back.

        A repeated state (a retained copy after a reconnect) changes nothing
        and returns 0; a link first seen up returns 0 too.
        """
        before = self._links.get(site)
        if before is not None and before.up == up:
            return 0.0
        self._links[site] = SiteLink(up, now)
        if up and before is not None:
            return max(0.0, now - before.since)
        return 0.0

    @property
    def down(self) -> tuple[str, ...]:
        """Sites whose bridge is down now, sorted."""
        return tuple(sorted(s for s, link in self._links.items() if not link.up))

    def snapshot(self) -> dict[str, SiteLink]:
        """A copy of every known link (safe to read from another thread)."""
        return dict(self._links)
