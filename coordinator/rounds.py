"""The coordinator's state machine (stages, transitions) and its pure round steps.

One `Stage` at a time, held in a frozen `RoundState` that only
`advance` replaces (after `check_transition`)::

    ENROLMENT -> KEY_EPOCH -> REGISTRATION -> VOLUNTEERING -> DISTRIBUTIONS
                    ^  |                        ^   |  |          |
                    |  +-- agent silent: retry  |   |  +---- H=1  v
                    |                           |   |        |  AGENT
                    |                           |   v        v    |
                    +------ rekey --------- TRAINING <------------+
                                             |  ^
                                             v  |
                                   DONE    SELECTING

VOLUNTEERING, DISTRIBUTIONS and AGENT are Dubhe's; a federation whose
selection method is another (`ursa.coordinator.selection_method`) goes from
REGISTRATION or TRAINING to SELECTING instead, and from there to TRAINING.

With a balancing method (FLICKER), ENROLMENT -> BALANCING -> KEY_EPOCH: the
method runs once, before the first key epoch's registration.

The functions below turn what the coordinator saw (device ids, draws, who
delivered) into tentative sets and selections; they take device ids and the
coordinator's generator and touch no network, clock or database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from typing_extensions import TypedDict, Unpack

from ursa._compat import StrEnum
from ursa.coordinator.selection import finalize_selections

__all__ = [
    "TRANSITIONS",
    "RoundChanges",
    "RoundState",
    "Stage",
    "TransitionError",
    "advance",
    "check_transition",
    "complete_tries",
    "fallback_selection",
    "make_tries",
]


class Stage(StrEnum):
    """Where the coordinator is in the protocol."""

    ENROLMENT = "enrolment"
    BALANCING = "balancing"
    """A balancing method (FLICKER) runs once before the first key epoch."""
    KEY_EPOCH = "key_epoch"
    REGISTRATION = "registration"
    VOLUNTEERING = "volunteering"
    DISTRIBUTIONS = "distributions"
    AGENT = "agent"
    SELECTING = "selecting"
    TRAINING = "training"
    DONE = "done"


TRANSITIONS: Mapping[Stage, frozenset[Stage]] = {
    Stage.ENROLMENT: frozenset({Stage.BALANCING, Stage.KEY_EPOCH, Stage.DONE}),
    Stage.BALANCING: frozenset({Stage.KEY_EPOCH}),
    Stage.KEY_EPOCH: frozenset({Stage.KEY_EPOCH, Stage.REGISTRATION}),
    Stage.REGISTRATION: frozenset(
        {Stage.KEY_EPOCH, Stage.VOLUNTEERING, Stage.SELECTING, Stage.DONE}
    ),
    Stage.VOLUNTEERING: frozenset(
        {Stage.VOLUNTEERING, Stage.DISTRIBUTIONS, Stage.TRAINING, Stage.KEY_EPOCH}
    ),
    Stage.DISTRIBUTIONS: frozenset({Stage.AGENT, Stage.TRAINING}),
    Stage.AGENT: frozenset({Stage.TRAINING}),
    Stage.SELECTING: frozenset({Stage.SELECTING, Stage.TRAINING}),
    Stage.TRAINING: frozenset(
        {Stage.VOLUNTEERING, Stage.SELECTING, Stage.KEY_EPOCH, Stage.DONE}
    ),
    Stage.DONE: frozenset(),
}
"""Allowed stage changes (a stage may re-enter itself where it retries)."""


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
        return cls(
            stage=Stage(str(data["stage"])),
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


def make_tries(
    volunteers: Mapping[str, Sequence[bool]],
    k: int,
    tries: int,
    rng: np.random.Generator,
) -> tuple[tuple[str, ...], ...]:
    """The H tentative sets of exactly K from the responders' per-try draws.

    Per try: trim surplus volunteers uniformly, or top up uniformly from the
    responders who did not volunteer in that try (`finalize_selections`).
    Responders are sorted by id first, so a seeded generator is reproducible.

    Raises:
        SelectionError: fewer than K responders.
    """
    devices = sorted(volunteers)
    draws = np.array([list(volunteers[d])[:tries] for d in devices], dtype=bool)
    chosen = finalize_selections(draws.T.reshape(tries, len(devices)), k, rng)
    return tuple(tuple(devices[i] for i in row) for row in chosen)


def complete_tries(
    tries: Sequence[Sequence[str]], delivered: set[str] | frozenset[str]
) -> tuple[int, ...]:
    """Indices of the tries all of whose members delivered their distribution."""
    return tuple(h for h, members in enumerate(tries) if set(members) <= delivered)


def fallback_selection(
    tries: Sequence[Sequence[str]],
    preferred: Sequence[int],
    alive: Sequence[str],
    k: int,
    rng: np.random.Generator,
) -> tuple[int | None, tuple[str, ...]]:
    """A selection when the agent cannot answer: the first usable try, or a repair.

    Returns ``(h, members)`` of the first try in `preferred` (complete tries),
    else ``(None, set)``: try 0's members that are in `alive`, topped up
    uniformly from the rest of `alive` to K (fewer only if `alive` is short).
    """
    if preferred:
        return preferred[0], tuple(tries[preferred[0]])
    alive_set = set(alive)
    kept = [d for d in tries[0] if d in alive_set] if tries else []
    rest = sorted(alive_set - set(kept))
    need = max(0, min(k - len(kept), len(rest)))
    extra = [rest[i] for i in rng.permutation(len(rest))[:need]] if need else []
    return None, tuple(sorted(kept + extra))
