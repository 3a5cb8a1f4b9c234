"""Uniform selection: K of the eligible devices, each subset equally likely.

This is what FedAvg's papers call random client sampling and what Dubhe is
measured against (its "random" figure). Devices do nothing for it beyond
being registered in the key epoch and online; the coordinator draws with its
seeded generator and the runtime signs the result, so a device trains only
on a selection the coordinator really made.
"""

from __future__ import annotations

from typing import ClassVar

from ursa.coordinator.selection_method import SelectionMethod, SelectionRequest

__all__ = ["RandomSelection"]


class RandomSelection(SelectionMethod):
    """K eligible devices drawn uniformly without replacement."""

    name: ClassVar[str] = "random"

    def select(self, request: SelectionRequest) -> tuple[str, ...] | None:
        """K ids drawn from the sorted eligible set; None while fewer are online."""
        eligible = sorted(request.eligible)
        if len(eligible) < request.k:
            return None
        picked = request.rng.choice(len(eligible), size=request.k, replace=False)
        return tuple(sorted(eligible[int(i)] for i in picked))
