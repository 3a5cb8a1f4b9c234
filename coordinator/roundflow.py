"""Round stages (Dubhe Fig. 3, 5): volunteers, tries, the agent's answer, training.

VOLUNTEERING: the retained `RoundAnnounce` asks every registered device for
its H draws; the stage closes when every online registrant answered or at
the deadline. With fewer than K responders the round is re-announced with a
fresh deadline (it never selects fewer than K). Per try, surplus volunteers
are trimmed and a shortfall topped up uniformly from the other responders.

DISTRIBUTIONS (H > 1): each member of some try gets a `TryAssignment` and
answers with its encrypted label distribution once; per try the coordinator
sums the members' ciphertexts. Tries with a silent member are not offered.

AGENT: the complete tries' sums go to the agent (`TrySums`), which answers the
index of the best one, signed. If the agent stays silent past the deadline,
or is offline, the coordinator falls back to the first complete try (try 0
when complete), logs it, and starts a new key epoch before the next round
(the agent holds the only answer the protocol trusts). With no complete try
it repairs try 0 from devices that did deliver, topped up to K.

TRAINING: the signed `SelectionResult` names exactly K devices; the
`RoundPlugin` runs until complete (or the training deadline), then the round
is marked complete in the store (once) and the next one opens.
"""

from __future__ import annotations

import logging

from ursa.coordinator.core import RoundWork, ServiceCore
from ursa.coordinator.rounds import (
    Stage,
    advance,
    complete_tries,
    fallback_selection,
    make_tries,
)
from ursa.coordinator.selection import SelectionError
from ursa.coordinator.selection_method import SelectionRequest
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.crypto.paillier import encrypted_vector_from, sum_encrypted
from ursa.protocol.envelope import encode, signing_bytes
from ursa.protocol.messages import (
    COORDINATOR,
    AgentAnswer,
    BaseMessage,
    EncryptedDistribution,
    ErrorCode,
    RoundAnnounce,
    SelectionResult,
    TryAssignment,
    TrySums,
    Volunteer,
)
from ursa.protocol.router import RejectedError

__all__ = ["RoundStages"]

logger = logging.getLogger("ursa.coordinator")


class RoundStages(ServiceCore):
    """VOLUNTEERING, DISTRIBUTIONS, AGENT and TRAINING."""

    def _start_round(self, now: float) -> None:
        """Open the next round, or rekey first, or finish."""
        cfg = self._config
        work = self._epoch
        if self._store.completed_rounds() >= cfg.rounds:
            self._advance(Stage.DONE, now, None)
            logger.info("all %d rounds complete", cfg.rounds)
            return
        assert work is not None, "a round needs a key epoch"
        agent_lost = cfg.tries > 1 and work.agent not in self._online
        epoch_full = (
            cfg.rounds_per_epoch > 0
            and self._store.rounds_in_epoch(work.epoch) >= cfg.rounds_per_epoch
        )
        if self._state.rekey or agent_lost or epoch_full:
            why = "agent offline" if agent_lost else "rekey"
            logger.info(
                "new key epoch before round %d (%s)", self._state.round + 1, why
            )
            self._start_key_epoch(now, frozenset({work.agent}))
            return
        index = self._state.round + 1
        payload = self._announce(index, work.epoch)
        self._store.add_round(index, work.epoch, payload)
        self._round = RoundWork(index, work.epoch, payload)
        first = Stage.VOLUNTEERING if self._selection is None else Stage.SELECTING
        self._set_state(
            advance(
                self._state,
                first,
                round=index,
                deadline_at=now + cfg.deadlines.volunteer_s,
            )
        )
        self._send_raw(payload, "round_announce", None)

    def _announce(self, index: int, epoch: int) -> bytes:
        cfg = self._config
        return encode(
            RoundAnnounce(
                federation=cfg.federation,
                round=index,
                sender=COORDINATOR,
                epoch=epoch,
                k=cfg.k,
                tries=cfg.tries,
                deadline_s=cfg.deadlines.volunteer_s,
            )
        )

    def _stage_volunteering(self, now: float) -> None:
        work, epoch = self._round, self._epoch
        if work is None or epoch is None:
            return
        expected = epoch.registered & self._online
        answered = set(work.volunteers)
        if not ((answered and expected <= answered) or self._deadline_passed(now)):
            return
        cfg = self._config
        try:
            tentative = make_tries(work.volunteers, cfg.k, cfg.tries, self._rng)
        except SelectionError:
            logger.warning(
                "round %d: %d responders < K=%d; re-announcing",
                work.round,
                len(answered),
                cfg.k,
            )
            work.announce = self._announce(work.round, work.epoch)
            self._store.set_announce(work.round, work.announce)
            self._advance(Stage.VOLUNTEERING, now, cfg.deadlines.volunteer_s)
            self._send_raw(work.announce, "round_announce", None)
            return
        work.tentative = tentative
        self._store.set_tries(work.round, tentative)
        if cfg.tries == 1:
            self._select(now, tentative[0], 0)
            return
        self._advance(Stage.DISTRIBUTIONS, now, cfg.deadlines.distributions_s)
        self._send_assignments(work, sorted(work.members()))

    def _stage_selecting(self, now: float) -> None:
        """Ask the federation's selection method (not Dubhe) for the round's K."""
        work, epoch, method = self._round, self._epoch, self._selection
        if work is None or epoch is None or method is None:
            return
        request = SelectionRequest(
            round=work.round,
            epoch=work.epoch,
            k=self._config.k,
            eligible=frozenset(epoch.registered & self._online),
            rng=self._rng,
        )
        selected = method.select(request)
        if selected is not None:
            self._select(now, _checked(selected, request, method.name), None)
        elif self._deadline_passed(now):
            logger.warning(
                "round %d: %s cannot select %d of %d eligible devices yet; "
                "asking again",
                work.round,
                method.name,
                request.k,
                len(request.eligible),
            )
            self._advance(Stage.SELECTING, now, self._config.deadlines.volunteer_s)

    def _send_assignments(self, work: RoundWork, devices: list[str]) -> None:
        for device in devices:
            indices = tuple(
                h for h, members in enumerate(work.tentative or ()) if device in members
            )
            message = TryAssignment(
                federation=self._config.federation,
                round=work.round,
                sender=COORDINATOR,
                try_indices=indices,
            )
            self._send(message, device)

    def _stage_distributions(self, now: float) -> None:
        work, epoch = self._round, self._epoch
        if work is None or epoch is None or work.tentative is None:
            return
        delivered = set(work.distributions)
        waiting = (work.members() & self._online) - delivered  # the dead never send
        if waiting and not self._deadline_passed(now):
            return
        candidates = complete_tries(work.tentative, delivered)
        if candidates and epoch.agent in self._online and epoch.public_key is not None:
            work.candidates = candidates
            self._store.set_candidates(work.round, candidates)
            self._advance(Stage.AGENT, now, self._config.deadlines.agent_s)
            self._send_try_sums(work)
            return
        alive = sorted(delivered | (set(work.volunteers) & self._online))
        try_index, selected = fallback_selection(
            work.tentative, candidates, alive, self._config.k, self._rng
        )
        logger.warning(
            "round %d: agent %s unavailable or no complete try; fallback to try %s",
            work.round,
            epoch.agent,
            try_index,
        )
        if epoch.agent not in self._online:
            self._mark_rekey()
        self._select(now, selected, try_index)

    def _send_try_sums(self, work: RoundWork) -> None:
        """Sum each candidate try's distributions and send the sums to the agent."""
        epoch = self._epoch
        if epoch is None or epoch.public_key is None or work.tentative is None:
            return
        public_key, tentative = epoch.public_key, work.tentative
        candidates = work.candidates or ()
        sums = tuple(
            sum_encrypted(
                public_key, (work.distributions[d] for d in tentative[h])
            ).to_bytes(public_key)
            for h in candidates
        )
        message = TrySums(
            federation=self._config.federation,
            round=work.round,
            sender=COORDINATOR,
            sums=sums,
            member_counts=tuple(len(tentative[h]) for h in candidates),
        )
        self._send(message, epoch.agent)

    def _stage_agent(self, now: float) -> None:
        work, epoch = self._round, self._epoch
        if work is None or work.tentative is None or epoch is None:
            return
        agent_gone = epoch.agent not in self._online
        if not (agent_gone or self._deadline_passed(now)):
            return
        candidates = work.candidates or (0,)
        logger.warning(
            "round %d: agent %s; fallback to try %d and a new key epoch before "
            "the next round",
            work.round,
            "offline" if agent_gone else "silent past the deadline",
            candidates[0],
        )
        self._mark_rekey()
        self._select(now, work.tentative[candidates[0]], candidates[0])

    def _select(
        self, now: float, selected: tuple[str, ...], try_index: int | None
    ) -> None:
        """Publish the signed selection and hand the round to the plugin."""
        work = self._round
        assert work is not None
        result = self._sign(
            SelectionResult(
                federation=self._config.federation,
                round=work.round,
                sender=COORDINATOR,
                selected=tuple(sorted(selected)),
                try_index=try_index,
            )
        )
        payload = encode(result)
        work.selected = tuple(sorted(selected))
        work.result = payload
        self._store.set_selection(work.round, work.selected, try_index, payload)
        self._advance(Stage.TRAINING, now, self._config.deadlines.training_s)
        logger.info(
            "round %d: selected %d devices (try %s)",
            work.round,
            len(selected),
            try_index,
        )
        self._send_raw(payload, "selection_result", None)
        self._plugin.on_selected(work.round, work.selected, self._send)

    def _stage_training(self, now: float) -> None:
        work = self._round
        if work is None:
            return
        self._plugin.on_tick(work.round, now, self._send)
        done = self._plugin.is_complete(work.round)
        if not done and not self._deadline_passed(now):
            return
        if not done:
            logger.warning("round %d: training deadline passed", work.round)
        if self._store.complete_round(work.round):
            logger.info("round %d complete", work.round)
        self._start_round(now)

    # --- handlers -------------------------------------------------------------

    def _open_round(self, message: BaseMessage, stage: Stage) -> RoundWork:
        work = self._round
        current = 0 if work is None else work.round
        if work is None or message.round > current:
            raise RejectedError(
                ErrorCode.WRONG_ROUND,
                f"round {message.round} is not open (current {current})",
            )
        if message.round < current:
            raise RejectedError(ErrorCode.LATE, f"round {message.round} is over")
        if self._state.stage is not stage:
            raise RejectedError(
                ErrorCode.LATE, f"round {current} is past {stage} ({self._state.stage})"
            )
        return work

    def _on_volunteer(self, message: Volunteer) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._open_round(message, Stage.VOLUNTEERING)
        epoch = self._epoch
        if epoch is None or device not in epoch.registered:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, f"not registered in key epoch {work.epoch}"
            )
        if len(message.draws) != self._config.tries:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"{len(message.draws)} draws for {self._config.tries} tries",
            )
        if device in work.volunteers:
            logger.info("duplicate volunteer of %s ignored", device)
            return
        self._store.add_volunteer(work.round, device, message.draws)
        work.volunteers[device] = message.draws

    def _on_distribution(self, message: EncryptedDistribution) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._open_round(message, Stage.DISTRIBUTIONS)
        epoch = self._epoch
        if device not in work.members() or epoch is None or epoch.public_key is None:
            raise RejectedError(ErrorCode.UNAUTHORISED, "not a member of any try")
        if device in work.distributions:
            logger.info("duplicate distribution of %s ignored", device)
            return
        try:
            vector = encrypted_vector_from(
                message.distribution, epoch.public_key, num_parties=1
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_CIPHERTEXT, str(exc)) from None
        if vector.length != self._config.registry.num_classes:
            raise RejectedError(
                ErrorCode.BAD_CIPHERTEXT,
                f"distribution has {vector.length} values, not "
                f"{self._config.registry.num_classes}",
            )
        self._store.add_distribution(work.round, device, message.distribution)
        work.distributions[device] = vector

    def _on_agent_answer(self, message: AgentAnswer) -> None:
        device = message.sender  # admission checked it is the topic's device
        work = self._open_round(message, Stage.AGENT)
        epoch = self._epoch
        if epoch is None or device != epoch.agent:
            raise RejectedError(
                ErrorCode.UNAUTHORISED, "only the epoch's agent answers"
            )
        try:
            verify_signature(
                self._enrolled[device], signing_bytes(message), message.signature
            )
        except CryptoError as exc:
            raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
        candidates = work.candidates or ()
        if not 0 <= message.best_try < len(candidates) or work.tentative is None:
            raise RejectedError(
                ErrorCode.MALFORMED,
                f"best_try {message.best_try} outside the {len(candidates)} sums",
            )
        h = candidates[message.best_try]
        self._select(self._clock(), work.tentative[h], h)


def _checked(
    selected: tuple[str, ...], request: SelectionRequest, method: str
) -> tuple[str, ...]:
    """A method's selection, refused unless it is K distinct eligible devices.

    Raises:
        SelectionError: a bug in the method (the tick logs it and retries).
    """
    chosen = set(selected)
    if len(chosen) != len(selected) or len(chosen) != request.k:
        raise SelectionError(f"{method} selected {len(chosen)} devices, not K")
    if not chosen <= request.eligible:
        raise SelectionError(f"{method} selected devices that are not eligible")
    return selected
