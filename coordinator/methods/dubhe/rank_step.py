"""Dubhe's RANKS step: the epoch's rank hand-out as the open round waits on it.

Under the stratified draw, before the epoch's first round draws, every
registrant needs its rank: `RankStep` keeps the registrants' rank keys as
they register (`registered`, in the registration's transaction), loads or
starts the epoch's `RankHandout` (`ursa.coordinator.methods.dubhe.ranks`:
the shuffled order and pages, persisted), sends the agent its pages,
relays each sealed rank to its device, and watches the agent: a stalled
agent is asked again after ``agent_s``; one gone offline ends the step with
a uniform selection and a new key epoch. Under the paper draw it owes
nothing. `ursa.coordinator.methods.dubhe.selection.DubheSelection` holds
it and moves the round on to VOLUNTEERING once nothing is owed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ursa.coordinator.methods.dubhe.ranks import (
    RANKS_DONE_KEY,
    RANKS_KEY,
    RankHandout,
)
from ursa.coordinator.methods.dubhe.records import NAMESPACE, DubheRecords
from ursa.coordinator.seal_pages import BoxVerdict
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionRequest,
)
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    COORDINATOR,
    ErrorCode,
    Registration,
    SealedRank,
    SealedRanks,
)
from ursa.protocol.router import RejectedError

__all__ = ["RankStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")


class RankStep:
    """The rank hand-out of the current key epoch (stratified draw only).

    Args:
        ctx: The runtime's context (send, store, the key epoch, who is online).
        stratified: Whether the federation runs the stratified draw.
        agent_s: How long the agent may stay silent before it is asked again.
        open_round: The open round's index (None between rounds): the round
            the next pages are sent for.
    """

    def __init__(
        self,
        ctx: SelectionContext,
        *,
        stratified: bool,
        agent_s: float,
        open_round: Callable[[], int | None],
    ) -> None:
        self._ctx = ctx
        self._stratified = stratified
        self._agent_s = agent_s
        self._open_round = open_round
        self._handout: RankHandout | None = None
        self._entries: dict[str, tuple[bytes, bytes]] = {}

    def registered(self, epoch: int, registration: Registration) -> None:
        """Keep a registrant's rank key (sent under the stratified draw only)."""
        if registration.rank_key is not None:
            self._kept().add_rank_key(epoch, registration.sender, registration.rank_key)

    def owed(self, request: SelectionRequest) -> bool:
        """Whether the epoch's ranks are still to hand out (loads or starts them)."""
        if not self._stratified:
            return False
        handout = self._handout
        if handout is None or handout.epoch != request.epoch:
            handout = self._load(request)
        return not handout.is_complete

    @property
    def complete(self) -> bool:
        """No hand-out is under way (none started, or every page relayed)."""
        return self._handout is None or self._handout.is_complete

    def waited(self, round_index: int, request: SelectionRequest) -> Selection | None:
        """The step's tick while pages are out: a fallback if the agent is gone.

        A stalled agent is asked again (its open pages re-sent); an agent gone
        offline gives a uniform selection of K eligible devices and a re-key.
        """
        handout, ctx = self._handout, self._ctx
        assert handout is not None
        epoch = ctx.epoch_view()
        if epoch is None or epoch.agent not in ctx.online_devices():
            eligible = sorted(request.eligible)
            chosen = request.rng.permutation(len(eligible))[: request.k]
            logger.warning(
                "round %d: agent offline before every rank was handed out; "
                "a uniform selection and a new key epoch before the next round",
                round_index,
            )
            return Selection(tuple(eligible[int(i)] for i in chosen), None, rekey=True)
        if handout.sent_at is None:  # pages went out while a message was handled
            handout.sent_at = request.now
        elif request.now - handout.sent_at >= self._agent_s:
            logger.warning(
                "key epoch %d: no ranks from agent %s for %.0f s; asking again",
                handout.epoch,
                epoch.agent,
                request.now - handout.sent_at,
            )
            self.send_pages(round_index, request.now, again=True)
        return None

    def send_pages(self, round_index: int, now: float | None, *, again: bool) -> None:
        """Send the agent its next rank pages (and, `again`, the open ones)."""
        ctx, handout = self._ctx, self._handout
        epoch = ctx.epoch_view()
        if handout is None or epoch is None or epoch.agent is None:
            return
        handout.sent_at = now
        for page in handout.pages_to_send(again=again):
            message = handout.request(page, self._entries, ctx.federation, round_index)
            ctx.send(message, epoch.agent)

    def on_sealed_ranks(self, message: SealedRanks) -> None:
        """A page's sealed ranks: relay each entry's first box to its device."""
        ctx = self._ctx
        epoch = ctx.epoch_view()
        handout = self._handout
        if epoch is None or message.sender != epoch.agent:
            raise RejectedError(ErrorCode.UNAUTHORISED, "only the agent ranks")
        if handout is None or handout.epoch != message.epoch:
            raise RejectedError(
                ErrorCode.WRONG_EPOCH, f"no rank hand-out for epoch {message.epoch}"
            )
        devices = [handout.device_at(message.page, b.entry) for b in message.boxes]
        if None in devices:
            raise RejectedError(
                ErrorCode.MALFORMED, f"an entry outside page {message.page}"
            )
        completed = False
        for device, box in zip(devices, message.boxes, strict=True):
            assert device is not None
            verdict, page = handout.record(device)
            if verdict is not BoxVerdict.NEW:
                continue
            relayed = SealedRank(
                federation=ctx.federation,
                round=0,
                sender=COORDINATOR,
                message_id=derived_id("rank", handout.epoch, device),
                epoch=handout.epoch,
                box=box.box,
            )
            ctx.send(relayed, device)
            completed |= page is not None
        if not completed:
            return
        ctx.store.set_method_state(NAMESPACE, RANKS_DONE_KEY, handout.done_record())
        if handout.is_complete:
            self._kept().drop_rank_keys(handout.epoch)
            self._entries = {}
        logger.info(
            "key epoch %d: ranks of %d of %d pages handed out",
            handout.epoch,
            handout.paging.pages_done,
            handout.paging.num_pages,
        )
        round_index = self._open_round()
        if round_index is not None and not handout.is_complete:
            self.send_pages(round_index, None, again=False)

    def finished(self) -> None:
        """The round moved on to VOLUNTEERING: nothing is kept in memory."""
        self._entries = {}

    def _load(self, request: SelectionRequest) -> RankHandout:
        store = self._ctx.store
        self._entries = self._kept().rank_entries(request.epoch)
        handout = RankHandout.restored(
            store.method_state(NAMESPACE, RANKS_KEY),
            store.method_state(NAMESPACE, RANKS_DONE_KEY),
        )
        if handout is None or handout.epoch != request.epoch:
            if handout is not None:  # an earlier epoch's, maybe cut short
                self._kept().drop_rank_keys(handout.epoch)
            handout = RankHandout.start(request.epoch, self._entries, request.rng)
            store.set_method_state(NAMESPACE, RANKS_KEY, handout.plan_record())
            store.set_method_state(NAMESPACE, RANKS_DONE_KEY, handout.done_record())
            logger.info(
                "key epoch %d: handing out %d ranks in %d pages",
                request.epoch,
                len(handout.order),
                handout.paging.num_pages,
            )
        self._handout = handout
        if handout.is_complete:
            self._entries = {}  # nothing left to send: not kept in memory
        return handout

    def _kept(self) -> DubheRecords:
        return DubheRecords(self._ctx.store)
