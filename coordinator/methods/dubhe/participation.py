"""Dubhe's participation cap: no device in more than a share of recent rounds.

A device's volunteer draws are private (eq. 6 from its own category), so the
coordinator cannot tell a device that always says yes from an honest one in a
rare category. What it can bound is the outcome: a device selected in
``limit = floor(max_participation * window)`` of the last ``window`` rounds
(counted across key epochs, so a re-key does not reset it) sits the next
round's tries out, as a volunteer and as a top-up. So in any ``window``
consecutive rounds a device is selected at most ``limit`` times, whatever it
sends. Rounds before the first count as rounds it was not in, so a short
run never meets the cap: it bounds a device that is selected often over a
whole window, not the honest luck of a few rounds. The cap is lifted for a
round whose eligible devices, without the capped ones, are fewer than K (a
round never selects fewer than K for it).

Pure bookkeeping: the selections come from the method, and after a restart
from the store's round records (`ParticipationCap.restore`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["ParticipationCap"]


class ParticipationCap:
    """Who was selected how often in the last ``window`` rounds; who is capped.

    Args:
        max_participation: The largest share of ``window`` rounds a device may
            be selected in (1.0: no cap).
        window: The sliding window, in rounds.
    """

    def __init__(self, max_participation: float, window: int) -> None:
        if not 0.0 < max_participation <= 1.0:
            raise ValueError(f"max_participation {max_participation} not in (0, 1]")
        if window < 1:
            raise ValueError(f"window {window} must be >= 1")
        self.window = window
        self.limit = max(1, math.floor(max_participation * window))
        """Most selections of one device in ``window`` consecutive rounds."""
        self._rounds: dict[int, tuple[str, ...]] = {}
        self._counts: Counter[str] = Counter()

    @property
    def is_off(self) -> bool:
        """A cap of the whole window bounds nothing."""
        return self.limit >= self.window

    def record(self, round_index: int, selected: Sequence[str]) -> None:
        """Round ``round_index`` selected ``selected`` (once per round; later wins)."""
        previous = self._rounds.pop(round_index, None)
        if previous is not None:
            self._counts.subtract(previous)
        self._rounds[round_index] = tuple(selected)
        self._counts.update(selected)
        self._forget_before(round_index - self.window + 1)

    def restore(self, rounds: Iterable[tuple[int, Sequence[str]]]) -> None:
        """Start again from stored (round, selected) pairs."""
        self._rounds.clear()
        self._counts.clear()
        for round_index, selected in sorted(rounds):
            self.record(round_index, selected)

    def count(self, device: str) -> int:
        """Selections of ``device`` among the rounds kept."""
        return self._counts[device]

    def capped(self, round_index: int) -> frozenset[str]:
        """Devices that may not be selected in ``round_index``.

        Those selected ``limit`` times in the ``window - 1`` rounds before it:
        one more would exceed ``limit`` in the window ending at this round.
        O(devices selected in the window), never a pass over the fleet.
        """
        if self.is_off:
            return frozenset()
        self._forget_before(round_index - self.window + 1)
        return frozenset(d for d, n in self._counts.items() if n >= self.limit)

    def _forget_before(self, first: int) -> None:
        for old in [r for r in self._rounds if r < first]:
            self._counts.subtract(self._rounds.pop(old))
        for device in [d for d, n in self._counts.items() if n <= 0]:
            del self._counts[device]
