"""A method's step in a round's BEFORE_TRAINING slot: after selection, before training.

The runtime runs the steps, not the training plugin: a
`ursa.coordinator.step_runner.StepRunner`, built with the service's parts
(`ursa.coordinator.components`), opens them in order once the plugin has
published the round's model (`RoundPlugin.on_selected`), and the round
cycle tells the plugin to train once they are done
(`RoundPlugin.on_steps_done`); CLIMB's dual step is one
(`ursa.coordinator.methods.climb`), the federated evaluation another::

    CoordinatorService(config, plugin=build, steps=[ClimbDualStep.later(spec)])
    step = ClimbDualStep(ctx, spec)  # when the service wires its parts, with its
    step.register(router)            # context; the step holds it from then on
    phase = step.open(info, now)     # per round: resumed from its phase record,
                                     # or asked anew; None: nothing this round
    step.on_message / on_tick        # its own kinds (router), deadlines
    step.is_done(round)  -> the next step, then training
    step.close(round)                # the round is over: drop its record

A step persists through the coordinator's store only with the persisted
primitives (`ursa.coordinator.gather`, `ursa.coordinator.secure_mean`, ...):
it saves its phase record in the transaction of the message that changed it,
so a restarted coordinator calling `open` for the same round resumes it. Its
handlers raise `RejectedError` (answered as an `ErrorReply`) for a message
it refuses. What a step changes about the training after it is said here,
not in the training plugin: `name` replaces ``fedavg`` in the signed method
list, `weighting` says how the round averages its updates (`weighting_of`);
the plugin reads the rest through `ursa.coordinator.plugin.TrainingSteps`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol, TypeVar, cast

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.clock import Clock
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.plugin import CoordinatorView, RoundInfo, Send
from ursa.protocol.messages import ModelUpdate
from ursa.protocol.router import Router

__all__ = [
    "BeforeTraining",
    "RoundInfo",
    "StepBuilder",
    "StepContext",
    "StepPhase",
    "weighting_of",
]


P = ParamSpec("P")
StepT = TypeVar("StepT", bound="BeforeTraining")


@dataclass(frozen=True)
class StepContext:
    """What the runtime builds the steps with (`StepBuilder`)."""

    federation: str
    view: CoordinatorView
    """The key epoch, who is online, and the store for phase records."""
    send: Send
    """Publishes through the service's current ``send`` (None: to all)."""
    clock: Clock


class StepPhase(Protocol):
    """What the runtime reads of a step's open phase (a `Gather` is one)."""

    @property
    def key(self) -> str:
        """The phase record's key in the store."""
        ...

    @property
    def status(self) -> PhaseStatus:
        """Open, done, or closed without what it waited for."""
        ...

    @property
    def answered(self) -> Set[str]:
        """Devices that took part."""
        ...


class BeforeTraining(ABC):
    """One method's phase before a round trains (see the module docstring).

    Built with the runtime's context and holding it from then on (`ctx`);
    `later` says how to build it once that context exists.
    """

    name: ClassVar[str]
    """The method's ``[[methods]]`` kind, signed into each key epoch instead of
    ``fedavg`` (devices must run it)."""
    weighting: ClassVar[Weighting | None] = None
    """How the round averages updates when this step is composed (None: the
    training configuration's); CLIMB: deltas the devices already scaled."""
    signed: ClassVar[bool] = True
    """Whether `name` goes into the signed method list (False for a runtime
    step every device runs, such as federated evaluation)."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        """The runtime's context: the store, the epoch, send, clock."""

    @classmethod
    def later(
        cls: Callable[Concatenate[StepContext, P], StepT],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> StepBuilder:
        """This step with ``args``, built when the runtime's context exists."""
        kind = cast(type[BeforeTraining], cls)  # typed as its constructor above
        return StepBuilder(kind, lambda ctx: cls(ctx, *args, **kwargs))

    @abstractmethod
    def register(self, router: Router) -> None:
        """Register the step's message kinds (each kind has one owner)."""

    @abstractmethod
    def open(self, info: RoundInfo, now: float) -> StepPhase | None:
        """Open the round's phase, or resume it from the store's record.

        Returns:
            The phase (it may already be closed after a restart), or None
            when the step does not run in this round.
        """

    @abstractmethod
    def on_tick(self, round_index: int, now: float) -> None:
        """Close the open phase at its deadline, follow who is online."""

    @abstractmethod
    def is_done(self, round_index: int) -> bool:
        """Whether the round's phase is closed (or never opened)."""

    @abstractmethod
    def republish(self, round_index: int) -> None:
        """Send again what devices wait on (the request, or the result)."""

    @abstractmethod
    def close(self, round_index: int) -> None:
        """The round is over: forget its phase and drop its record."""

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """What the step learned in the round, for its record (default: nothing).

        Called once the round has aggregated, before `close`.
        """
        return {}

    def awaits(self, round_index: int, now: float) -> bool:
        """Whether the round must not close yet (default: no).

        True while a figure of the step's own is still on its way as the
        devices train (the fleet evaluation's decrypted result).
        """
        return False

    def fleet_needs_model(self, round_index: int) -> bool:
        """Whether every online device reads the round's model in this step.

        Default: no; then only the selected devices get the model pushed.
        """
        return False

    def refused(self, round_index: int, device: str) -> None:  # noqa: B027 - optional hook
        """``device`` refused the sum of the round's mean (default: nothing)."""

    def extend_deadlines(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """The broker was away ``seconds``: give open windows that time back."""

    def on_update(  # noqa: B027 - optional hook
        self, round_index: int, device: str, message: ModelUpdate
    ) -> None:
        """An update was counted in the round (default: nothing)."""


@dataclass(frozen=True)
class StepBuilder:
    """A step to build once the runtime's context exists.

    ``kind`` says what the step is before it is built (its `name`, whether
    it is `signed`, its `weighting`); the service's `StepRunner` builds it
    with the runtime's context (`BeforeTraining.later` makes one).
    """

    kind: type[BeforeTraining]
    build: Callable[[StepContext], BeforeTraining]


def weighting_of(steps: Sequence[type[BeforeTraining]]) -> Weighting | None:
    """How the steps say their rounds average (None: none says).

    Raises:
        ValueError: two steps say different things.
    """
    said = {step.weighting for step in steps if step.weighting is not None}
    if len(said) > 1:
        raise ValueError(f"before-training steps disagree on weighting: {said}")
    return said.pop() if said else None
