"""The coordinator's state machine: its stages and their transitions.

One `Stage` at a time, held in a frozen `RoundState` that only
`advance` replaces (after `check_transition`)::

    ENROLMENT -> [BALANCING] -> KEY_EPOCH -> REGISTRATION -> SELECTING
                                  ^  |                          ^   |
                                  |  +-- agent silent: retry    |   v
                                  +----------- rekey -------- TRAINING -> DONE

SELECTING is the federation's selection method's (Dubhe's volunteers, tries
and agent, or the random baseline: `ursa.coordinator.selection_method`); its
own steps and windows are the method's. TRAINING is the training method's.
With a balancing method (FLICKER), ENROLMENT -> BALANCING -> KEY_EPOCH: the
method runs once, before the first key epoch's registration. A new key epoch
is only ever started with ``min_devices`` online: short of them, the
coordinator goes back to ENROLMENT and waits for the fleet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from typing_extensions import TypedDict, Unpack

from ursa._compat import StrEnum

__all__ = [
    "TRANSITIONS",
    "RoundChanges",
    "RoundState",
    "Stage",
    "TransitionError",
    "advance",
    "check_transition",
]


class Stage(StrEnum):
    """Where the coordinator is in the protocol."""

    ENROLMENT = "enrolment"
    BALANCING = "balancing"
    """A balancing method (FLICKER) runs once before the first key epoch."""
    KEY_EPOCH = "key_epoch"
    REGISTRATION = "registration"
    SELECTING = "selecting"
    """The selection method's steps (Dubhe: volunteers, distributions, agent)."""
    TRAINING = "training"
    DONE = "done"


TRANSITIONS: Mapping[Stage, frozenset[Stage]] = {
    Stage.ENROLMENT: frozenset({Stage.BALANCING, Stage.KEY_EPOCH, Stage.DONE}),
    Stage.BALANCING: frozenset({Stage.KEY_EPOCH, Stage.ENROLMENT}),
    Stage.KEY_EPOCH: frozenset({Stage.KEY_EPOCH, Stage.REGISTRATION, Stage.ENROLMENT}),
    Stage.REGISTRATION: frozenset(
        {Stage.KEY_EPOCH, Stage.SELECTING, Stage.DONE, Stage.ENROLMENT}
    ),
    Stage.SELECTING: frozenset(
        {Stage.SELECTING, Stage.TRAINING, Stage.KEY_EPOCH, Stage.ENROLMENT}
    ),
    Stage.TRAINING: frozenset(
        {Stage.SELECTING, Stage.KEY_EPOCH, Stage.DONE, Stage.ENROLMENT}
    ),
    Stage.DONE: frozenset(),
}
"""Allowed stage changes (a stage may re-enter itself where it retries)."""


_LEGACY_STAGES = {
    "volunteering": "selecting",
    "distributions": "selecting",
    "agent": "selecting",
}
"""Dubhe's steps were runtime stages before they moved into its method; a
state dir saved then resumes in SELECTING (Dubhe reads its step from the store)."""


class TransitionError(RuntimeError):
    """A stage change the state machine does not allow (a bug, not bad input)."""


@dataclass(frozen=True)
class RoundState:
    """The coordinator's position: stage, key epoch, round and the stage deadline.

    Attributes:
        stage: The current stage.
        epoch: Current key epoch (0 before the first).
        round: Current round (0 before the first).
        deadline_at: Clock time at which the stage closes (None: no deadline).
        rekey: Start a new key epoch before the next round (agent lost).
    """

    stage: Stage = Stage.ENROLMENT
    epoch: int = 0
    round: int = 0
    deadline_at: float | None = None
    rekey: bool = False

    def to_json(self) -> dict[str, object]:
        """A JSON-able dict (persisted in the store's meta table)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RoundState:
        """Inverse of `to_json`."""
        deadline = data.get("deadline_at")
        stage = str(data["stage"])
        return cls(
            stage=Stage(_LEGACY_STAGES.get(stage, stage)),
            epoch=int(str(data["epoch"])),
            round=int(str(data["round"])),
            deadline_at=None if deadline is None else float(str(deadline)),
            rekey=bool(data.get("rekey", False)),
        )


def check_transition(current: Stage, new: Stage) -> None:
    """Raise `TransitionError` unless `current -> new` is in `TRANSITIONS`."""
    if new not in TRANSITIONS[current]:
        raise TransitionError(f"no transition from {current} to {new}")


class RoundChanges(TypedDict, total=False):
    """The `RoundState` fields besides ``stage`` that `advance` may set."""

    epoch: int
    round: int
    deadline_at: float | None
    rekey: bool


def advance(
    state: RoundState, stage: Stage, **changes: Unpack[RoundChanges]
) -> RoundState:
    """A checked copy of `state` in `stage` with `changes` applied."""
    check_transition(state.stage, stage)
    return dataclasses.replace(state, stage=stage, **changes)
