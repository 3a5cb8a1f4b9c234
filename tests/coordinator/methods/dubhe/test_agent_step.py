"""Dubhe's AGENT step on its own: the sums it sends, the answers it takes."""

from __future__ import annotations

import pytest

from ursa.coordinator.methods.dubhe.agent_step import AgentStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    encrypted_vector_from,
)
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import AgentAnswer, ErrorCode, TrySums
from ursa.protocol.router import RejectedError

from .test_selection import AGENT, FED, FakeContext, distribution, request

TRIES = (("d0", "d1"), ("d2", "d3"))


def _signed(best_try: int) -> AgentAnswer:
    answer = AgentAnswer(federation=FED, round=1, sender="d4", best_try=best_try)
    return answer.model_copy(update={"signature": AGENT.sign(signing_bytes(answer))})


def _delivered(public: PaillierPublicKey) -> RoundProgress:
    work = RoundProgress(1, 1, DubheStep.DISTRIBUTIONS, 0.0, tentative=TRIES, k=2)
    for device in ("d0", "d1", "d2", "d3"):
        blob = distribution(public, device, [1.0, 0, 0, 0])
        work.distributions[device] = encrypted_vector_from(blob, public, num_parties=1)
    return work


def _asked(
    store: CoordinatorStore,
    public: PaillierPublicKey,
    candidates: tuple[int, ...],
    *,
    now: float,
) -> tuple[FakeContext, AgentStep, RoundProgress]:
    """Every member delivered; the step asked the agent about ``candidates``."""
    ctx = FakeContext(store, public)
    step, work = AgentStep(ctx, agent_s=10, cap=None), _delivered(public)
    step.ask(work, candidates, now=now)
    return ctx, step, work


def test_asking_keeps_the_candidates_and_sends_one_sum_per_try_to_the_agent(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx, _, work = _asked(empty_store, step_keys[0], (0, 1), now=5.0)

    assert (work.step, work.deadline_at) == (DubheStep.AGENT, 15.0)
    assert DubheRecords(empty_store).round(1).candidates == (0, 1)
    [(sums, agent)] = [(m, d) for m, d in ctx.sent if isinstance(m, TrySums)]
    assert agent == "d4" and sums.member_counts == (2, 2) and len(sums.sums) == 2


def test_the_agents_choice_is_taken_and_another_senders_refused(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx, step, work = _asked(empty_store, step_keys[0], (0, 1), now=0.0)

    forged = AgentAnswer(federation=FED, round=1, sender="d0", best_try=0)
    with pytest.raises(RejectedError) as refused:
        step.on_answer(work, forged)
    assert refused.value.code is ErrorCode.UNAUTHORISED
    step.on_answer(work, _signed(1))

    selection = step.tick(work, request(ctx, 1.0))
    assert selection is not None and selection.selected == TRIES[1]


def test_a_silent_agent_past_the_window_gives_the_first_candidate_and_a_rekey(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx, step, work = _asked(empty_store, step_keys[0], (1,), now=0.0)

    assert step.tick(work, request(ctx, 9.0)) is None
    selection = step.tick(work, request(ctx, 10.0))
    assert selection is not None and selection.rekey
    assert (selection.selected, selection.try_index) == (TRIES[1], 1)
