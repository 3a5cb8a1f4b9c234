"""The stage machine: the run's `RoundState`, adopted and persisted in one place.

Every change of stage, epoch, round or deadline goes through `set` (or
`advance`, which checks the transition), which logs a stage change, reports
it to the telemetry and persists the state, so a restart resumes where the
run was. The stage's deadline is a live phase: an outage extends it
(`extend_deadlines`, `ursa.coordinator.broker_outage`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping

from ursa.coordinator.round_state import RoundState, Stage, advance
from ursa.coordinator.store_slot import StoreSlot
from ursa.coordinator.telemetry import Telemetry

__all__ = ["MAX_STEPS", "STATE_KEY", "StageFunctions", "StageMachine"]

logger = logging.getLogger("ursa.coordinator")

STATE_KEY = "state"
"""Store meta key: the `RoundState` as JSON."""

MAX_STEPS = 16
"""Stage functions run per `settle` at most (a stage that keeps changing)."""

StageFunctions = Mapping[Stage, Callable[[float], None]]
"""What runs in each stage (the key epoch's, the round cycle's)."""


class StageMachine:
    """The current `RoundState` (module docstring).

    Args:
        telemetry: Told of every stage change.
        store: The runtime's store (every new state is written there).
    """

    def __init__(self, telemetry: Telemetry, store: StoreSlot) -> None:
        self._telemetry = telemetry
        self._state = RoundState()
        self._store = store

    @property
    def state(self) -> RoundState:
        """The current stage, epoch, round and deadline."""
        return self._state

    def resume(self, state: RoundState) -> None:
        """Resume at a restored ``state`` (already in the store: not written)."""
        self._state = state

    def set(self, state: RoundState) -> None:
        """Adopt and persist a new `RoundState` (callers checked the transition)."""
        if state.stage != self._state.stage:
            logger.info(
                "stage %s -> %s (epoch %d, round %d)",
                self._state.stage,
                state.stage,
                state.epoch,
                state.round,
            )
            self._telemetry.stage_changed(str(state.stage), state.round)
        self._state = state
        self._store.store.set_meta(STATE_KEY, json.dumps(state.to_json()))

    def advance(self, stage: Stage, now: float, deadline_s: float | None) -> None:
        """Move to `stage` with a deadline `deadline_s` from `now` (None: none)."""
        deadline = None if deadline_s is None else now + deadline_s
        self.set(advance(self._state, stage, deadline_at=deadline))

    def mark_rekey(self) -> None:
        """Start a new key epoch before the next round (the agent is lost)."""
        self.set(dataclasses.replace(self._state, rekey=True))

    def deadline_passed(self, now: float) -> bool:
        """Whether the current stage's deadline, if any, has come."""
        deadline = self._state.deadline_at
        return deadline is not None and now >= deadline

    def extend_deadlines(self, seconds: float) -> None:
        """Move the open stage's deadline, if it has one, ``seconds`` later."""
        deadline = self._state.deadline_at
        if deadline is None:
            return
        logger.info("stage deadline extended by the outage's %.0f s", seconds)
        self.set(dataclasses.replace(self._state, deadline_at=deadline + seconds))

    def settle(self, functions: StageFunctions, now: float) -> None:
        """Run the current stage's function until the state stops changing."""
        for _ in range(MAX_STEPS):
            before = self._state
            functions[before.stage](now)
            if self._state == before:
                return
