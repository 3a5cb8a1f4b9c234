"""The simulations' clock: it moves only when the driver says so.

A simulated run jumps from one window's end to the next instead of waiting
the windows out (the FLICKER fleet, the Dubhe service engine).
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        """The current fake time in seconds."""
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds
