"""The coordinator's methods: one table, by ``[[methods]]`` kind.

`COORDINATOR_METHODS` maps every kind a coordinator's ``[[methods]]`` may
name, and the runtime's one method-shaped section (``[evaluation]``), to its
entry: its settings class (the table's model in
`ursa.coordinator.methods_config`, which carries the role), its role and
the builder of what the runtime runs for it. It mirrors the device's table
(`ursa.edge_sdk.methods.registry`) and is the only place outside
``methods/`` that names a method: the runtime and `ursa.tools.compose` look
kinds up here and never ask which spec they hold. Adding a method is a
package under ``coordinator/methods/`` (its settings class beside the others)
and one entry below.

What an entry builds depends on its role, so each role has its entry class
(its builder's inputs are what the runtime has when it builds that part):

* selection (`SelectionEntry`): a `SelectionMethod`, built with its
  `SelectionContext` when the runtime's context exists;
* balancing (`BalancingEntry`): a `Balancing` method (FLICKER), built with
  the `MethodContext` likewise;
* training (`TrainingEntry`): the builder of the `RoundPlugin` of the
  federation's rounds (the runtime calls it with the plugin's context),
  from `TrainingInputs` (the hooks and initial weights composition gives),
  and the method's own before-training steps (CLIMB's dual step), which the
  runtime runs;
* evaluation (`StepEntry`): federated evaluation's before-training step,
  when its section asks for one; not a signed method.

A method whose stored form changed lists its one-time migration in
`STORE_MIGRATIONS`; the runtime runs them all when it opens the store,
whatever the federation's method (an old state dir loses the tables an
earlier version made for every method).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from ursa._compat import StrEnum
from ursa.coordinator.balancing import Balancing
from ursa.coordinator.before_training import StepBuilder
from ursa.coordinator.config import CoordinatorConfig, EvaluationConfig
from ursa.coordinator.fleet_eval import FleetEvaluation
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.climb.dual_step import ClimbDualStep
from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.dubhe import migration as dubhe_migration
from ursa.coordinator.methods.dubhe import records as dubhe_records
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.random import RandomSelection
from ursa.coordinator.methods_config import (
    ClimbSpec,
    DubheSpec,
    FedAvgSpec,
    FeddiskSpec,
    FedProxSpec,
    FlickerSpec,
    RandomSpec,
    TrainingSpec,
)
from ursa.coordinator.plugin import NoSteps, PluginBuilder, PluginContext
from ursa.coordinator.selection_method import SelectionContext, SelectionMethod
from ursa.coordinator.store import CoordinatorStore
from ursa.coordinator.training import TrainingPlugin
from ursa.coordinator.training_hooks import TrainingHooks

__all__ = [
    "COORDINATOR_METHODS",
    "STORE_MIGRATIONS",
    "VOLUNTEER_ROWS",
    "BalancingEntry",
    "EntryRole",
    "MethodEntry",
    "ParticipationCap",
    "SelectionEntry",
    "StepEntry",
    "TrainingEntry",
    "TrainingInputs",
    "balancing_method",
    "before_training_steps",
    "migrate_store",
    "selection_method",
    "training_method",
]


class EntryRole(StrEnum):
    """What an entry gives a federation: a method's role, or a runtime step.

    The first three are `ursa.protocol.methods.MethodRole`'s (the settings
    class says which); evaluation is a step every device runs, not in the
    signed method list.
    """

    SELECTION = "selection"
    TRAINING = "training"
    BALANCING = "balancing"
    EVALUATION = "evaluation"


@dataclass(frozen=True)
class TrainingInputs:
    """What composition gives a training builder besides the method's table."""

    hooks: TrainingHooks
    initial_weights: Callable[[str], Path | None]
    """A model's version 0 (by wire name), checked against the architecture."""


@dataclass(frozen=True)
class SelectionEntry:
    """A selection kind: its settings class and its method's builder."""

    settings: type[BaseModel]
    build: Callable[[Any, CoordinatorConfig, SelectionContext], SelectionMethod]
    role: ClassVar[EntryRole] = EntryRole.SELECTION


@dataclass(frozen=True)
class BalancingEntry:
    """A balancing kind: its settings class and its method's builder."""

    settings: type[BaseModel]
    build: Callable[[Any, CoordinatorConfig, MethodContext], Balancing]
    role: ClassVar[EntryRole] = EntryRole.BALANCING


def _no_steps(spec: Any) -> tuple[StepBuilder, ...]:
    return ()


@dataclass(frozen=True)
class TrainingEntry:
    """A training kind: its settings class, its plugin's builder, its steps."""

    settings: type[BaseModel]
    build: Callable[[Any, CoordinatorConfig, TrainingInputs], PluginBuilder]
    steps: Callable[[Any], tuple[StepBuilder, ...]] = _no_steps
    """The method's own steps, run by the runtime before each round trains."""
    role: ClassVar[EntryRole] = EntryRole.TRAINING


@dataclass(frozen=True)
class StepEntry:
    """A runtime step configured by a section: its settings and its builder."""

    settings: type[BaseModel]
    build: Callable[[CoordinatorConfig], StepBuilder | None]
    """The step, or None when the section asks for none."""
    role: ClassVar[EntryRole] = EntryRole.EVALUATION


MethodEntry = SelectionEntry | BalancingEntry | TrainingEntry | StepEntry
EntryT = TypeVar("EntryT", SelectionEntry, BalancingEntry, TrainingEntry, StepEntry)


def _dubhe(
    spec: DubheSpec, config: CoordinatorConfig, ctx: SelectionContext
) -> SelectionMethod:
    d = config.deadlines
    return DubheSelection(
        ctx,
        tries=config.tries,
        num_classes=config.registry.num_classes,
        volunteer_s=d.volunteer_s,
        distributions_s=d.distributions_s,
        agent_s=d.agent_s,
        draw=spec.draw,
        cap=ParticipationCap(spec.max_participation, spec.participation_window),
    )


def _random(
    spec: RandomSpec, config: CoordinatorConfig, ctx: SelectionContext
) -> SelectionMethod:
    return RandomSelection(window_s=config.deadlines.volunteer_s)


def _flicker(
    spec: FlickerSpec, config: CoordinatorConfig, ctx: MethodContext
) -> Balancing:
    return FlickerMethod(
        spec,
        ctx,
        num_classes=config.registry.num_classes,
        state_dir=config.state_dir,
        seed=config.seed,
    )


def _classifier(
    spec: TrainingSpec,
    config: CoordinatorConfig,
    inputs: TrainingInputs,
    *,
    weighting: str = "fedavg",
) -> Callable[[PluginContext], TrainingPlugin]:
    """The classifier's plugin under ``spec``: FedAvg unless ``weighting`` says.

    The initial weights are read (and checked) now, at composition; the
    plugin is built when the runtime calls the builder with its context.
    """
    training = (
        config.training_section()
        .training_config(weighting)
        .model_copy(update={"aggregation": config.aggregation})
    )
    hooks = inputs.hooks.classifier
    return partial(
        TrainingPlugin,
        federation=config.federation,
        state_dir=config.state_dir,
        config=training,
        initial_weights=inputs.initial_weights(training.model),
        evaluate=hooks.evaluate,
        on_round=hooks.on_round,
        method=spec.kind,
    )


def _fedavg(
    spec: FedAvgSpec, config: CoordinatorConfig, inputs: TrainingInputs
) -> PluginBuilder:
    weighting = "equal" if spec.weights == "equal" else "fedavg"
    return _classifier(spec, config, inputs, weighting=weighting)


def _fedprox(
    spec: FedProxSpec, config: CoordinatorConfig, inputs: TrainingInputs
) -> PluginBuilder:
    """FedAvg's rounds: ``mu`` reaches the devices signed in each key epoch."""
    return _classifier(spec, config, inputs)


def _climb(
    spec: ClimbSpec, config: CoordinatorConfig, inputs: TrainingInputs
) -> PluginBuilder:
    """FedAvg's rounds; CLIMB's dual step (`_climb_steps`) sets the weights."""
    return _classifier(spec, config, inputs)


def _climb_steps(spec: ClimbSpec) -> tuple[StepBuilder, ...]:
    return (ClimbDualStep.later(spec),)


def _feddisk(
    spec: FeddiskSpec, config: CoordinatorConfig, inputs: TrainingInputs
) -> PluginBuilder:
    """A federated MADE first, then the classifier's density-ratio rounds."""
    made_hooks = inputs.hooks.made
    made = partial(
        TrainingPlugin,
        federation=config.federation,
        state_dir=config.state_dir,
        config=config.training_section()
        .made_training_config(spec)
        .model_copy(update={"aggregation": config.aggregation}),
        initial_weights=spec.made_initial_weights,
        evaluate=made_hooks.evaluate,
        on_round=made_hooks.on_round,
    )
    classifier = _classifier(spec, config, inputs)
    return lambda ctx: FeddiskPlugin(
        ctx.view,
        federation=config.federation,
        made=made(PluginContext(ctx.view, NoSteps())),  # the MADE's: none
        classifier=classifier(ctx),
        config=spec,
        on_switch=inputs.hooks.on_switch,
    )


def _fleet_evaluation(config: CoordinatorConfig) -> StepBuilder | None:
    if not config.evaluation.every:
        return None
    return FleetEvaluation.later(
        config.evaluation,
        num_classes=config.registry.num_classes,
        max_parties=config.registry.max_parties,
    )


COORDINATOR_METHODS: Mapping[str, MethodEntry] = {
    "dubhe": SelectionEntry(DubheSpec, _dubhe),
    "random": SelectionEntry(RandomSpec, _random),
    "fedavg": TrainingEntry(FedAvgSpec, _fedavg),
    "fedprox": TrainingEntry(FedProxSpec, _fedprox),
    "climb": TrainingEntry(ClimbSpec, _climb, _climb_steps),
    "feddisk": TrainingEntry(FeddiskSpec, _feddisk),
    "flicker": BalancingEntry(FlickerSpec, _flicker),
    "evaluation": StepEntry(EvaluationConfig, _fleet_evaluation),
}
"""Every kind a coordinator's ``[[methods]]`` may name, and ``[evaluation]``."""


def _entry(kind: str, shape: type[EntryT]) -> EntryT:
    entry = COORDINATOR_METHODS[kind]
    if not isinstance(entry, shape):
        raise TypeError(f"{kind!r} is a {entry.role} entry, not a {shape.role} one")
    return entry


def selection_method(
    config: CoordinatorConfig, ctx: SelectionContext
) -> SelectionMethod:
    """The federation's selection method, built from its table and context."""
    spec = config.selection_method()
    return _entry(spec.kind, SelectionEntry).build(spec, config, ctx)


def balancing_method(config: CoordinatorConfig, ctx: MethodContext) -> Balancing | None:
    """The federation's balancing method with its context, if ``[[methods]]`` names one.

    Raises:
        BackendUnavailableError: FLICKER without TenSEAL.
        CryptoError: its key file is unreadable or others may read it.
    """
    spec = config.balancing_method()
    if spec is None:
        return None
    return _entry(spec.kind, BalancingEntry).build(spec, config, ctx)


def before_training_steps(config: CoordinatorConfig) -> tuple[StepBuilder, ...]:
    """The steps the runtime runs before each round trains, in order.

    The training method's own (CLIMB's dual step), then those the runtime's
    sections ask for (federated evaluation); none without a training method.
    """
    spec = config.training_method()
    if spec is None:
        return ()
    built = (
        entry.build(config)
        for entry in COORDINATOR_METHODS.values()
        if isinstance(entry, StepEntry)
    )
    own = _entry(spec.kind, TrainingEntry).steps(spec)
    return (*own, *(step for step in built if step is not None))


def training_method(
    config: CoordinatorConfig, inputs: TrainingInputs
) -> PluginBuilder | None:
    """The plugin builder of the federation's training method (None without one).

    Raises:
        ModelStoreError, OSError, ValueError: a checkpoint, weights or
            setting the plugin cannot start from.
    """
    spec = config.training_method()
    if spec is None:
        return None
    return _entry(spec.kind, TrainingEntry).build(spec, config, inputs)


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
