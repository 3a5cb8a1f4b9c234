"""Uniform selection: K of the eligible devices, each subset equally likely.

This is what FedAvg's papers call random client sampling and what Dubhe is
measured against (its "random" figure). Devices do nothing for it beyond
being registered in the key epoch and online; the coordinator draws with its
seeded generator and the runtime signs the result, so a device trains only
on a selection the coordinator really made.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from ursa.coordinator.device_sets import IndexedDevices
from ursa.coordinator.selection import draw_tries
from ursa.coordinator.selection_method import (
    Selection,
    SelectionMethod,
    SelectionRequest,
)

__all__ = ["RandomSelection"]

logger = logging.getLogger("ursa.coordinator.random")


class RandomSelection(SelectionMethod):
    """K eligible devices drawn uniformly without replacement.

    Args:
        window_s: How long a round may wait for K eligible devices before the
            wait is logged (then again every window).
    """

    name: ClassVar[str] = "random"

    def __init__(self, *, window_s: float = 10.0) -> None:
        self._window_s = window_s
        self._waiting_since: float | None = None

    def open_round(self, request: SelectionRequest) -> None:
        """Start the round's waiting window."""
        self._waiting_since = request.now

    def select(self, request: SelectionRequest) -> Selection | None:
        """K ids drawn uniformly; None while fewer are online.

        The runtime's eligible set is indexed, so the draw is O(K) (random
        positions, `draw_tries`); any other set is sorted by id first.
        """
        eligible = request.eligible
        if len(eligible) >= request.k:
            indexed = (
                eligible
                if isinstance(eligible, IndexedDevices)
                else IndexedDevices(sorted(eligible))
            )
            (picked,) = draw_tries({}, indexed, request.k, 1, request.rng)
            return Selection(picked)
        since = self._waiting_since
        if since is None or request.now - since >= self._window_s:
            if since is not None:
                logger.warning(
                    "round %d: %s cannot select %d of %d eligible devices yet; "
                    "asking again",
                    request.round,
                    self.name,
                    request.k,
                    len(eligible),
                )
            self._waiting_since = request.now
        return None
