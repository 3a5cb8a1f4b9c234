"""Dubhe's RANKS step on its own: what it keeps, what it owes, what it sends."""

from __future__ import annotations

from ursa.coordinator.methods.dubhe.rank_step import RankStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.protocol.messages import RankRequest, Registration

from .test_selection import DEVICES, FED, FakeContext, request

REGISTRY = b"\x01" * 8


def _registration(device: str, rank_key: bytes | None) -> Registration:
    return Registration(
        federation=FED,
        round=0,
        sender=device,
        epoch=1,
        registry=REGISTRY,
        rank_key=rank_key,
    )


def _step(ctx: FakeContext, *, stratified: bool) -> RankStep:
    return RankStep(ctx, stratified=stratified, agent_s=10, open_round=lambda: 1)


def _registered_stratified(ctx: FakeContext) -> RankStep:
    """A stratified step after every device registered with its rank key."""
    step = _step(ctx, stratified=True)
    for n, device in enumerate(DEVICES):
        ctx.store.add_registration(1, device, b"sum", REGISTRY)
        step.registered(1, _registration(device, bytes([n]) * 32))
    return step


def test_the_paper_draw_keeps_no_rank_key_and_owes_nothing(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step = _step(ctx, stratified=False)
    empty_store.add_registration(1, "d0", b"sum", REGISTRY)
    step.registered(1, _registration("d0", None))

    assert empty_store.count_method_rows("dubhe", "rank_keys.1") == 0
    assert not step.owed(request(ctx, 0.0))
    assert step.complete


def test_the_stratified_draw_pages_every_registrant_to_the_agent(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step = _registered_stratified(ctx)
    assert set(DubheRecords(empty_store).rank_entries(1)) == set(DEVICES)

    assert step.owed(request(ctx, 0.0))
    step.send_pages(1, 0.0, again=False)
    pages = [(m, agent) for m, agent in ctx.sent if isinstance(m, RankRequest)]
    assert pages and {agent for _, agent in pages} == {"d4"}
    sent = {e.rank_key for m, _ in pages for e in m.entries}
    assert sent == {bytes([n]) * 32 for n in range(len(DEVICES))}
    assert not step.complete


def test_an_agent_gone_before_the_ranks_gives_a_uniform_selection_and_a_rekey(
    empty_store: CoordinatorStore,
    step_keys: tuple[PaillierPublicKey, PaillierSecretKey],
) -> None:
    ctx = FakeContext(empty_store, step_keys[0])
    step = _registered_stratified(ctx)
    assert step.owed(request(ctx, 0.0))
    ctx.online.discard("d4")

    selection = step.waited(1, request(ctx, 1.0))
    assert selection is not None and selection.rekey
    assert len(selection.selected) == 2 and "d4" not in selection.selected
