"""Dubhe's DISTRIBUTIONS step on its own: assignments out, distributions in."""

from __future__ import annotations

import pytest

from ursa.coordinator.methods.dubhe.agent_step import AgentStep
from ursa.coordinator.methods.dubhe.distribution_step import DistributionStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.protocol.messages import EncryptedDistribution, ErrorCode, TryAssignment
from ursa.protocol.router import RejectedError

from .test_selection import CLASSES, FED, FakeContext, distribution, request

TRIES = (("d0", "d1"), ("d1", "d2"))


def _asked(ctx: FakeContext) -> tuple[DistributionStep, RoundProgress]:
    agent = AgentStep(ctx, agent_s=10, cap=None)
    step = DistributionStep(ctx, num_classes=CLASSES, distributions_s=10, agent=agent)
    work = RoundProgress(1, 1, DubheStep.VOLUNTEERING, 0.0, tentative=TRIES, k=2)
    step.ask(work, now=0.0)
    return step, work


def _sent(device: str, blob: bytes) -> EncryptedDistribution:
    return EncryptedDistribution(
        federation=FED, round=1, sender=device, distribution=blob
    )


def test_every_member_hears_its_tries_and_the_agent_gets_the_complete_ones(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step, work = _asked(ctx)

    assignments = {
        d: m.try_indices for m, d in ctx.sent if isinstance(m, TryAssignment)
    }
    assert assignments == {"d0": (0,), "d1": (0, 1), "d2": (1,)}
    for device in ("d0", "d1", "d2"):
        step.on_distribution(
            work, _sent(device, distribution(step_keys[0], device, [1.0, 0, 0, 0]))
        )
    assert set(DubheRecords(empty_store).round(1).distributions) == {"d0", "d1", "d2"}

    assert step.tick(work, request(ctx, 1.0)) is None  # all delivered: to the agent
    assert work.step is DubheStep.AGENT and work.candidates == (0, 1)


def test_a_malformed_distribution_drops_its_sender_from_the_tries(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step, work = _asked(ctx)

    with pytest.raises(RejectedError) as refused:
        step.on_distribution(work, _sent("d2", b"not a ciphertext"))
    assert refused.value.code is ErrorCode.BAD_CIPHERTEXT
    assert work.dropped == {"d2"} and work.tries() == (("d0", "d1"), ("d1",))
    assert DubheRecords(empty_store).round(1).distributions == {}
