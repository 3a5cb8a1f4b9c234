"""A one-line progress bar on stderr for long benchmarks (no dependency)."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["ProgressBar"]

WIDTH = 30


class ProgressBar:
    """``[#####.....] done/total label (elapsed)``, redrawn in place.

    Draws only when ``enabled`` (the CLI enables it on a terminal or with
    ``--progress``), so piped output and JSON stay clean.
    """

    def __init__(self, err: TextIO, total: int, *, enabled: bool) -> None:
        self.err = err
        self.total = max(1, total)
        self.enabled = enabled
        self.done = 0
        self.label = ""
        self._started = time.perf_counter()

    def update(self, done: int) -> None:
        """Show ``done`` of the total (clamped)."""
        self.done = min(max(0, done), self.total)
        if not self.enabled:
            return
        filled = WIDTH * self.done // self.total
        bar = "#" * filled + "." * (WIDTH - filled)
        elapsed = time.perf_counter() - self._started
        self.err.write(
            f"\r[{bar}] {self.done}/{self.total} {self.label} ({elapsed:.0f} s)\x1b[K"
        )
        self.err.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            self.err.write("\n")
            self.err.flush()
