"""Dubhe's AGENT step: the complete tries' sums to the agent, and its answer.

The coordinator sums each complete try's encrypted distributions and sends
the sums to the epoch's agent (`TrySums`); the agent answers, signed, the
best try and the sums no honest members can produce (`AgentAnswer`). With a
good try the best one is selected, topped up to K if members were dropped;
when every sum is bad, a member common to every bad try is dropped and the
tries summed again (at most `MAX_RESUMS` times), else the round takes a
uniform selection outside the bad tries, without a re-key. An agent silent
past the window, or offline, gives the first complete try and a new key
epoch before the next round.
"""

from __future__ import annotations

import logging

from ursa.coordinator.agent_signature import require_agent_signed
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.methods.dubhe.tries import common_suspects, complete_tries
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionRequest,
)
from ursa.crypto.paillier import sum_encrypted
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import COORDINATOR, AgentAnswer, ErrorCode, TrySums
from ursa.protocol.router import RejectedError

__all__ = ["MAX_RESUMS", "AgentStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")

MAX_RESUMS = 8
"""Re-sums after an all-bad agent answer, each without one more suspect."""


class AgentStep:
    """The agent's part of a round with H > 1 tries.

    Args:
        ctx: The runtime's context (send, store, the key epoch, who is online).
        agent_s: The window for the agent's answer.
        cap: The participation cap a top-up respects (None: none).
    """

    def __init__(
        self,
        ctx: SelectionContext,
        *,
        agent_s: float,
        cap: ParticipationCap | None,
    ) -> None:
        self._ctx = ctx
        self._agent_s = agent_s
        self._cap = cap

    def ask(self, work: RoundProgress, candidates: tuple[int, ...], now: float) -> None:
        """Enter the step: keep the candidates, open the window, send the sums."""
        work.candidates = candidates
        self._kept().set_candidates(work.round, candidates)
        work.step = DubheStep.AGENT
        work.deadline_at = now + self._agent_s
        self.send_sums(work)

    def tick(self, work: RoundProgress, request: SelectionRequest) -> Selection | None:
        """The step's tick: the agent's try, a re-sum, or a fallback at the window."""
        if work.answer is not None:
            return self._topped_up(work, work.answer, request)
        if work.bad_sums is not None:
            return self._after_bad_sums(work, request)
        ctx = self._ctx
        epoch = ctx.epoch_view()
        agent = None if epoch is None else epoch.agent
        agent_gone = agent not in ctx.online_devices()
        if not (agent_gone or request.now >= work.deadline_at):
            return None
        assert work.tentative is not None
        candidates = work.candidates or (0,)
        logger.warning(
            "round %d: agent %s; fallback to try %d and a new key epoch before "
            "the next round",
            work.round,
            "offline" if agent_gone else "silent past the deadline",
            candidates[0],
        )
        return Selection(work.tries()[candidates[0]], candidates[0], rekey=True)

    def _topped_up(
        self, work: RoundProgress, selection: Selection, request: SelectionRequest
    ) -> Selection:
        """The agent's try, topped up to K when members were dropped from it.

        The honest fleet keeps K participants a round; the top-up is uniform
        over the eligible devices outside the try (not dropped, not capped),
        as a short try's is. O(N) only in a round that dropped a member.
        """
        need = request.k - len(selection.selected)
        if need <= 0 or not work.dropped:
            return selection
        held = self._cap.capped(work.round) if self._cap is not None else frozenset()
        taken = set(selection.selected) | work.dropped
        pool = sorted(d for d in request.eligible if d not in taken and d not in held)
        extra = [pool[int(i)] for i in request.rng.permutation(len(pool))[:need]]
        chosen = tuple(sorted((*selection.selected, *extra)))
        return Selection(chosen, selection.try_index, selection.rekey)

    def _after_bad_sums(
        self, work: RoundProgress, request: SelectionRequest
    ) -> Selection | None:
        """Every try sum was bad: drop a suspect and sum again, or select around.

        Never a re-key: the agent answered, and what it refused is one device's
        contribution, not the epoch's key.
        """
        bad, work.bad_sums = work.bad_sums or (), None
        suspects = common_suspects(work.tries(), bad)
        if suspects and work.resums < MAX_RESUMS:
            culprit = suspects[int(request.rng.integers(len(suspects)))]
            work.dropped.add(culprit)
            work.resums += 1
            candidates = complete_tries(work.tries(), set(work.distributions))
            logger.warning(
                "round %d: every try sum bad (%s); dropping %s (%d in every bad "
                "try) and summing %d tries again",
                work.round,
                ", ".join(map(str, bad)),
                culprit,
                len(suspects),
                len(candidates),
            )
            if candidates:
                self.ask(work, candidates, request.now)
                return None
        spoilt = {d for h in bad for d in work.tries()[h]} | work.dropped
        clean = sorted(set(request.eligible) - spoilt)
        pool = clean if len(clean) >= request.k else sorted(request.eligible)
        chosen = request.rng.permutation(len(pool))[: request.k]
        logger.warning(
            "round %d: every try sum bad and no single suspect; a uniform "
            "selection from %d devices %s, no new key epoch",
            work.round,
            len(pool),
            "outside the bad tries" if pool is clean else "(all eligible)",
        )
        return Selection(tuple(sorted(pool[int(i)] for i in chosen)), None)

    def send_sums(self, work: RoundProgress) -> None:
        """Sum each candidate try's distributions and send the sums to the agent."""
        ctx = self._ctx
        epoch = ctx.epoch_view()
        if epoch is None or epoch.public_key is None or work.tentative is None:
            return
        public_key, tentative = epoch.public_key, work.tries()
        candidates = work.candidates or ()
        sums = tuple(
            sum_encrypted(
                public_key, (work.distributions[d] for d in tentative[h])
            ).to_bytes(public_key)
            for h in candidates
        )
        message = TrySums(
            federation=ctx.federation,
            round=work.round,
            sender=COORDINATOR,
            message_id=derived_id("try_sums", work.epoch, work.round, work.resums),
            sums=sums,
            member_counts=tuple(len(tentative[h]) for h in candidates),
        )
        ctx.send(message, epoch.agent)

    def on_answer(self, work: RoundProgress, message: AgentAnswer) -> None:
        """The agent's signed answer for the open round (at this step)."""
        # admission checked the sender is the topic's device
        require_agent_signed(self._ctx.epoch_view(), message)
        candidates = work.candidates or ()
        best = message.best_try
        named = (*message.bad_tries, *(() if best is None else (best,)))
        if any(p >= len(candidates) for p in named) or work.tentative is None:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"try positions {named} outside the {len(candidates)} sums",
            )
        if message.bad_tries:
            logger.warning(
                "round %d: agent found try sums %s bad (of %d)",
                work.round,
                ", ".join(str(candidates[p]) for p in message.bad_tries),
                len(candidates),
            )
        if best is None:  # every sum bad: the next step drops a suspect
            work.bad_sums = tuple(candidates[p] for p in message.bad_tries)
            return
        h = candidates[best]
        work.answer = Selection(work.tries()[h], h)

    def _kept(self) -> DubheRecords:
        return DubheRecords(self._ctx.store)
