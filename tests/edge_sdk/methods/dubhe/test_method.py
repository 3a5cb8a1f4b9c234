"""Dubhe's device steps on a fake context: draws, distributions, the agent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ursa.crypto.paillier import (
    EncryptedVector,
    decrypt_real_sum,
    encrypt_reals,
    encrypted_vector_from,
    sum_encrypted,
)
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.edge_sdk.methods.dubhe.draws import participation_probability
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.dubhe.tries import best_try
from ursa.edge_sdk.registration import DISTRIBUTION_CODEC
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    AgentAnswer,
    EncryptedDistribution,
    RoundAnnounce,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.router import Dispatch, Router

FED, K, TRIES = "fed", 2, 3
REGISTRY = np.array([3, 1, 0, 0], dtype=np.int64)


def attached(ctx: Any) -> tuple[Dubhe, Router]:
    router, dubhe = Router("d0"), Dubhe(ctx)
    dubhe.register(router)
    return dubhe, router


def announce(round_index: int = 5) -> RoundAnnounce:
    return RoundAnnounce(
        federation=FED, round=round_index, sender="coordinator", epoch=3, k=K,
        tries=TRIES, deadline_s=10,
    )  # fmt: skip


def test_an_announce_waits_for_the_registry_then_volunteers_once_per_round(
    new_context: Any,
) -> None:
    ctx = new_context()
    _, router = attached(ctx)
    assert router.dispatch(announce()) is Dispatch.PARKED

    ctx.the_roster = Roster(3, 1, REGISTRY)
    router.retry_parked(lambda message, exc: None)
    (first,) = ctx.sent
    assert isinstance(first, Volunteer) and len(first.draws) == TRIES
    assert ctx.stats.answered_rounds == [5]

    again = new_context()  # a restarted device: the same draws from its store
    again.the_roster = Roster(3, 1, REGISTRY)
    again.rng = np.random.default_rng(99)
    _, router_again = attached(again)
    router_again.dispatch(announce())
    (second,) = again.sent
    assert isinstance(second, Volunteer)
    assert (second.draws, second.message_id) == (first.draws, first.message_id)


def test_a_device_that_drew_no_in_every_try_stays_silent(new_context: Any) -> None:
    ctx = new_context()
    ctx.the_roster = Roster(3, 1, REGISTRY)
    ctx.store.save_draws(3, 5, (False,) * TRIES)  # its coins for round 5: all no
    _, router = attached(ctx)

    router.dispatch(announce())

    assert ctx.sent == []  # silence means no: the coordinator never hears it
    assert ctx.stats.answered_rounds == [5]


def test_under_explicit_replies_a_device_says_no_too(new_context: Any) -> None:
    ctx = new_context()
    ctx.the_roster = Roster(3, 1, REGISTRY)
    ctx.store.save_draws(3, 5, (False,) * TRIES)
    _, router = attached(ctx)

    router.dispatch(announce().model_copy(update={"explicit_replies": True}))

    (answer,) = ctx.sent  # the coordinator closes the window on the last one
    assert isinstance(answer, Volunteer) and answer.draws == (False,) * TRIES
    # the id of its answer in any round: a re-sent one is a duplicate
    assert answer.message_id == derived_id(ctx.device_id, "volunteer", 3, 5)


def test_the_draws_follow_eq_6(new_context: Any) -> None:
    probability = participation_probability(REGISTRY, 1, K)
    volunteered = 0
    for round_index in range(1, 401):
        ctx = new_context()
        ctx.the_roster = Roster(3, 1, REGISTRY)
        ctx.rng = np.random.default_rng(round_index)
        _, router = attached(ctx)
        router.dispatch(announce(round_index))
        (message,) = ctx.sent
        assert isinstance(message, Volunteer)
        volunteered += sum(message.draws)
    rate = volunteered / (400 * TRIES)
    assert abs(rate - probability) < 0.06, (rate, probability)


def test_a_device_outside_the_registry_does_not_volunteer(new_context: Any) -> None:
    ctx = new_context()
    ctx.the_roster = Roster(3, 2, REGISTRY)  # slot 2 holds nobody
    _, router = attached(ctx)
    router.dispatch(announce())
    assert ctx.sent == []


def _the_agent(new_context: Any) -> tuple[Any, Router]:
    """A device (d0, the epoch's agent) in the registry, the round announced."""
    ctx = new_context()
    ctx.the_roster = Roster(3, 0, REGISTRY)
    _, router = attached(ctx)
    router.dispatch(announce())
    return ctx, router


def test_the_distribution_is_the_label_histogram_after_a_bytes_trip(
    new_context: Any, keys: Any
) -> None:
    ctx, router = _the_agent(new_context)
    assign = TryAssignment(
        federation=FED, round=5, sender="coordinator", try_indices=(0, 2)
    )
    router.dispatch(assign)
    report = ctx.sent[-1]
    assert isinstance(report, EncryptedDistribution)
    vector = encrypted_vector_from(report.distribution, keys[0], num_parties=1)
    values = decrypt_real_sum(keys[1], DISTRIBUTION_CODEC, K, vector)
    np.testing.assert_allclose(values, [0.75, 0.25, 0.0, 0.0], atol=1e-6)


def test_the_agent_answers_the_plaintext_best_try_and_others_refuse(
    new_context: Any, keys: Any
) -> None:
    public, secret = keys
    tries = [
        [np.array([1.0, 0, 0, 0]), np.array([0.0, 1, 0, 0])],  # balanced-ish
        [np.array([1.0, 0, 0, 0]), np.array([1.0, 0, 0, 0])],  # one class
    ]
    sums = [
        sum_encrypted(
            public, [encrypt_reals(public, DISTRIBUTION_CODEC, K, d) for d in t]
        ).to_bytes(public)
        for t in tries
    ]
    message = TrySums(
        federation=FED, round=5, sender="coordinator", sums=tuple(sums),
        member_counts=(2, 2),
    )  # fmt: skip
    ctx, router = _the_agent(new_context)
    router.dispatch(message)
    answer = ctx.sent[-1]
    expected = best_try(np.stack([sum(t) for t in tries]), np.array([2, 2]))
    assert isinstance(answer, AgentAnswer) and answer.best_try == expected == 0

    other = new_context()
    other.epoch = other.epoch.model_copy(update={"agent": "d9"})
    other.epoch_keys = EpochKeys(other.epoch, public, secret, None)
    other.the_roster = Roster(3, 0, REGISTRY)
    _, other_router = attached(other)
    other_router.dispatch(announce())
    with pytest.raises(ValueError, match="not the agent"):
        other_router.dispatch(message)


def _summed(public: Any, *distributions: list[float]) -> bytes:
    """The encrypted sum of `distributions`, as a try's sum goes to the agent."""
    vectors = [encrypt_reals(public, DISTRIBUTION_CODEC, K, d) for d in distributions]
    return sum_encrypted(public, vectors).to_bytes(public)


def test_the_agent_names_a_bad_sum_and_answers_the_best_of_the_others(
    new_context: Any, keys: Any
) -> None:
    public, _ = keys
    good = _summed(public, [1.0, 0, 0, 0], [0.0, 1, 0, 0])
    overflow = EncryptedVector(
        public.fingerprint(), 4, 2, (public.raw_encrypt(public.n - 1),)
    ).to_bytes(public)  # -1: every slot's bits set
    # in range, but 3 of one class for 2 members
    shifted = _summed(public, [1.0, 0, 0, 0], [1.0, 1.0, -1.0, 1.0])
    wrong_parties = encrypt_reals(
        public, DISTRIBUTION_CODEC, K, np.array([1.0, 0, 0, 0])
    ).to_bytes(public)
    message = TrySums(
        federation=FED, round=5, sender="coordinator",
        sums=(overflow, good, shifted, wrong_parties, b"junk"),
        member_counts=(2, 2, 2, 2, 2),
    )  # fmt: skip
    ctx, router = _the_agent(new_context)

    router.dispatch(message)

    answer = ctx.sent[-1]
    assert isinstance(answer, AgentAnswer)
    assert answer.best_try == 1 and answer.bad_tries == (0, 2, 3, 4)
    again = message.model_copy(
        update={"sums": (overflow,), "member_counts": (2,), "message_id": "resum"}
    )
    router.dispatch(again)
    every = ctx.sent[-1]
    assert isinstance(every, AgentAnswer) and every.best_try is None
    assert every.bad_tries == (0,) and every.message_id != answer.message_id
