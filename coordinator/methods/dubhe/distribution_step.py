"""Dubhe's DISTRIBUTIONS step (H > 1): the try members' encrypted distributions.

Each member of some try gets a `TryAssignment` and answers with its
encrypted label distribution once; the step closes as soon as every online
member has answered (else at ``distributions_s``) and hands the complete
tries to the AGENT step (`ursa.coordinator.methods.dubhe.agent_step`). A
distribution whose ciphertext count is not the layout's (public: checked on
arrival) or that does not parse drops its sender from the round's tries;
they go on without it. With no agent online or no complete try, the round
falls back to a try repaired from the devices that did deliver, topped up to
K (`ursa.coordinator.methods.dubhe.tries.fallback_selection`).
"""

from __future__ import annotations

import logging
from typing import NoReturn

from ursa.coordinator.methods.dubhe.agent_step import AgentStep
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.methods.dubhe.tries import complete_tries, fallback_selection
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionRequest,
)
from ursa.crypto.encoding import FixedPoint
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import encrypted_vector_from
from ursa.protocol.messages import (
    COORDINATOR,
    EncryptedDistribution,
    ErrorCode,
    TryAssignment,
)
from ursa.protocol.messages.dubhe import DISTRIBUTION_BOUND
from ursa.protocol.router import RejectedError

__all__ = ["DISTRIBUTION_CODEC", "DistributionStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")

DISTRIBUTION_CODEC = FixedPoint(DISTRIBUTION_BOUND)
"""The devices' label-distribution codec: its layout fixes the ciphertext count."""


class DistributionStep:
    """The members' distributions of a round with H > 1 tries.

    Args:
        ctx: The runtime's context (send, store, the key epoch, who is online).
        num_classes: Length of every encrypted distribution.
        distributions_s: The window for the members' distributions.
        agent: The next step, handed the complete tries.
    """

    def __init__(
        self,
        ctx: SelectionContext,
        *,
        num_classes: int,
        distributions_s: float,
        agent: AgentStep,
    ) -> None:
        self._ctx = ctx
        self._num_classes = num_classes
        self._distributions_s = distributions_s
        self._agent = agent

    def ask(self, work: RoundProgress, now: float) -> None:
        """Enter the step: open the window, send every member its assignment."""
        work.step = DubheStep.DISTRIBUTIONS
        work.deadline_at = now + self._distributions_s
        self.send_assignments(work, sorted(work.members()))

    def tick(self, work: RoundProgress, request: SelectionRequest) -> Selection | None:
        """Close the step once every online member delivered, or at the window."""
        ctx = self._ctx
        epoch, online = ctx.epoch_view(), ctx.online_devices()
        assert work.tentative is not None and epoch is not None
        delivered = set(work.distributions)
        waiting = (work.members() & online) - delivered - work.dropped
        if waiting and request.now < work.deadline_at:  # the dead never send
            return None
        tries = work.tries()
        candidates = complete_tries(tries, delivered)
        if candidates and epoch.agent in online and epoch.public_key is not None:
            self._agent.ask(work, candidates, request.now)
            return None
        volunteers_alive = {d for d in work.volunteers if d in online}
        alive = sorted(
            (delivered | volunteers_alive | set(request.eligible)) - work.dropped
        )
        try_index, selected = fallback_selection(
            tries, candidates, alive, request.k, request.rng
        )
        logger.warning(
            "round %d: agent %s unavailable or no complete try; fallback to try %s",
            work.round,
            epoch.agent,
            try_index,
        )
        return Selection(selected, try_index, rekey=epoch.agent not in online)

    def send_assignments(self, work: RoundProgress, devices: list[str]) -> None:
        """Tell each of ``devices`` the tries it is a member of."""
        ctx = self._ctx
        for device in devices:
            indices = tuple(
                h for h, members in enumerate(work.tentative or ()) if device in members
            )
            message = TryAssignment(
                federation=ctx.federation,
                round=work.round,
                sender=COORDINATOR,
                try_indices=indices,
            )
            ctx.send(message, device)

    def on_distribution(
        self, work: RoundProgress, message: EncryptedDistribution
    ) -> None:
        """A member's encrypted distribution for the open round (at this step)."""
        device = message.sender  # admission checked it is the topic's device
        ctx = self._ctx
        epoch = ctx.epoch_view()
        if device not in work.members() or epoch is None or epoch.public_key is None:
            raise RejectedError(ErrorCode.UNAUTHORISED, "not a member of any try")
        if device in work.distributions:
            logger.info("duplicate distribution of %s ignored", device)
            return
        if device in work.dropped:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"dropped from round {work.round}'s tries"
            )
        try:
            vector = encrypted_vector_from(
                message.distribution, epoch.public_key, num_parties=1
            )
        except CryptoError as exc:
            self._drop_malformed(work, device, str(exc))
        layout = DISTRIBUTION_CODEC.layout(work.k, epoch.public_key.key_bits)
        needed = layout.num_plaintexts(self._num_classes)
        if vector.length != self._num_classes:
            self._drop_malformed(
                work,
                device,
                f"distribution has {vector.length} values, not {self._num_classes}",
            )
        if len(vector.ciphertexts) != needed:
            self._drop_malformed(
                work,
                device,
                f"distribution has {len(vector.ciphertexts)} ciphertexts; "
                f"{self._num_classes} values for K={work.k} take {needed}",
            )
        self._kept().add_distribution(work.round, device, message.distribution)
        work.distributions[device] = vector

    def _drop_malformed(
        self, work: RoundProgress, device: str, reason: str
    ) -> NoReturn:
        """Drop `device` from the round's tries (they go on without it); refuse."""
        work.dropped.add(device)
        logger.warning(
            "round %d: %s's distribution is malformed (%s); its tries go on without it",
            work.round,
            device,
            reason,
        )
        raise RejectedError(ErrorCode.BAD_CIPHERTEXT, reason)

    def _kept(self) -> DubheRecords:
        return DubheRecords(self._ctx.store)
