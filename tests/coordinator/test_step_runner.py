"""The runtime's before-training steps: in order, each until done, one outage loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import pytest

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.before_training import (
    BeforeTraining,
    RoundInfo,
    StepBuilder,
    StepContext,
    StepPhase,
)
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.plugin import CoordinatorView
from ursa.coordinator.step_runner import StepRunner
from ursa.protocol.router import Router

INFO = RoundInfo(3, "classifier", 2, ("d1", "d2"))
CTX = StepContext("f", cast(CoordinatorView, object()), lambda m, d: None, lambda: 0.0)


@dataclass
class Phase:
    key: str
    status: PhaseStatus = PhaseStatus.OPEN
    answered: set[str] = field(default_factory=set)


class Toy(BeforeTraining):
    """A step done once ``finish`` is called (or at once with ``done``)."""

    name: ClassVar[str] = "toy"

    def __init__(self, ctx: StepContext, name: str, *, done: bool = False) -> None:
        super().__init__(ctx)
        self.own, self.done = name, done
        self.log: list[str] = []
        self.extended = 0.0
        self.phase = Phase(name)

    def finish(self, *devices: str) -> None:
        self.done = True
        self.phase.answered.update(devices)

    def register(self, router: Router) -> None:
        """No kinds of its own."""

    def open(self, info: RoundInfo, now: float) -> StepPhase | None:
        self.log.append(f"open {info.round}")
        return self.phase

    def on_tick(self, round_index: int, now: float) -> None:
        self.log.append(f"tick {round_index}")

    def is_done(self, round_index: int) -> bool:
        return self.done

    def republish(self, round_index: int) -> None:
        self.log.append(f"republish {round_index}")

    def close(self, round_index: int) -> None:
        self.log.append(f"close {round_index}")

    def extend_deadlines(self, seconds: float) -> None:
        self.extended += seconds

    def metrics(self, round_index: int) -> dict[str, Any]:
        return {self.own: len(self.phase.answered)}


class Named(Toy):
    name: ClassVar[str] = "named"
    weighting: ClassVar[Weighting | None] = Weighting.CLIMB


def runner(*made: Toy) -> StepRunner:
    """A runner over steps already made (each builder hands its own back)."""
    return StepRunner(CTX, [StepBuilder(type(s), lambda _c, s=s: s) for s in made])


def toys(ctx: StepContext = CTX) -> tuple[Toy, Named]:
    return Toy(ctx, "first"), Named(ctx, "second")


def test_the_steps_open_in_order_each_once_the_one_before_is_done() -> None:
    first, second = toys()
    steps = runner(first, second)
    assert steps.is_done(INFO.round)  # a round never opened waits on nothing

    steps.open(INFO, 0.0)
    assert first.log == ["open 3"] and second.log == []
    assert not steps.on_tick(INFO.round, 1.0) and second.log == []
    first.finish("d1", "d2")
    assert not steps.on_tick(INFO.round, 2.0)  # the second opened and waits
    assert second.log == ["open 3"]
    second.finish("d1")
    assert steps.on_tick(INFO.round, 3.0) and steps.is_done(INFO.round)
    assert steps.answered(INFO.round) == {"toy": 2, "named": 1}
    assert steps.metrics(INFO.round) == {"first": 2, "second": 1}
    assert steps.answered(4) == {}


def test_done_steps_fall_through_and_a_resumed_round_republishes() -> None:
    first, second = toys()
    first.done = second.done = True
    steps = runner(first, second)

    steps.open(INFO, 0.0)

    assert steps.is_done(INFO.round) and second.log == ["open 3"]
    steps.republish(INFO.round)
    assert first.log[-1] == second.log[-1] == "republish 3"
    steps.republish(4)  # not opened: nothing
    assert first.log[-1] == "republish 3"


def test_an_outage_extends_every_step_and_the_next_round_closes_a_stale_one() -> None:
    first, second = toys()
    steps = runner(first, second)
    steps.open(INFO, 0.0)

    steps.extend_deadlines(30.0)
    steps.extend_deadlines(-1.0)  # nothing to give back

    assert first.extended == second.extended == 30.0
    steps.open(RoundInfo(4, "classifier", 2, ("d1",)), 50.0)  # round 3 hit its deadline
    assert "close 3" in first.log and first.log[-1] == "open 4"


def test_the_steps_say_the_weighting_and_the_signed_methods() -> None:
    steps = runner(*toys())
    assert steps.weighting is Weighting.CLIMB
    assert steps.methods() == ("toy", "named")
    assert runner().weighting is None and runner().methods() == ()


def test_steps_that_disagree_on_the_weighting_are_refused() -> None:
    class Equal(Toy):
        name: ClassVar[str] = "equal"
        weighting: ClassVar[Weighting | None] = Weighting.EQUAL

    with pytest.raises(ValueError, match="disagree on weighting"):
        runner(Named(CTX, "a"), Equal(CTX, "b"))
