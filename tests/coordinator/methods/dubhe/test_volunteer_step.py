"""Dubhe's VOLUNTEERING step on its own: which answers count, when it closes."""

from __future__ import annotations

import pytest

from ursa.coordinator.methods.dubhe.agent_step import AgentStep
from ursa.coordinator.methods.dubhe.distribution_step import DistributionStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.methods.dubhe.volunteer_step import VolunteerStep
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.protocol.messages import ErrorCode, Volunteer
from ursa.protocol.router import RejectedError

from .test_selection import CLASSES, FED, FakeContext, request


def _step(ctx: FakeContext) -> VolunteerStep:
    agent = AgentStep(ctx, agent_s=10, cap=None)
    members = DistributionStep(
        ctx, num_classes=CLASSES, distributions_s=10, agent=agent
    )
    return VolunteerStep(ctx, tries=1, volunteer_s=10, cap=None, members=members)


def _draws(device: str, *draws: bool) -> Volunteer:
    return Volunteer(federation=FED, round=1, sender=device, draws=draws)


def test_under_silence_k_yes_answers_close_the_window_with_one_try(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step = _step(ctx)
    work = RoundProgress(1, 1, DubheStep.VOLUNTEERING, 10.0, k=2)
    step.on_volunteer(work, _draws("d0", True))
    assert step.tick(work, request(ctx, 1.0)) is None  # one of K=2: open
    step.on_volunteer(work, _draws("d1", True))

    selection = step.tick(work, request(ctx, 2.0))
    assert selection is not None and set(selection.selected) == {"d0", "d1"}
    assert DubheRecords(empty_store).round(1).tries == (("d0", "d1"),)


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ((_draws("d0", False),), "silence means no"),
        ((_draws("d0", True, True),), "2 draws for 1 tries"),
        ((_draws("d9", True),), "not registered"),
    ],
)
def test_an_answer_the_round_does_not_allow_is_refused_and_not_counted(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
    answers: tuple[Volunteer, ...],
    reason: str,
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step = _step(ctx)
    work = RoundProgress(1, 1, DubheStep.VOLUNTEERING, 10.0, k=2)
    with pytest.raises(RejectedError, match=reason) as refused:
        for answer in answers:
            step.on_volunteer(work, answer)
    assert refused.value.code in (ErrorCode.MALFORMED, ErrorCode.UNAUTHORISED)
    assert work.volunteers == {} and work.yes == []
