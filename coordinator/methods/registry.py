"""Which class runs each selection method named in ``[[methods]]``.

The runtime looks a federation's selection method up here; adding one is a
package under ``coordinator/methods/`` and a line below (plus its settings
class in `ursa.coordinator.methods_config`). Dubhe is absent: its encrypted
self-selection is still the runtime's own stage flow.
"""

from __future__ import annotations

from collections.abc import Mapping

from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.selection_method import SelectionMethod

__all__ = ["SELECTION_METHODS", "selection_method"]

SELECTION_METHODS: Mapping[str, type[SelectionMethod]] = {
    RandomSelection.name: RandomSelection,
}


def selection_method(kind: str) -> SelectionMethod | None:
    """The method for selection ``kind``; None for Dubhe (the runtime's flow)."""
    cls = SELECTION_METHODS.get(kind)
    return None if cls is None else cls()
