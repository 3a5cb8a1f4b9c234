"""Dubhe's round steps on the device (Dubhe Fig. 3-5, device side).

On a `RoundAnnounce`: H coins with eq. (6)'s probability, computed from the
decrypted overall registry and this device's category (the key epoch's
roster, kept by the runtime), persisted per round so a re-announce after a
coordinator restart gets the same answer. Silence means no: the device
sends its `Volunteer` (all H coins) only when at least one coin is yes, so
the coordinator hears from about H·K devices per round, whatever the
fleet's size, and never learns who drew no. On a `TryAssignment`: the
encrypted label distribution (packed fixed point). The agent decrypts
`TrySums` and answers the best try, signed. A device outside the registry
does not volunteer. The registration itself (the encrypted one-hot registry
and the registry sum) is the key epoch's roster and stays with the runtime,
so a federation under another selection method still knows who holds the
epoch's key.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar

import numpy as np

from ursa.crypto.paillier import decrypt_real_sum, encrypt_reals, encrypted_vector_from
from ursa.edge_sdk.device_core import DISTRIBUTION_CODEC, derived_id
from ursa.edge_sdk.method import DeviceMethod
from ursa.edge_sdk.registration import best_try, participation_probability, volunteer
from ursa.protocol.messages import (
    AgentAnswer,
    EncryptedDistribution,
    RoundAnnounce,
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

    def __init__(self) -> None:
        self._announce: RoundAnnounce | None = None

    def register(self, router: Router) -> None:
        """Handle announces, try assignments and (as agent) try sums."""
        router.register(RoundAnnounce, self._on_round_announce, owner=self.name)
        router.register(TryAssignment, self._on_try_assignment, owner=self.name)
        router.register(TrySums, self._on_try_sums, owner=self.name)

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
            probability = participation_probability(
                roster.registry, roster.index, message.k
            )
            draws = tuple(volunteer(probability, ctx.rng) for _ in range(message.tries))
            ctx.store.save_draws(message.epoch, message.round, draws)
        ctx.stats.answered_rounds.append(message.round)
        if not any(draws):  # silence means no: nothing to send
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
        ctx, announce = self.ctx, self._current_round(message.round)
        keys = ctx.keys(announce.epoch)
        secret_key = keys.secret_key
        if keys.notice.agent != ctx.device_id or secret_key is None:
            raise ValueError("try sums, but this device is not the agent")
        started = time.perf_counter()
        sums = []
        for blob, count in zip(message.sums, message.member_counts, strict=True):
            vector = encrypted_vector_from(blob, secret_key.public_key)
            if vector.num_parties != count:
                raise ValueError(
                    "a try sum's party count differs from its member count"
                )
            sums.append(
                decrypt_real_sum(secret_key, DISTRIBUTION_CODEC, announce.k, vector)
            )
        best = best_try(np.stack(sums), np.asarray(message.member_counts))
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        answer = AgentAnswer(
            federation=ctx.federation,
            round=message.round,
            sender=me,
            message_id=derived_id(me, "answer", announce.epoch, message.round),
            best_try=best,
        )
        ctx.send(ctx.signed(answer))
