"""Dubhe's round steps on the device (Dubhe Fig. 3-5, device side).

On a `RoundAnnounce`: H coins with eq. (6)'s probability, computed from the
decrypted overall registry and this device's category (the key epoch's
roster, kept by the runtime), persisted per round so a re-announce after a
coordinator restart gets the same answer. The announce signs which rule
the round runs: with ``explicit_replies`` (a fleet under the coordinator's
threshold) the device always sends its `Volunteer`, all H coins, all no
included, so the coordinator closes the window as soon as every online
device has answered; without it silence means no: the device sends it only
when at least one coin is yes, so the coordinator hears from about H·K
devices per round, whatever the fleet's size. On a `TryAssignment`: the
encrypted label distribution (packed fixed point). The agent decrypts
`TrySums` and answers the best try, signed. A device outside the registry
does not volunteer. The registration itself (the encrypted one-hot registry
and the registry sum) is the key epoch's roster and stays with the runtime,
so a federation under another selection method still knows who holds the
epoch's key.

Under the stratified draw (``draw = "stratified"``) the device adds, per key
epoch, a one-time X25519 public key to its registration
(`registration_key`), opens the `SealedRank` the agent sealed to it, and on
a `RoundAnnounce` draws with `stratified_volunteer` from the epoch's shared
seed (derived from the epoch's secret key) and its rank; it waits (the
announce is parked) until its rank has come. As agent it ranks the
coordinator's anonymous `RankRequest` pages in order, keeping each page's
per-slot counts so a page asked for again gets the same ranks.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.paillier import (
    PaillierSecretKey,
    decrypt_real_sum,
    decrypt_vector,
    encrypt_reals,
    encrypted_vector_from,
)
from ursa.crypto.sealing import open_sealed
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, EpochKeys, Roster
from ursa.edge_sdk.methods.dubhe.draws import (
    participation_probability,
    stratified_volunteer,
    volunteer,
)
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
from ursa.edge_sdk.methods.dubhe.tries import best_try, plausible_try_sum
from ursa.edge_sdk.registration import DISTRIBUTION_CODEC
from ursa.protocol.codebook import Codebook
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    AgentAnswer,
    EncryptedDistribution,
    RankBox,
    RankRequest,
    RoundAnnounce,
    SealedRank,
    SealedRanks,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import NotReadyError, Router

__all__ = ["Dubhe"]

logger = logging.getLogger("ursa.edge_sdk")


class Dubhe(DeviceMethod):
    """Dubhe's self-selection: volunteer draws, distributions, the agent's answer."""

    name: ClassVar[str] = "dubhe"
    role: ClassVar[MethodRole | None] = MethodRole.SELECTION

    def __init__(self, ctx: DeviceContext, draw: str = "paper") -> None:
        self.ctx = ctx
        """The device this method runs on."""
        if draw not in ("paper", "stratified"):
            raise ValueError(f"unknown draw {draw!r}: 'paper' or 'stratified'")
        self.draw = draw
        self._announce: RoundAnnounce | None = None

    def register(self, router: Router) -> None:
        """Handle announces, try assignments and (as agent) try sums and ranks."""
        router.register(RoundAnnounce, self._on_round_announce, owner=self.name)
        router.register(TryAssignment, self._on_try_assignment, owner=self.name)
        router.register(TrySums, self._on_try_sums, owner=self.name)
        router.register(RankRequest, self._on_rank_request, owner=self.name)
        router.register(SealedRank, self._on_sealed_rank, owner=self.name)

    def new_run(self) -> None:
        """Forget the old run's round (its stored state is gone already)."""
        self._announce = None

    # --- the stratified draw's rank -------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return self.ctx.store.method_state(self.name) or {}

    def _save(self, **changes: Any) -> None:
        state = self._state()
        state.update(changes)
        self.ctx.store.save_method_state(self.name, state)

    def registration_key(self, epoch: int) -> bytes | None:
        """Stratified draw: this epoch's one-time public key (made and kept once)."""
        if self.draw != "stratified":
            return None
        mine = self._state().get("rank")
        if not isinstance(mine, dict) or mine.get("epoch") != epoch:
            mine = {"epoch": epoch, "one_time": new_one_time_key().hex()}
            self._save(rank=mine)
        private = mine.get("one_time")
        if not isinstance(private, str):
            raise RankError("the rank was opened; no one-time key to send again")
        return one_time_identity(bytes.fromhex(private)).public().x25519_public

    def rank(self, epoch: int) -> int | None:
        """This device's rank in ``epoch`` (None until its sealed rank is opened)."""
        mine = self._state().get("rank")
        if isinstance(mine, dict) and mine.get("epoch") == epoch:
            rank = mine.get("value")
            return rank if isinstance(rank, int) else None
        return None

    def _on_sealed_rank(self, message: SealedRank) -> None:
        ctx = self.ctx
        keys = ctx.keys(message.epoch)  # NotReadyError until the epoch is adopted
        mine = self._state().get("rank")
        if not isinstance(mine, dict) or mine.get("epoch") != message.epoch:
            raise ValueError(f"a rank for epoch {message.epoch}, but no one-time key")
        private = mine.get("one_time")
        if not isinstance(private, str):
            return  # opened already: a copy
        roster = ctx.roster()
        if roster is None:
            raise NotReadyError  # the registry sum has not come yet
        agent = _agent_identity(keys)
        plaintext = open_sealed(
            one_time_identity(bytes.fromhex(private)),
            agent,
            rank_context(ctx.federation, message.epoch),
            message.box,
        )
        slot, rank = open_rank_plaintext(plaintext)
        if slot != roster.index or not 0 <= rank < int(roster.registry[slot]):
            raise RankError(f"rank {rank} of slot {slot} does not fit this device")
        self._save(rank={"epoch": message.epoch, "value": rank})  # key gone
        logger.info("%s: rank of epoch %d received", ctx.device_id, message.epoch)

    def _on_rank_request(self, message: RankRequest) -> None:
        """As agent: rank one page's anonymous registrations, seal each rank."""
        ctx = self.ctx
        keys = ctx.keys(message.epoch)
        secret_key = keys.secret_key
        if keys.notice.agent != ctx.device_id or secret_key is None:
            raise ValueError("rank request, but this device is not the agent")
        notice = keys.notice
        length = Codebook(notice.num_classes, notice.groups).length
        counts = self._counts_before(message.epoch, message.page, length)
        layout = PackingLayout(1, notice.max_parties, notice.key_bits)
        context = rank_context(ctx.federation, message.epoch)
        started = time.perf_counter()
        boxes: list[RankBox] = []
        for j, entry in enumerate(message.entries):
            try:
                vector = encrypted_vector_from(entry.registry, secret_key.public_key)
                slot = slot_of(np.asarray(decrypt_vector(secret_key, layout, vector)))
                if slot >= length:
                    raise RankError(f"slot {slot} outside the codebook")
                box = ctx.seal_for(
                    one_time_public(entry.rank_key),
                    context,
                    rank_plaintext(slot, int(counts[slot])),
                )
            except (CryptoError, RankError) as exc:
                logger.warning("%s: rank entry %d skipped: %s", ctx.device_id, j, exc)
                continue
            counts[slot] += 1
            boxes.append(RankBox(entry=j, box=box))
        ctx.stats.crypto_s += time.perf_counter() - started
        pages = dict(self._agent_pages(message.epoch))
        pages[str(message.page)] = counts.tolist()
        self._save(agent_ranks={"epoch": message.epoch, "after": pages})
        if not boxes:
            return
        me = ctx.device_id
        ctx.send(
            SealedRanks(
                federation=ctx.federation,
                round=0,
                sender=me,
                message_id=derived_id(me, "ranks", message.epoch, message.message_id),
                epoch=message.epoch,
                page=message.page,
                boxes=tuple(boxes),
            )
        )

    def _agent_pages(self, epoch: int) -> dict[str, Any]:
        ranks = self._state().get("agent_ranks")
        if isinstance(ranks, dict) and ranks.get("epoch") == epoch:
            after = ranks.get("after")
            return after if isinstance(after, dict) else {}
        return {}

    def _counts_before(self, epoch: int, page: int, length: int) -> NDArray[np.int64]:
        """Per-slot counts of the pages before ``page`` (pages are ranked in order)."""
        if page == 0:
            return np.zeros(length, dtype=np.int64)
        before = self._agent_pages(epoch).get(str(page - 1))
        if not isinstance(before, list) or len(before) != length:
            raise NotReadyError  # page - 1 first
        return np.asarray(before, dtype=np.int64)

    def _draws(
        self, message: RoundAnnounce, roster: Roster, index: int
    ) -> tuple[bool, ...]:
        """This round's H draws: the paper's coins or the stratified draw."""
        if self.draw != "stratified":
            probability = participation_probability(roster.registry, index, message.k)
            return tuple(
                volunteer(probability, self.ctx.rng) for _ in range(message.tries)
            )
        rank = self.rank(message.epoch)
        secret_key = self.ctx.keys(message.epoch).secret_key
        if rank is None or secret_key is None:
            raise NotReadyError  # the rank (or the key) has not come yet
        seed = shared_seed(
            secret_key.secret_to_bytes(), self.ctx.federation, message.epoch
        )
        return tuple(
            stratified_volunteer(
                roster.registry, index, rank, message.k, seed, message.round, h
            )
            for h in range(message.tries)
        )

    def _on_round_announce(self, message: RoundAnnounce) -> None:
        ctx = self.ctx
        ctx.keys(message.epoch)  # NotReadyError until the epoch is adopted
        roster = ctx.roster()
        if roster is None:
            raise NotReadyError  # the registry sum has not come yet
        if roster.index is None or roster.registry[roster.index] == 0:
            logger.info(
                "%s: not in epoch %d's registry; not volunteering",
                ctx.device_id,
                message.epoch,
            )
            return
        self._announce = message
        draws = ctx.store.load_draws(message.epoch, message.round)
        if draws is None or len(draws) != message.tries:
            draws = self._draws(message, roster, roster.index)
            ctx.store.save_draws(message.epoch, message.round, draws)
        ctx.stats.answered_rounds.append(message.round)
        if not (any(draws) or message.explicit_replies):  # silence means no
            logger.debug("%s: round %d: no draw; silent", ctx.device_id, message.round)
            return
        me = ctx.device_id
        ctx.send(
            Volunteer(
                federation=ctx.federation,
                round=message.round,
                sender=me,
                message_id=derived_id(me, "volunteer", message.epoch, message.round),
                draws=draws,
            )
        )

    def _current_round(self, round_index: int) -> RoundAnnounce:
        announce = self._announce
        if announce is None or round_index > announce.round:
            raise NotReadyError
        if round_index < announce.round:
            raise ValueError(f"round {round_index} is over")
        return announce

    def _on_try_assignment(self, message: TryAssignment) -> None:
        ctx, announce = self.ctx, self._current_round(message.round)
        keys = ctx.keys(announce.epoch)
        distribution = ctx.label_distribution(keys.notice.num_classes)
        if distribution is None:
            raise ValueError("labels that do not fit the classes")
        started = time.perf_counter()
        vector = encrypt_reals(
            keys.public_key,
            DISTRIBUTION_CODEC,
            announce.k,
            distribution,
            obfuscators=keys.pool,
        )
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        ctx.send(
            EncryptedDistribution(
                federation=ctx.federation,
                round=message.round,
                sender=me,
                message_id=derived_id(
                    me, "distribution", announce.epoch, message.round
                ),
                distribution=vector.to_bytes(keys.public_key),
            )
        )

    def _on_try_sums(self, message: TrySums) -> None:
        """As agent: decrypt each try's sum; answer the best, and the bad ones.

        A sum that does not decrypt within its bounds, or whose totals no
        ``count`` honest distributions produce, is named bad (signed) instead
        of failing the whole answer: the coordinator drops its culprit.
        """
        ctx, announce = self.ctx, self._current_round(message.round)
        keys = ctx.keys(announce.epoch)
        secret_key = keys.secret_key
        if keys.notice.agent != ctx.device_id or secret_key is None:
            raise ValueError("try sums, but this device is not the agent")
        started = time.perf_counter()
        sums: dict[int, NDArray[np.float64]] = {}
        pairs = zip(message.sums, message.member_counts, strict=True)
        for h, (blob, count) in enumerate(pairs):
            totals = _try_totals(secret_key, announce.k, blob, count)
            if totals is None or not plausible_try_sum(totals, count):
                logger.warning(
                    "%s: round %d: try sum %d of %d members is bad",
                    ctx.device_id,
                    message.round,
                    h,
                    count,
                )
                continue
            sums[h] = totals
        good = sorted(sums)
        counts = np.asarray(message.member_counts)[good]
        best = (
            good[best_try(np.stack([sums[h] for h in good]), counts)] if good else None
        )
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        answer = AgentAnswer(
            federation=ctx.federation,
            round=message.round,
            sender=me,
            message_id=derived_id(
                me, "answer", announce.epoch, message.round, message.message_id
            ),
            best_try=best,
            bad_tries=tuple(h for h in range(len(message.sums)) if h not in sums),
        )
        ctx.send(ctx.signed(answer))


def _try_totals(
    secret_key: PaillierSecretKey, k: int, blob: bytes, count: int
) -> NDArray[np.float64] | None:
    """One try's decrypted class totals; None when the sum is malformed."""
    try:
        vector = encrypted_vector_from(blob, secret_key.public_key)
        if vector.num_parties != count:
            raise CryptoError(f"{vector.num_parties} parties for {count} members")
        return decrypt_real_sum(secret_key, DISTRIBUTION_CODEC, k, vector)
    except CryptoError:
        return None


def _agent_identity(keys: EpochKeys) -> DevicePublicIdentity:
    """The epoch's agent, whose boxes a device opens (from the signed notice)."""
    agent = keys.notice.agent_keys
    return DevicePublicIdentity(
        agent.device_id, agent.x25519_public, agent.ed25519_public
    )
