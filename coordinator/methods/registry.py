"""Which class runs each selection method named in ``[[methods]]``.

The runtime looks a federation's selection method up here; adding one is a
package under ``coordinator/methods/`` and a line below (plus its settings
class in `ursa.coordinator.methods_config`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.methods_config import DubheSpec
from ursa.coordinator.selection_method import SelectionMethod

__all__ = ["SELECTION_METHODS", "selection_method"]


def _dubhe(config: CoordinatorConfig) -> SelectionMethod:
    d = config.deadlines
    spec = config.selection_method()
    cap = (
        ParticipationCap(spec.max_participation, spec.participation_window)
        if isinstance(spec, DubheSpec)
        else None
    )
    return DubheSelection(
        tries=config.tries,
        num_classes=config.registry.num_classes,
        volunteer_s=d.volunteer_s,
        distributions_s=d.distributions_s,
        agent_s=d.agent_s,
        draw="stratified" if config.stratified_draw() else "paper",
        cap=cap,
    )


def _random(config: CoordinatorConfig) -> SelectionMethod:
    return RandomSelection(window_s=config.deadlines.volunteer_s)


SELECTION_METHODS: Mapping[str, Callable[[CoordinatorConfig], SelectionMethod]] = {
    DubheSelection.name: _dubhe,
    RandomSelection.name: _random,
}


def selection_method(config: CoordinatorConfig) -> SelectionMethod:
    """The federation's selection method, built from its config."""
    return SELECTION_METHODS[config.selection_method().kind](config)
