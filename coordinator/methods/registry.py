"""Which class runs each selection and balancing method named in ``[[methods]]``.

The runtime looks a federation's selection method up here and builds it
with its context (`SelectionContext`), which the method holds from then on,
and its balancing method (FLICKER, run once before the first key epoch);
adding one is a package under ``coordinator/methods/`` and a line below
(plus its settings class in `ursa.coordinator.methods_config`). A method
whose stored form changed lists its one-time migration in
`STORE_MIGRATIONS`; the runtime runs them all when it opens the store,
whatever the federation's method (an old state dir loses the tables an
earlier version made for every method).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ursa.coordinator.balancing import Balancing
from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.dubhe import migration as dubhe_migration
from ursa.coordinator.methods.dubhe import records as dubhe_records
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.methods_config import DubheSpec, FlickerSpec
from ursa.coordinator.selection_method import SelectionContext, SelectionMethod
from ursa.coordinator.store import CoordinatorStore

__all__ = [
    "BALANCING_METHODS",
    "SELECTION_METHODS",
    "STORE_MIGRATIONS",
    "VOLUNTEER_ROWS",
    "ParticipationCap",
    "balancing_method",
    "migrate_store",
    "selection_method",
]


def _dubhe(config: CoordinatorConfig, ctx: SelectionContext) -> SelectionMethod:
    d = config.deadlines
    spec = config.selection_method()
    cap = (
        ParticipationCap(spec.max_participation, spec.participation_window)
        if isinstance(spec, DubheSpec)
        else None
    )
    return DubheSelection(
        ctx,
        tries=config.tries,
        num_classes=config.registry.num_classes,
        volunteer_s=d.volunteer_s,
        distributions_s=d.distributions_s,
        agent_s=d.agent_s,
        draw="stratified" if config.stratified_draw() else "paper",
        cap=cap,
    )


def _random(config: CoordinatorConfig, ctx: SelectionContext) -> SelectionMethod:
    return RandomSelection(window_s=config.deadlines.volunteer_s)


Builder = Callable[[CoordinatorConfig, SelectionContext], SelectionMethod]

SELECTION_METHODS: Mapping[str, Builder] = {
    DubheSelection.name: _dubhe,
    RandomSelection.name: _random,
}


def selection_method(
    config: CoordinatorConfig, ctx: SelectionContext
) -> SelectionMethod:
    """The federation's selection method, built from its config and context."""
    return SELECTION_METHODS[config.selection_method().kind](config, ctx)


STORE_MIGRATIONS: tuple[Callable[[CoordinatorStore], bool], ...] = (
    dubhe_migration.migrate,
)
"""Each method's one-time move of an earlier version's stored form (idempotent)."""


def migrate_store(store: CoordinatorStore) -> None:
    """Run every method's store migration that is due (once per state dir)."""
    for migrate in STORE_MIGRATIONS:
        migrate(store)


VOLUNTEER_ROWS = (dubhe_records.NAMESPACE, dubhe_records.VOLUNTEERS)
"""(method, row key prefix) of a round's volunteers, for ``ursa coordinator
status`` (it reads the file, not a store): ``<prefix><round>``."""


def _flicker(config: CoordinatorConfig, spec: FlickerSpec) -> Balancing:
    return FlickerMethod(
        spec,
        federation=config.federation,
        num_classes=config.registry.num_classes,
        state_dir=config.state_dir,
        seed=config.seed,
    )


BALANCING_METHODS: Mapping[
    str, Callable[[CoordinatorConfig, FlickerSpec], Balancing]
] = {
    FlickerMethod.name: _flicker,
}


def balancing_method(config: CoordinatorConfig) -> Balancing | None:
    """The federation's balancing method, if ``[[methods]]`` names one."""
    spec = config.flicker_method()
    return None if spec is None else BALANCING_METHODS[spec.kind](config, spec)
