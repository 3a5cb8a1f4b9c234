"""Per-device budget of refusal log lines, pure: a window of a few lines per device.

Every refusal (a message the coordinator refused, a device's `ErrorReply`)
used to be one log line and one stored error, so one device sending 3,000
of them wrote 3,000 lines and pushed every other device's refusals out of
`ursa coordinator status`. Here each device may have `RefusalLimits.lines`
refusals recorded (logged, stored) per `RefusalLimits.window_s`; the rest of
its window is only counted, and the count comes back once, as the
``suppressed`` of the device's next recorded refusal or from `overdue` when
its window has closed, for one "N more refusals ... suppressed" line.

A refusal of a kind (its code) the device's window has not recorded yet is
recorded even past ``lines``, for up to `RefusalLimits.kinds` kinds: a flood
of one harmless refusal must not hide a different one that follows (an
identity mismatch behind a thousand stale-run replies). So one device
writes at most ``lines + kinds + 1`` lines a window.

No clock and no I/O: the caller passes the time (seconds, any monotonic
origin). At most `RefusalLimits.tracked` devices are kept; the least
recently refusing goes first (its unreported count is lost, which needs
that many other devices refusing meanwhile).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ursa.protocol.admission_limits import MAX_TRACKED_SENDERS

__all__ = [
    "DEFAULT_KINDS",
    "DEFAULT_LINES",
    "DEFAULT_WINDOW_S",
    "Note",
    "RefusalLimiter",
    "RefusalLimits",
]

DEFAULT_LINES = 5
"""Refusals of one device recorded per window: enough to see what it does."""
DEFAULT_KINDS = 8
"""Kinds of refusal a window records past ``lines`` (one refusal each)."""
DEFAULT_WINDOW_S = 60.0
"""The window (seconds)."""


@dataclass(frozen=True)
class RefusalLimits:
    """How much of the log and the stored errors one device may fill."""

    lines: int = DEFAULT_LINES
    kinds: int = DEFAULT_KINDS
    window_s: float = DEFAULT_WINDOW_S
    tracked: int = MAX_TRACKED_SENDERS
    """Devices kept at once (least recently refusing forgotten first)."""

    def __post_init__(self) -> None:
        if self.lines < 1 or self.kinds < 0 or self.window_s <= 0 or self.tracked < 1:
            raise ValueError("refusal limits must be positive")


@dataclass(frozen=True)
class Note:
    """What `RefusalLimiter.admit` decided about one refusal.

    Attributes:
        record: log (and store) this refusal; False: only count it.
        suppressed: refusals of this device not recorded in its window that
            just closed: the caller writes one summary line for them first.
    """

    record: bool
    suppressed: int = 0


@dataclass
class _Window:
    opened_at: float
    used: int = 0
    extra: int = 0
    """Refusals of a new kind recorded past ``lines``."""
    suppressed: int = 0
    kinds: set[str] = field(default_factory=set)


class RefusalLimiter:
    """Per-device windows of recorded refusals (``None`` is one sender: unknown).

    Not thread-safe: callers hold their own lock.
    """

    def __init__(self, limits: RefusalLimits | None = None) -> None:
        self._limits = limits or RefusalLimits()
        self._windows: OrderedDict[str | None, _Window] = OrderedDict()
        self._pending: set[str | None] = set()

    @property
    def limits(self) -> RefusalLimits:
        """The limits in force."""
        return self._limits

    def admit(self, device: str | None, now: float, kind: str | None = None) -> Note:
        """Judge one refusal of ``device`` at ``now`` (``kind``: e.g. its code)."""
        window, summary = self._current(device, now)
        if window.used < self._limits.lines:
            window.used += 1
        elif kind is None or kind in window.kinds or window.extra >= self._limits.kinds:
            window.suppressed += 1
            self._pending.add(device)
            return Note(False, summary)
        else:  # a kind new to this window: recorded once
            window.extra += 1
        if kind is not None:
            window.kinds.add(kind)  # at most lines + kinds of them
        return Note(True, summary)

    def overdue(self, now: float) -> list[tuple[str | None, int]]:
        """Devices whose window closed with refusals not yet summarised, and counts.

        Each count is reported once (here or by `admit`, never both).
        """
        closed = []
        for device in sorted(self._pending, key=lambda d: d or ""):
            window = self._windows[device]
            if now - window.opened_at >= self._limits.window_s:
                closed.append((device, self._close(device, window)))
        return closed

    def _current(self, device: str | None, now: float) -> tuple[_Window, int]:
        """The device's open window, and the count of the one it replaced."""
        window = self._windows.get(device)
        if window is None:
            return self._track(device, now), 0
        self._windows.move_to_end(device)
        if 0 <= now - window.opened_at < self._limits.window_s:
            return window, 0
        summary = self._close(device, window)  # over, or the clock stepped back
        window.opened_at, window.used, window.extra = now, 0, 0
        window.kinds.clear()
        return window, summary

    def _track(self, device: str | None, now: float) -> _Window:
        window = _Window(opened_at=now)
        self._windows[device] = window
        while len(self._windows) > self._limits.tracked:
            gone, _ = self._windows.popitem(last=False)
            self._pending.discard(gone)
        return window

    def _close(self, device: str | None, window: _Window) -> int:
        count, window.suppressed = window.suppressed, 0
        self._pending.discard(device)
        return count
