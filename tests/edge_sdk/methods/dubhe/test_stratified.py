"""Dubhe's stratified draw on a fake device: one-time keys, the agent's ranks, draws."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import encrypt_vector
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.edge_sdk.methods.dubhe.draws import assign_ranks, stratified_volunteer
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.dubhe.ranks import (
    RankError,
    new_one_time_key,
    one_time_identity,
    one_time_public,
    open_rank_plaintext,
    rank_context,
    rank_plaintext,
    shared_seed,
    slot_of,
)
from ursa.edge_sdk.registration import registry_vector
from ursa.protocol.codebook import Codebook
from ursa.protocol.messages import (
    DeviceKeys,
    RankEntry,
    RankRequest,
    RoundAnnounce,
    SealedRank,
    SealedRanks,
    Volunteer,
)
from ursa.protocol.router import Dispatch, Router

FED, EPOCH = "fed", 3
CODEBOOK = Codebook(4, (1, 4))  # 5 slots
REGISTRY = np.array([3, 1, 0, 0, 2], dtype=np.int64)


def keys_of(identity: DeviceIdentity) -> DeviceKeys:
    public = identity.public()
    return DeviceKeys(
        device_id=public.device_id,
        x25519_public=public.x25519_public,
        ed25519_public=public.ed25519_public,
    )


def context(new_context: Any, keys: Any, agent: DeviceIdentity | None = None) -> Any:
    ctx = new_context()
    agent_identity = agent or ctx.identity
    ctx.epoch = ctx.epoch.model_copy(
        update={
            "agent": agent_identity.device_id,
            "agent_keys": keys_of(agent_identity),
            "groups": CODEBOOK.groups,
            "max_parties": 10,
            "key_bits": 512,
        }
    )
    ctx.epoch_keys = EpochKeys(ctx.epoch, *keys, None)
    return ctx


def attached(ctx: Any) -> tuple[Dubhe, Router]:
    router, dubhe = Router("d0"), Dubhe(ctx, "stratified")
    dubhe.register(router)
    return dubhe, router


def page(
    keys: Any, slots: list[int], one_time: list[bytes], number: int, pages: int
) -> RankRequest:
    public, _ = keys
    layout = PackingLayout(1, 10, 512)
    entries = []
    for slot, key in zip(slots, one_time, strict=True):
        registry = (
            registry_vector(slot, CODEBOOK)
            if slot >= 0
            else np.array([1, 1, 0, 0, 0])  # not one-hot
        )
        vector = encrypt_vector(public, layout, registry.tolist())
        entries.append(
            RankEntry(
                registry=vector.to_bytes(public),
                rank_key=one_time_identity(key).public().x25519_public,
            )
        )
    return RankRequest(
        federation=FED, round=1, sender="coordinator", epoch=EPOCH, page=number,
        pages=pages, entries=tuple(entries),
    )  # fmt: skip


def opened(ctx: Any, answer: SealedRanks, one_time: list[bytes]) -> dict[int, tuple]:
    return {
        box.entry: open_rank_plaintext(
            open_sealed(
                one_time_identity(one_time[box.entry]),
                ctx.identity.public(),
                rank_context(FED, EPOCH),
                box.box,
            )
        )
        for box in answer.boxes
    }


def test_the_agent_ranks_pages_in_order_and_a_page_again_alike(
    new_context: Any, keys: Any
) -> None:
    ctx = context(new_context, keys)
    _, router = attached(ctx)
    slots = [4, 0, 4, 1, 0, 4, 0]
    one_time = [new_one_time_key() for _ in slots]
    first = page(keys, slots[:4], one_time[:4], 0, 2)
    second = page(keys, slots[4:], one_time[4:], 1, 2)

    assert router.dispatch(second) is Dispatch.PARKED  # page 0 first
    router.dispatch(first)
    router.retry_parked(lambda message, exc: None)
    answers = [m for m in ctx.sent if isinstance(m, SealedRanks)]
    assert [a.page for a in answers] == [0, 1]
    got = opened(ctx, answers[0], one_time[:4])
    got.update({4 + j: v for j, v in opened(ctx, answers[1], one_time[4:]).items()})
    expected = assign_ranks(np.array(slots))
    assert got == {
        i: (s, int(r)) for i, (s, r) in enumerate(zip(slots, expected, strict=True))
    }

    router.dispatch(second.model_copy(update={"message_id": "again"}))
    again = ctx.sent[-1]
    assert isinstance(again, SealedRanks) and again.page == 1
    assert opened(ctx, again, one_time[4:]) == opened(ctx, answers[1], one_time[4:])


def test_the_agent_skips_an_entry_that_is_not_one_hot(
    new_context: Any, keys: Any
) -> None:
    ctx = context(new_context, keys)
    _, router = attached(ctx)
    one_time = [new_one_time_key() for _ in range(3)]
    router.dispatch(page(keys, [0, -1, 0], one_time, 0, 1))
    (answer,) = ctx.sent
    assert opened(ctx, answer, one_time) == {0: (0, 0), 2: (0, 1)}


def announce(round_index: int, tries: int = 3) -> RoundAnnounce:
    return RoundAnnounce(
        federation=FED, round=round_index, sender="coordinator", epoch=EPOCH, k=2,
        tries=tries, deadline_s=10,
    )  # fmt: skip


def test_a_device_opens_its_rank_forgets_its_key_and_draws_from_the_shared_seed(
    new_context: Any, keys: Any
) -> None:
    agent = DeviceIdentity.generate("d9")
    ctx = context(new_context, keys, agent)
    ctx.the_roster = Roster(EPOCH, 4, REGISTRY)
    dubhe, router = attached(ctx)
    key = dubhe.registration_key(EPOCH)
    assert key is not None and dubhe.registration_key(EPOCH) == key  # kept
    assert dubhe.rank(EPOCH) is None
    assert router.dispatch(announce(1)) is Dispatch.PARKED  # no rank yet

    box = seal(
        agent, one_time_public(key), rank_context(FED, EPOCH), rank_plaintext(4, 1)
    )
    router.dispatch(
        SealedRank(federation=FED, round=0, sender="coordinator", epoch=EPOCH, box=box)
    )
    assert dubhe.rank(EPOCH) == 1
    assert "one_time" not in ctx.store.method_state("dubhe")["rank"]
    with pytest.raises(RankError):
        dubhe.registration_key(EPOCH)  # the one-time key is gone for good
    router.retry_parked(lambda message, exc: None)

    seed = shared_seed(keys[1].secret_to_bytes(), FED, EPOCH)
    for r in range(2, 12):
        router.dispatch(announce(r))
    spoke = {m.round: m.draws for m in ctx.sent if isinstance(m, Volunteer)}
    for r in range(1, 12):
        draws = tuple(
            stratified_volunteer(REGISTRY, 4, 1, 2, seed, r, h) for h in range(3)
        )
        assert spoke.get(r) == (draws if any(draws) else None)  # silence means no
    assert spoke  # some round drew yes: the comparison is not vacuous


def test_a_rank_for_another_slot_or_from_another_sender_is_refused(
    new_context: Any, keys: Any
) -> None:
    agent = DeviceIdentity.generate("d9")
    ctx = context(new_context, keys, agent)
    ctx.the_roster = Roster(EPOCH, 4, REGISTRY)
    dubhe, router = attached(ctx)
    key = dubhe.registration_key(EPOCH)
    assert key is not None
    context_bytes = rank_context(FED, EPOCH)
    wrong_slot = seal(agent, one_time_public(key), context_bytes, rank_plaintext(0, 1))
    forged = seal(
        DeviceIdentity.generate("d8"), one_time_public(key), context_bytes,
        rank_plaintext(4, 0),
    )  # fmt: skip
    for box in (wrong_slot, forged):
        message = SealedRank(
            federation=FED, round=0, sender="coordinator", epoch=EPOCH, box=box
        )
        with pytest.raises((ValueError, CryptoError)):  # the runtime logs either
            router.dispatch(message)
    assert dubhe.rank(EPOCH) is None


def test_helpers_refuse_what_does_not_fit() -> None:
    with pytest.raises(RankError):
        slot_of(np.array([1, 1, 0]))
    with pytest.raises(RankError):
        open_rank_plaintext(b"short")
    assert slot_of(np.array([0, 0, 1])) == 2
    assert shared_seed(b"k", FED, 1) != shared_seed(b"k", FED, 2)
    assert 0 <= shared_seed(b"k", FED, 1) < 2**63
