"""Dubhe's coordinator half: volunteers, tries, the agent's answer (Fig. 3, 5).

A `SelectionMethod` in three steps, each with its own window:

VOLUNTEERING: the retained `RoundAnnounce` asks every registered device for
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

DISTRIBUTIONS (H > 1): each member of some try gets a `TryAssignment` and
answers with its encrypted label distribution once; per try the coordinator
sums the members' ciphertexts. The step closes as soon as every online
member has answered (else at ``deadlines.distributions_s``); tries with a
silent member are not offered.

A distribution whose ciphertext count is not the layout's (public: the
coordinator checks it on arrival) or that does not parse drops its sender
from the round's tries; its tries go on without it.

AGENT: the complete tries' sums go to the epoch's agent (`TrySums`), which
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

Progress lives in Dubhe's records in the store (volunteers' draws, tentative
sets, encrypted distributions, candidates: `ursa.coordinator.methods.dubhe.
records`), written in the transaction of the message that changed it; the
step is read back from what is there, so a restarted coordinator resumes
with fresh windows and re-sends what it waits on. The coordinator sees draws
and ciphertexts only: never a distribution.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import ClassVar, NoReturn

from ursa._compat import StrEnum
from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.coordinator.methods.dubhe.rank_step import RankStep
from ursa.coordinator.methods.dubhe.records import (
    NAMESPACE,
    DubheRecords,
    DubheRound,
    natural_key,
)
from ursa.coordinator.methods.dubhe.tries import (
    common_suspects,
    complete_tries,
    fallback_selection,
    make_tries,
    short_tries,
    without,
)
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.selection_method import (
    Selection,
    SelectionContext,
    SelectionMethod,
    SelectionRequest,
)
from ursa.coordinator.store import NaturalKey, RoundRecord
from ursa.crypto.encoding import FixedPoint
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import EncryptedVector, encrypted_vector_from, sum_encrypted
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    COORDINATOR,
    AgentAnswer,
    BaseMessage,
    EncryptedDistribution,
    ErrorCode,
    Registration,
    SealedRanks,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.messages.dubhe import DISTRIBUTION_BOUND
from ursa.protocol.router import RejectedError, Router

__all__ = ["DubheSelection", "DubheStep"]

logger = logging.getLogger("ursa.coordinator.dubhe")

MAX_BACKOFF = 16
"""A short volunteering window is retried 2, 4, ... up to 16 windows later."""
MAX_RESUMS = 8
"""Re-sums after an all-bad agent answer, each without one more suspect."""
DISTRIBUTION_CODEC = FixedPoint(DISTRIBUTION_BOUND)
"""The devices' label-distribution codec: its layout fixes the ciphertext count."""


class DubheStep(StrEnum):
    """Where Dubhe is in the open round."""

    RANKS = "ranks"
    """Stratified draw: the epoch's ranks are being handed out."""
    VOLUNTEERING = "volunteering"
    DISTRIBUTIONS = "distributions"
    AGENT = "agent"
    SELECTED = "selected"
    """The round's selection was handed to the runtime; late answers are refused."""


@dataclass
class _Round:
    """The open round as Dubhe works on it (mirrors the store's round record)."""

    round: int
    epoch: int
    step: DubheStep
    deadline_at: float
    volunteers: dict[str, tuple[bool, ...]] = field(default_factory=dict)
    """Every answer's draws (all-no ones too, under explicit replies)."""
    explicit: bool = False
    """The announce asked every online device to answer (`SelectionRequest`)."""
    yes: list[int] = field(default_factory=list)
    """Per try, how many volunteers drew yes (kept per message: O(H))."""
    tentative: tuple[tuple[str, ...], ...] | None = None
    distributions: dict[str, EncryptedVector] = field(default_factory=dict)
    candidates: tuple[int, ...] | None = None
    answer: Selection | None = None
    """The agent's verified choice, handed over at the next step."""
    retries: int = 0
    """Volunteering windows that closed short of K (each next one is longer)."""
    short_at: int | None = None
    """Answers held when the window last closed short of K: under explicit
    replies the next window closes early only once a new answer came, so a
    fleet of fewer than K online devices that have all answered waits the
    backoff out instead of re-announcing at every tick."""
    k: int = 0
    dropped: set[str] = field(default_factory=set)
    """Out of this round's tries: a malformed distribution, or a suspect of
    an all-bad agent answer (kept in memory: a restart asks again)."""
    bad_sums: tuple[int, ...] | None = None
    """Try indices of the agent's all-bad answer, for the next step to act on."""
    resums: int = 0

    def count(self, draws: tuple[bool, ...]) -> None:
        """Add one volunteer's draws to the per-try counts."""
        if len(self.yes) < len(draws):
            self.yes.extend([0] * (len(draws) - len(self.yes)))
        for h, drew in enumerate(draws):
            self.yes[h] += bool(drew)

    def all_answered(self, eligible: Set[str]) -> bool:
        """Under explicit replies: whether every eligible device has answered.

        O(1) until the answers are as many as the eligible devices, then one
        pass (a fleet under the threshold).
        """
        if not self.explicit or len(self.volunteers) < len(eligible):
            return False
        return all(d in self.volunteers for d in eligible)

    def members(self) -> set[str]:
        """Every device in some tentative set."""
        return {d for t in self.tentative or () for d in t}

    def tries(self) -> tuple[tuple[str, ...], ...]:
        """The tentative sets without the dropped members."""
        return without(self.tentative or (), self.dropped)


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
        self._num_classes = num_classes
        self._volunteer_s = volunteer_s
        self._distributions_s = distributions_s
        self._agent_s = agent_s
        self._ctx = ctx
        self._round: _Round | None = None
        self._cap = cap
        self._cap_loaded = False

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
        self._load_cap(request.round)
        self._round = _Round(
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
        self._load_cap(request.round)
        work = self._restored(record, self._kept().round(request.round), request.now)
        work.k = request.k
        work.explicit = request.explicit_replies
        self._round = work
        if work.step is DubheStep.VOLUNTEERING and self._ranks.owed(request):
            work.step = DubheStep.RANKS
            self._ranks.send_pages(request.round, request.now, again=True)
        elif work.step is DubheStep.DISTRIBUTIONS:
            self._send_assignments(
                work, sorted(work.members() - set(work.distributions))
            )
        elif work.step is DubheStep.AGENT:
            self._send_try_sums(work)

    def select(self, request: SelectionRequest) -> Selection | None:
        """Run the open round's steps until one waits or the selection is made."""
        work = self._round
        if work is None or work.round != request.round:
            self.open_round(request)
            work = self._round
            assert work is not None
        steps: dict[DubheStep, Callable[[_Round, SelectionRequest], Selection | None]]
        steps = {
            DubheStep.RANKS: self._ranking,
            DubheStep.VOLUNTEERING: self._volunteering,
            DubheStep.DISTRIBUTIONS: self._distributions,
            DubheStep.AGENT: self._agent,
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

    def _ranking(self, work: _Round, request: SelectionRequest) -> Selection | None:
        if not self._ranks.complete:
            return self._ranks.waited(work.round, request)
        work.step = DubheStep.VOLUNTEERING
        work.deadline_at = request.now + self._volunteer_s
        self._ranks.finished()
        return None

    def _volunteering(
        self, work: _Round, request: SelectionRequest
    ) -> Selection | None:
        eligible = request.eligible  # kept per event: its size costs O(1)
        if work.explicit:  # every eligible device answers: wait for them all
            done = work.all_answered(eligible) and work.short_at != len(work.volunteers)
        else:  # silence means no: K volunteers per try are all it can know
            done = len(work.yes) == self._tries and min(work.yes) >= request.k
        if not (done or request.now >= work.deadline_at):
            return None
        volunteers = {  # one that sits out since it volunteered takes no place
            d: draws
            for d, draws in work.volunteers.items()
            if d not in request.excluded
        }
        if short_tries(volunteers, eligible, request.k):
            work.retries += 1  # wait longer each time: never a re-announce loop
            window = self._volunteer_s * min(2**work.retries, MAX_BACKOFF)
            logger.warning(
                "round %d: %d eligible devices online < K=%d; re-announcing, "
                "next try in %.0f s",
                work.round,
                len(eligible),
                request.k,
                window,
            )
            work.deadline_at = request.now + window
            work.short_at = len(work.volunteers)
            self._ctx.reannounce()
            return None
        logger.info(
            "round %d: %d answers (yes per try %s), %d eligible, %s",
            work.round,
            len(work.volunteers),
            work.yes,
            len(eligible),
            "explicit replies" if work.explicit else "silence means no",
        )
        tentative = make_tries(
            volunteers,
            eligible,
            request.k,
            self._tries,
            request.rng,
            self._held_back(work.round, eligible, request.k),
        )
        work.tentative = tentative
        self._kept().set_tries(work.round, tentative)
        if self._tries == 1:
            return Selection(tentative[0], 0)
        work.step = DubheStep.DISTRIBUTIONS
        work.deadline_at = request.now + self._distributions_s
        self._send_assignments(work, sorted(work.members()))
        return None

    def _distributions(
        self, work: _Round, request: SelectionRequest
    ) -> Selection | None:
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
            work.candidates = candidates
            self._kept().set_candidates(work.round, candidates)
            work.step = DubheStep.AGENT
            work.deadline_at = request.now + self._agent_s
            self._send_try_sums(work)
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

    def _agent(self, work: _Round, request: SelectionRequest) -> Selection | None:
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
        self, work: _Round, selection: Selection, request: SelectionRequest
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
        self, work: _Round, request: SelectionRequest
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
                work.candidates = candidates
                self._kept().set_candidates(work.round, candidates)
                work.deadline_at = request.now + self._agent_s
                self._send_try_sums(work)
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

    # --- sending --------------------------------------------------------------------

    def _send_assignments(self, work: _Round, devices: list[str]) -> None:
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

    def _send_try_sums(self, work: _Round) -> None:
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

    # --- handlers ---------------------------------------------------------------------

    def _open(self, message: BaseMessage, step: DubheStep) -> _Round:
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
        ctx = self._ctx
        epoch = ctx.epoch_view()
        if epoch is None or device not in epoch.registered:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not registered in key epoch {work.epoch}"
            )
        if len(message.draws) != self._tries:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"{len(message.draws)} draws for {self._tries} tries",
            )
        if not (work.explicit or any(message.draws)):
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"round {work.round}: silence means no; an all-no answer is not sent",
            )
        known = work.volunteers.get(device)
        if known == message.draws:  # a re-sent answer (a restart): counted once
            logger.info("duplicate volunteer of %s ignored", device)
            return
        if known is not None:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"round {work.round} is answered already, with other draws",
            )
        self._kept().add_volunteer(work.round, device, message.draws)
        work.volunteers[device] = message.draws
        work.count(message.draws)

    def _on_distribution(self, message: EncryptedDistribution) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._open(message, DubheStep.DISTRIBUTIONS)
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

    def _drop_malformed(self, work: _Round, device: str, reason: str) -> NoReturn:
        """Drop `device` from the round's tries (they go on without it); refuse."""
        work.dropped.add(device)
        logger.warning(
            "round %d: %s's distribution is malformed (%s); its tries go on without it",
            work.round,
            device,
            reason,
        )
        raise RejectedError(ErrorCode.BAD_CIPHERTEXT, reason)

    def _on_agent_answer(self, message: AgentAnswer) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._open(message, DubheStep.AGENT)
        epoch = self._ctx.epoch_view()
        if epoch is None or device != epoch.agent or epoch.agent_identity is None:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the epoch's agent answers"
            )
        try:
            verify_signature(
                epoch.agent_identity, signing_bytes(message), message.signature
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
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

    # --- the participation cap --------------------------------------------------------

    def _load_cap(self, round_index: int) -> None:
        """Once per start: the cap's counts from the store's last window of rounds."""
        cap = self._cap
        if cap is None or self._cap_loaded:
            return
        self._cap_loaded = True
        store = self._ctx.store
        first = max(1, round_index - cap.window + 1)
        stored = (store.round(r) for r in range(first, round_index))
        cap.restore(
            (r.round, r.selected) for r in stored if r is not None and r.selected
        )

    def _held_back(
        self, round_index: int, eligible: Set[str], k: int
    ) -> frozenset[str]:
        """Devices over the cap this round; none when the rest are fewer than K."""
        if self._cap is None:
            return frozenset()
        held = self._cap.capped(round_index)
        if not held:
            return held
        if len(eligible) - sum(1 for d in held if d in eligible) < k:
            logger.warning(
                "round %d: without the %d devices at the participation cap "
                "fewer than K=%d are eligible; the cap is lifted this round",
                round_index,
                len(held),
                k,
            )
            return frozenset()
        logger.info(
            "round %d: %d devices at the participation cap (%d of %d rounds) "
            "sit this round out",
            round_index,
            len(held),
            self._cap.limit,
            self._cap.window,
        )
        return held

    # --- plumbing ---------------------------------------------------------------------

    def _kept(self) -> DubheRecords:
        """Dubhe's records in the store the context holds (open from start)."""
        return DubheRecords(self._ctx.store)

    def _restored(self, round_: RoundRecord, record: DubheRound, now: float) -> _Round:
        """The round as the store has it, at the step its data says, fresh window."""
        if round_.selected is not None:
            step, window = DubheStep.SELECTED, 0.0
        elif record.tries is None:
            step, window = DubheStep.VOLUNTEERING, self._volunteer_s
        elif record.candidates is None:
            step, window = DubheStep.DISTRIBUTIONS, self._distributions_s
        else:
            step, window = DubheStep.AGENT, self._agent_s
        work = _Round(
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
