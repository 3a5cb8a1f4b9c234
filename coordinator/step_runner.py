"""The runtime's BEFORE_TRAINING phase: the methods' steps, run in order.

After the signed selection the training plugin publishes the round's model
(`RoundPlugin.on_selected`); the round cycle then opens the steps here
(`open`, with what the plugin says the round trains), one at a time, each
until it is done (its messages come through `dispatch`, its deadlines at
every tick), and tells the plugin to train once the last is
(`RoundPlugin.on_steps_done`). The plugin reads what the steps change about
its training through `ursa.coordinator.plugin.TrainingSteps` (the weighting,
whether every device needs the model, a figure still on its way, the
round's metrics); the round cycle closes the steps when the round completes.

One runner per coordinator, built with the service's parts, so the steps
are live phases the runtime knows: a broker outage extends their windows in
its one loop (`ursa.coordinator.broker_outage`). Each step keeps its own phase
record in the store, so `open` for the same round after a restart resumes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.before_training import (
    BeforeTraining,
    StepBuilder,
    StepContext,
    StepPhase,
    weighting_of,
)
from ursa.coordinator.plugin import RoundInfo
from ursa.protocol.messages import COORDINATOR, BaseMessage, ModelUpdate
from ursa.protocol.router import Dispatch, Router

__all__ = ["StepRunner"]

logger = logging.getLogger("ursa.coordinator")


class StepRunner:
    """The methods' before-training steps of each round (module docstring).

    Args:
        ctx: The runtime's context the steps are built with.
        steps: The composed steps, in the order they run.

    Raises:
        ValueError: two steps own one message kind or set different weightings.
    """

    def __init__(self, ctx: StepContext, steps: Sequence[StepBuilder]) -> None:
        kinds = [builder.kind for builder in steps]
        self._weighting = weighting_of(kinds)
        self._methods = tuple(dict.fromkeys(k.name for k in kinds if k.signed))
        self._steps: tuple[BeforeTraining, ...] = tuple(b.build(ctx) for b in steps)
        self._router = Router(COORDINATOR)
        for step in self._steps:
            step.register(self._router)
        self._info: RoundInfo | None = None
        """The round the steps were last opened for."""
        self._running = 0
        """The step that runs (``len(steps)``: all done)."""
        self._phases: dict[str, StepPhase] = {}
        """The round's open phases by step name (their figures are in the metrics)."""

    @property
    def steps(self) -> tuple[BeforeTraining, ...]:
        """The built steps, in order."""
        return self._steps

    # --- TrainingSteps ----------------------------------------------------------

    @property
    def weighting(self) -> Weighting | None:
        """How the rounds average updates, if a step says (CLIMB's)."""
        return self._weighting

    def methods(self) -> tuple[str, ...]:
        """The signed methods the steps name."""
        return self._methods

    def fleet_needs_model(self, round_index: int) -> bool:
        """Whether a step of the round has every online device read its model."""
        return any(step.fleet_needs_model(round_index) for step in self._steps)

    def awaits(self, round_index: int, now: float) -> bool:
        """Whether a step's own figure of the round is still on its way."""
        return any(step.awaits(round_index, now) for step in self._steps)

    def on_update(self, round_index: int, device: str, message: ModelUpdate) -> None:
        """Tell every step of an update counted in the round."""
        for step in self._steps:
            step.on_update(round_index, device, message)

    def answered(self, round_index: int) -> Mapping[str, int]:
        """Devices that answered each step of the round (by step name)."""
        if not self.has_opened(round_index):
            return {}
        return {name: len(phase.answered) for name, phase in self._phases.items()}

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """What the steps learned in the round."""
        out: dict[str, Any] = {}
        for step in self._steps:
            out.update(step.metrics(round_index))
        return out

    # --- the phase ----------------------------------------------------------------

    def open(self, info: RoundInfo, now: float) -> None:
        """Open the round's steps in order, until one waits (resumed after a restart).

        The same round again (a resumed service): what the steps opened so
        far is sent again instead.
        """
        if self.has_opened(info.round):
            self.republish(info.round)
            return
        if self._info is not None:  # a round the training deadline ended
            self.close(self._info.round)
        self._info, self._phases = info, {}
        self._open_from(info, 0, now)

    def republish(self, round_index: int) -> None:
        """Send again what the round's opened steps wait on (a resumed service)."""
        if self.has_opened(round_index):
            for step in self._steps[: self._running + 1]:
                step.republish(round_index)

    def is_done(self, round_index: int) -> bool:
        """Whether the round's steps are all done (a round never opened: yes)."""
        return not self.has_opened(round_index) or self._running >= len(self._steps)

    def dispatch(self, message: BaseMessage) -> bool:
        """A step's own message (False: of no step's kind).

        The next step opens at the tick that follows (`on_tick`).

        Raises:
            RejectedError: the step refuses it.
        """
        return self._router.dispatch(message) is not Dispatch.UNHANDLED

    def on_tick(self, round_index: int, now: float) -> bool:
        """Tick the running step, open the next once it is done; whether all are."""
        info = self._info
        if info is None or self.is_done(round_index):
            return True
        step = self._steps[self._running]
        step.on_tick(round_index, now)
        if step.is_done(round_index):
            self._open_from(info, self._running + 1, now)
        return self.is_done(round_index)

    def extend_deadlines(self, seconds: float) -> None:
        """The broker was away ``seconds``: every step's open windows wait longer."""
        if seconds <= 0:
            return
        for step in self._steps:
            step.extend_deadlines(seconds)

    def refused(self, round_index: int, device: str) -> None:
        """``device`` refused the sum of a mean of the round (a result may not come)."""
        for step in self._steps:
            step.refused(round_index, device)

    def close(self, round_index: int) -> None:
        """The round is over: every step forgets it and drops its record."""
        for step in self._steps:
            step.close(round_index)

    def has_opened(self, round_index: int) -> bool:
        """Whether the steps were opened for the round (in this process)."""
        return self._info is not None and self._info.round == round_index

    def _open_from(self, info: RoundInfo, first: int, now: float) -> None:
        """Open the steps from ``first`` on, until one waits."""
        for index in range(first, len(self._steps)):
            step = self._steps[index]
            self._running = index
            phase = step.open(info, now)
            if phase is not None:
                self._phases[step.name] = phase
            if not step.is_done(info.round):
                return
        self._running = len(self._steps)
