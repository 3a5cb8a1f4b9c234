"""The coordinator's clock: seconds, injected so tests can use a fake one.

Wall-clock seconds by default, because deadlines are persisted and must keep
their meaning across a restart.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Clock"]

Clock = Callable[[], float]
"""Seconds since the epoch (tests pass a fake)."""
