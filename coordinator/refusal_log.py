"""Refusal lines and stored errors of the coordinator, within per-device limits.

The one place a refusal is written: a message the coordinator refused, a
device's `ErrorReply`, a refused enrolment. Each goes through the device's
`RefusalLimiter` window (a few lines per minute; the rest become one "N more
refusals from <device> suppressed" line), and every text argument through
`ursa.protocol.untrusted_text.escape`, so one device can neither forge log
lines nor flush other devices' refusals out of the log, the store
(`CoordinatorStore.record_error` keeps a few per device) or the dashboard
(each record carries ``device`` for `ursa.coordinator.telemetry.RecentErrors`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ursa.coordinator.refusal_limits import RefusalLimiter, RefusalLimits
from ursa.protocol.untrusted_text import escape

__all__ = ["Keep", "RefusalLog", "Stored"]

Keep = Callable[[float, str | None, str, str, str], None]
"""Stores one refusal: (at, device, what, code, reason); e.g. `record_error`."""


@dataclass(frozen=True)
class Stored:
    """The stored form of a refusal (for `ursa coordinator status`)."""

    what: str
    code: str
    reason: str


class RefusalLog:
    """Writes refusals to a logger (and a store) at most a few per device a minute.

    Args:
        log: Where the lines go.
        keep: Stores a refusal (None: lines only, e.g. FLICKER's engine).
        limits: The per-device window.
    """

    def __init__(
        self,
        log: logging.Logger,
        *,
        keep: Keep | None = None,
        limits: RefusalLimits | None = None,
    ) -> None:
        self._log = log
        self._keep = keep
        self._limiter = RefusalLimiter(limits)

    def write(
        self,
        now: float,
        device: str | None,
        level: int,
        template: str,
        *args: object,
        kind: str | None = None,
        stored: Stored | None = None,
    ) -> bool:
        """Log ``template % args`` (texts escaped) for ``device``; keep ``stored``.

        ``kind`` (a code): the first refusal of each kind in a window is
        written even past the device's line budget (`RefusalLimiter`).
        Returns whether it was written (False: over the device's limit, counted).
        """
        note = self._limiter.admit(device, now, kind)
        if note.suppressed:
            self._summarise(now, device, note.suppressed)
        if not note.record:
            return False
        safe = tuple(escape(a) if isinstance(a, str) else a for a in args)
        self._log.log(level, template, *safe, extra={"device": device})
        if stored is not None and self._keep is not None:
            self._keep(now, device, stored.what, stored.code, stored.reason)
        return True

    def flush(self, now: float) -> None:
        """Write the summary line of every device whose window closed meanwhile."""
        for device, count in self._limiter.overdue(now):
            self._summarise(now, device, count)

    def _summarise(self, now: float, device: str | None, count: int) -> None:
        self._log.warning(
            "%d more refusals from %s suppressed in a %.0f s window",
            count,
            device,
            self._limiter.limits.window_s,
            extra={"device": device},
        )
        if self._keep is not None:
            reason = f"{count} more refusals suppressed"
            self._keep(now, device, "refusals", "suppressed", reason)
