"""Dubhe's coordinator half: volunteers, tries, the agent's answer (Fig. 3, 5).

A `SelectionMethod` in three steps, each with its own window:

VOLUNTEERING (`ursa.coordinator.methods.dubhe.volunteer_step`): the
retained `RoundAnnounce` asks every registered device for
its H draws, under one of two rules the announce signs
(``explicit_replies``, from ``[selection] explicit_replies_below``). Below
the threshold every online registered device answers (`Volunteer`, all H
draws, all no included) and the step closes as soon as every eligible
device has answered, else at the window's end (``deadlines.volunteer_s``):
N small messages, nothing at a field trial's size, and no window waited out.
Above it silence means no: a device answers only when at least one draw is
yes, so the coordinator hears about H·K devices whatever the fleet's size;
the step closes as soon as every try has at least K volunteers, else at the
window's end. An answer the round's rule does not allow (all no under
silence, a second one, too many or too few draws, one after an explicit
window closed) is refused, typed, and counts for nothing. Per try, surplus
volunteers are trimmed and a shortfall topped up uniformly from the online
registered devices that did not volunteer in that try
(`ursa.coordinator.methods.dubhe.tries`). Only when fewer than K devices
are there to choose from is the round announced again, each window twice as
long as the last, up to 16 (a round never selects fewer than K, and never
re-announces in a loop).
With H = 1 that try is the selection. Each `Volunteer` costs O(H): a
per-try counter, never a pass over the fleet.

DISTRIBUTIONS (H > 1; `ursa.coordinator.methods.dubhe.distribution_step`):
each member of some try gets a `TryAssignment` and
answers with its encrypted label distribution once; per try the coordinator
sums the members' ciphertexts. The step closes as soon as every online
member has answered (else at ``deadlines.distributions_s``); tries with a
silent member are not offered.

A distribution whose ciphertext count is not the layout's (public: the
coordinator checks it on arrival) or that does not parse drops its sender
from the round's tries; its tries go on without it.

AGENT (`ursa.coordinator.methods.dubhe.agent_step`): the complete tries'
sums go to the epoch's agent (`TrySums`), which
answers the index of the best one, signed, and the positions of sums no
honest members can produce (`AgentAnswer.bad_tries`: a slot over its bound,
totals that are not the member count's distributions). With a good try left,
the best good one is selected. When every sum is bad, the members common to
every bad try are the suspects (one malformed contribution spoils every try
it is summed into); one of them is dropped and the tries summed again and
re-sent, at most `MAX_RESUMS` times; with no common member the round takes a
uniform selection outside the bad tries. None of this re-keys: the agent
answered. If the agent stays silent past the window, or is offline, the first
complete try (try 0 when complete) is selected, logged, and the runtime
starts a new key epoch before the next round (the agent holds the only
answer the protocol trusts). With no complete try, try 0 is repaired from
devices that did deliver, topped up to K.

PARTICIPATION CAP: a device selected in ``limit`` of the last ``window``
rounds is in no try of the next (`ursa.coordinator.methods.dubhe.
participation`), as a volunteer or a top-up; its counts are rebuilt from the
store's round records after a restart.

RANKS (stratified draw, the epoch's first round only): before its devices
can draw, each registrant needs its rank. The coordinator sends the agent
the epoch's anonymous registrations in `RankRequest` pages and relays each
sealed rank back (the step is `ursa.coordinator.methods.dubhe.rank_step`,
its pages `ursa.coordinator.methods.dubhe.ranks`); volunteers that
arrive meanwhile count as in VOLUNTEERING, whose window opens when every
page is done. A stalled agent is asked again after ``agent_s``; an agent
gone offline ends the step with a uniform selection and a new key epoch.
Under this draw the selection is sent to each selected device alone
(`private_selection`): every device knows the shared seed, and a broadcast
set would let it link device ids to categories.

The open round's progress in memory is a `RoundProgress`
(`ursa.coordinator.methods.dubhe.round_progress`), which every step reads
and advances. Progress lives in Dubhe's records in the store (volunteers'
draws, tentative sets, encrypted distributions, candidates:
`ursa.coordinator.methods.dubhe.records`), written in the transaction of
the message that changed it; the step is read back from what is there, so a
restarted coordinator resumes with fresh windows and re-sends what it waits
on. The coordinator sees draws and ciphertexts only: never a distribution.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from typing import ClassVar

from ursa.coordinator.methods.dubhe.agent_step import AgentStep
from ursa.coordinator.methods.dubhe.distribution_step import DistributionStep
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.dubhe.rank_step import RankStep
from ursa.coordinator.methods.dubhe.records import (
    NAMESPACE,
    DubheRecords,
    DubheRound,
    natural_key,
)
from ursa.coordinator.methods.dubhe.round_progress import DubheStep, RoundProgress
from ursa.coordinator.methods.dubhe.volunteer_step import VolunteerStep
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionMethod,
    SelectionRequest,
)
from ursa.coordinator.store import NaturalKey, RoundRecord
from ursa.crypto.errors import CryptoError
from ursa.crypto.paillier import encrypted_vector_from
from ursa.protocol.messages import (
    AgentAnswer,
    BaseMessage,
    EncryptedDistribution,
    ErrorCode,
    Registration,
    SealedRanks,
    Volunteer,
)
from ursa.protocol.router import RejectedError, Router

__all__ = ["DubheSelection", "DubheStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")


class DubheSelection(SelectionMethod):
    """Dubhe's self-selection over the encrypted registry (the coordinator half).

    Args:
        ctx: The runtime's context (send, store, the key epoch, who is online),
            held from construction on.
        tries: H, the tentative sets per round (1: no agent step).
        num_classes: Length of every encrypted distribution.
        volunteer_s: The volunteering window (and each re-announce's).
        distributions_s: The window for the members' distributions.
        agent_s: The window for the agent's answer.
        draw: ``"paper"`` or ``"stratified"`` (the devices' volunteer draw).
        cap: The participation cap (None: none).
    """

    name: ClassVar[str] = NAMESPACE

    def __init__(
        self,
        ctx: SelectionContext,
        *,
        tries: int,
        num_classes: int,
        volunteer_s: float,
        distributions_s: float,
        agent_s: float,
        draw: str = "paper",
        cap: ParticipationCap | None = None,
    ) -> None:
        if draw not in ("paper", "stratified"):
            raise ValueError(f"unknown draw {draw!r}: 'paper' or 'stratified'")
        self._stratified = draw == "stratified"
        self._ranks = RankStep(
            ctx,
            stratified=self._stratified,
            agent_s=agent_s,
            open_round=lambda: None if self._round is None else self._round.round,
        )
        self._tries = tries
        self._volunteer_s = volunteer_s
        self._distributions_s = distributions_s
        self._agent_s = agent_s
        self._ctx = ctx
        self._round: RoundProgress | None = None
        self._cap = cap
        self._agent = AgentStep(ctx, agent_s=agent_s, cap=cap)
        self._members = DistributionStep(
            ctx,
            num_classes=num_classes,
            distributions_s=distributions_s,
            agent=self._agent,
        )
        self._volunteers = VolunteerStep(
            ctx,
            tries=tries,
            volunteer_s=volunteer_s,
            cap=cap,
            members=self._members,
        )

    @property
    def private_selection(self) -> bool:
        """Under the stratified draw each selected device alone hears its selection."""
        return self._stratified

    @property
    def step(self) -> DubheStep | None:
        """The open round's step (None between rounds); for tests and status."""
        return None if self._round is None else self._round.step

    # --- SelectionMethod ----------------------------------------------------------

    def natural_key(self, message: BaseMessage) -> NaturalKey | None:
        """A volunteer's or distribution's row de-duplicates it (`records`)."""
        return natural_key(message)

    def register(self, router: Router) -> None:
        """Volunteers, distributions and the agent's answer come here."""
        router.register(Volunteer, self._on_volunteer, owner=self.name)
        router.register(EncryptedDistribution, self._on_distribution, owner=self.name)
        router.register(AgentAnswer, self._on_agent_answer, owner=self.name)
        router.register(SealedRanks, self._ranks.on_sealed_ranks, owner=self.name)

    def extend_deadlines(self, seconds: float) -> None:
        """The open step's window waits ``seconds`` longer (the broker was away)."""
        if self._round is not None and seconds > 0:
            self._round.deadline_at += seconds

    def registered(self, epoch: int, registration: Registration) -> None:
        """Keep the registrant's rank key (stratified draw) for the epoch's hand-out."""
        self._ranks.registered(epoch, registration)

    def epoch_unusable(self, epoch: EpochView, online: Set[str]) -> str | None:
        """With H > 1 every round needs the agent: a new epoch when it is gone."""
        if self._tries > 1 and epoch.agent not in online:
            return "agent offline"
        return None

    def open_round(self, request: SelectionRequest) -> None:
        """A new round: collect volunteers for one window (ranks first if owed)."""
        self._volunteers.restore_cap(request.round)
        self._round = RoundProgress(
            request.round,
            request.epoch,
            DubheStep.VOLUNTEERING,
            request.now + self._volunteer_s,
            explicit=request.explicit_replies,
            k=request.k,
        )
        if self._ranks.owed(request):
            self._round.step = DubheStep.RANKS
            self._ranks.send_pages(request.round, request.now, again=True)

    def resume(self, request: SelectionRequest) -> None:
        """Reload the round from the store; re-send what its step waits on."""
        record = self._ctx.store.round(request.round)
        if record is None or record.epoch != request.epoch:
            self.open_round(request)
            return
        self._volunteers.restore_cap(request.round)
        work = self._restored(record, self._kept().round(request.round), request.now)
        work.k = request.k
        work.explicit = request.explicit_replies
        self._round = work
        if work.step is DubheStep.VOLUNTEERING and self._ranks.owed(request):
            work.step = DubheStep.RANKS
            self._ranks.send_pages(request.round, request.now, again=True)
        elif work.step is DubheStep.DISTRIBUTIONS:
            self._members.send_assignments(
                work, sorted(work.members() - set(work.distributions))
            )
        elif work.step is DubheStep.AGENT:
            self._agent.send_sums(work)

    def select(self, request: SelectionRequest) -> Selection | None:
        """Run the open round's steps until one waits or the selection is made."""
        work = self._round
        if work is None or work.round != request.round:
            self.open_round(request)
            work = self._round
            assert work is not None
        steps: dict[
            DubheStep, Callable[[RoundProgress, SelectionRequest], Selection | None]
        ]
        steps = {
            DubheStep.RANKS: self._ranking,
            DubheStep.VOLUNTEERING: self._volunteers.tick,
            DubheStep.DISTRIBUTIONS: self._members.tick,
            DubheStep.AGENT: self._agent.tick,
        }
        while work.step in steps:
            step = work.step
            selection = steps[step](work, request)
            if selection is not None:
                work.step = DubheStep.SELECTED
                if self._cap is not None:
                    self._cap.record(work.round, selection.selected)
                return selection
            if work.step is step:
                return None
        return None

    # --- steps ----------------------------------------------------------------------

    def _ranking(
        self, work: RoundProgress, request: SelectionRequest
    ) -> Selection | None:
        if not self._ranks.complete:
            return self._ranks.waited(work.round, request)
        work.step = DubheStep.VOLUNTEERING
        work.deadline_at = request.now + self._volunteer_s
        self._ranks.finished()
        return None

    # --- handlers ---------------------------------------------------------------------

    def _open(self, message: BaseMessage, step: DubheStep) -> RoundProgress:
        """The open round if ``message`` is for it and it is at ``step``.

        Raises:
            RejectedError: another round, or the round is past ``step``.
        """
        work = self._round
        current = 0 if work is None else work.round
        if work is None or message.round > current:
            raise RejectedError(
                ErrorCode.WRONG_ROUND,
                f"round {message.round} is not open (current {current})",
            )
        if message.round < current:
            raise RejectedError(ErrorCode.LATE, f"round {message.round} is over")
        if work.step is not step:
            raise RejectedError(
                ErrorCode.LATE, f"round {current} is past {step} ({work.step})"
            )
        return work

    def _on_volunteer(self, message: Volunteer) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._round
        drawing = (DubheStep.RANKS, DubheStep.VOLUNTEERING)
        closed = work is not None and work.step not in drawing
        if work is not None and closed and message.round == work.round:
            if work.explicit:  # every answer was waited for: this one is late
                raise RejectedError(
                    ErrorCode.LATE, f"round {work.round}'s answers are closed"
                )
            # The window closed early (K per try): a normal, honest answer.
            logger.debug("round %d: late volunteer of %s", work.round, device)
            return
        ranking = work is not None and work.step is DubheStep.RANKS
        work = self._open(
            message, DubheStep.RANKS if ranking else DubheStep.VOLUNTEERING
        )
        self._volunteers.on_volunteer(work, message)

    def _on_distribution(self, message: EncryptedDistribution) -> None:
        work = self._open(message, DubheStep.DISTRIBUTIONS)
        self._members.on_distribution(work, message)

    def _on_agent_answer(self, message: AgentAnswer) -> None:
        self._agent.on_answer(self._open(message, DubheStep.AGENT), message)

    # --- plumbing ---------------------------------------------------------------------

    def _kept(self) -> DubheRecords:
        """Dubhe's records in the store the context holds (open from start)."""
        return DubheRecords(self._ctx.store)

    def _restored(
        self, round_: RoundRecord, record: DubheRound, now: float
    ) -> RoundProgress:
        """The round as the store has it, at the step its data says, fresh window."""
        if round_.selected is not None:
            step, window = DubheStep.SELECTED, 0.0
        elif record.tries is None:
            step, window = DubheStep.VOLUNTEERING, self._volunteer_s
        elif record.candidates is None:
            step, window = DubheStep.DISTRIBUTIONS, self._distributions_s
        else:
            step, window = DubheStep.AGENT, self._agent_s
        work = RoundProgress(
            round_.round,
            round_.epoch,
            step,
            now + window,
            volunteers=dict(record.volunteers),
            tentative=record.tries,
            candidates=record.candidates,
        )
        for draws in record.volunteers.values():
            work.count(draws)
        epoch = self._ctx.epoch_view()
        if epoch is not None and epoch.public_key is not None:
            try:
                work.distributions = {
                    d: encrypted_vector_from(b, epoch.public_key, num_parties=1)
                    for d, b in record.distributions.items()
                }
            except CryptoError:
                logger.exception(
                    "stored distributions of round %d unreadable", round_.round
                )
        return work
