"""FedDisk's loss step inside a round: the blind loss mean, then the verdict.

Steps 2-4 of `ursa.coordinator.methods.feddisk.plugin` (whose docstring has the
protocol) as the base class of `FeddiskPlugin`, so the plugin reads as the
phase machine (MADE round, judgement, switch) and this as one judgement: a
`ursa.coordinator.secure_mean` of the latest MADE version's loss
(``loss_timeout_s``), then a `ursa.coordinator.wait.Wait` for the agent's
signed verdict (``verdict_timeout_s``; none: train on). Both are phase
records in the coordinator's store, saved in the transaction of the message
that changed them, so a restart resumes either with a fresh deadline. What
the verdict means is the plugin's `_decide`.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Set

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.clock import Clock
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather, save_gather
from ursa.coordinator.methods.feddisk.made_loss import (
    check_verdict,
    loss_step_key,
    made_loss_wire,
    verdict_key,
)
from ursa.coordinator.methods.feddisk.state import FeddiskRoundKind, FeddiskState
from ursa.coordinator.methods_config import FeddiskSpec
from ursa.coordinator.phase import PhaseRecordError, PhaseStatus
from ursa.coordinator.plugin import CoordinatorView, RoundPlugin, Send
from ursa.coordinator.secure_mean import MeanHead, offer_report, secure_mean
from ursa.coordinator.training import TrainingPlugin
from ursa.coordinator.wait import Wait
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import ErrorCode, MadeVerdict, MeanReport
from ursa.protocol.router import RejectedError

__all__ = ["FeddiskJudging"]

logger = logging.getLogger("ursa.coordinator.feddisk")


class FeddiskJudging(RoundPlugin):
    """The loss step and verdict wait of FedDisk's rounds (`FeddiskPlugin`'s base).

    The subclass sets the attributes and decides after each judgement.
    """

    config: FeddiskSpec
    _federation: str
    _made: TrainingPlugin
    _clock: Clock
    _view: CoordinatorView
    _head: MeanHead | None
    """What the open judgement is about (round, epoch, MADE version)."""
    _agent: str
    """The key epoch's agent, whose verdict the judgement waits for."""
    _loss: Gather[MeanReport, EncryptedSum] | None
    _verdict: Wait[MadeVerdict] | None

    @property
    @abstractmethod
    def _state(self) -> FeddiskState:
        """FedDisk's saved progress (read from the store, open before any round)."""

    @abstractmethod
    def _decide(
        self, round_index: int, verdict: MadeVerdict | None, send: Send
    ) -> None:
        """After a judgement (or none): switch, or another MADE round."""

    def _tick_loss(self, round_index: int, now: float, send: Send) -> bool:
        """Close the loss step or the verdict wait at their deadlines.

        Returns:
            Whether the round has an open loss step (else the tick is not ours).
        """
        loss = self._open_loss_of(round_index)
        if loss is None:
            return False
        if loss.is_open:
            loss.track_online(self._online(), send)
            if loss.poll(now, send) is not PhaseStatus.OPEN:
                self._after_loss_event(loss, now, send)  # no write on a quiet tick
        elif self._verdict is not None and self._verdict.poll(now) is (
            PhaseStatus.FALLBACK
        ):
            assert self._head is not None
            logger.warning(
                "round %d: no verdict on %s version %d from the agent; training on",
                round_index,
                self.config.made_model,
                self._head.version,
            )
            self._decide(round_index, None, send)
        return True

    def _open_loss_of(
        self, round_index: int
    ) -> Gather[MeanReport, EncryptedSum] | None:
        head = self._head
        if head is None or head.round != round_index:
            return None
        if self._state.switch_round is not None:
            return None
        return self._loss

    def _open_loss(self, round_index: int, version: int, send: Send) -> None:
        """Ask for the loss of MADE ``version`` (or resume the saved step)."""
        epoch = self._view.epoch_view()
        if epoch is None or epoch.public_key is None or epoch.agent is None:
            logger.warning(
                "round %d: no key epoch; %s version %d is not judged",
                round_index,
                self.config.made_model,
                version,
            )
            self._state.judged_version = version
            self._decide(round_index, None, send)
            return
        head = MeanHead(self._federation, round_index, epoch.epoch, version)
        self._head, self._agent = head, epoch.agent
        self._state.enter(round_index, FeddiskRoundKind.LOSS)
        self._publish_made(round_index, send)
        now = self._clock()
        model = self.config.made_model
        key = loss_step_key(model, round_index)
        self._loss = secure_mean(
            made_loss_wire(model),
            head,
            key=key,
            public_key=epoch.public_key,
            registered=epoch.registered,
            online=self._online(),
            max_parties=self.config.max_parties,
            now=now,
            timeout_s=self.config.loss_timeout_s,
            send=send,
            saved=self._view.store.phase(key),
        )
        self._verdict = None
        saved = self._view.store.phase(verdict_key(model, round_index))
        if saved is not None and not self._loss.is_open:  # waiting for it
            try:
                self._verdict = Wait.from_record(saved, MadeVerdict)
            except (KeyError, PhaseRecordError, ProtocolError, TypeError, ValueError):
                logger.exception("round %d: saved verdict wait unusable", round_index)
            else:
                self._verdict.restarted(now)
        self._after_loss_event(self._loss, now, send)

    def _on_loss(self, round_index: int, message: MeanReport, send: Send) -> None:
        loss = self._open_loss_of(round_index)
        if loss is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {round_index} has no open MADE loss step"
            )
        try:
            outcome = offer_report(loss, message, send)
        except RejectedError:
            self._after_loss_event(loss, self._clock(), send)  # it may have closed
            raise
        if outcome is UpdateOutcome.DUPLICATE:
            logger.info(
                "round %d: second loss report of %s ignored",
                round_index,
                message.sender,
            )
            return
        self._after_loss_event(loss, self._clock(), send, message.sender)

    def _after_loss_event(
        self,
        loss: Gather[MeanReport, EncryptedSum],
        now: float,
        send: Send,
        replied: str | None = None,
    ) -> None:
        """Save the loss step; once closed, wait for the verdict (or train on).

        ``replied``: the device whose report it was (saved as one row).
        """
        head = self._head
        assert head is not None
        store = self._view.store
        save_gather(store, loss, head.round, replied)
        if loss.is_open:
            return
        if loss.status is PhaseStatus.FALLBACK:
            logger.warning(
                "round %d: no loss report on %s version %d; training on",
                head.round,
                self.config.made_model,
                head.version,
            )
            self._decide(head.round, None, send)
            return
        if self._verdict is not None:
            return
        logger.info(
            "round %d: summed %d loss reports on %s version %d",
            head.round,
            len(loss.answered),
            self.config.made_model,
            head.version,
        )
        self._verdict = Wait.open(
            verdict_key(self.config.made_model, head.round),
            self._agent,
            now=now,
            timeout_s=self.config.verdict_timeout_s,
        )
        store.save_phase(self._verdict.key, head.round, self._verdict.to_record())

    def _on_verdict(self, round_index: int, message: MadeVerdict, send: Send) -> None:
        if self._open_loss_of(round_index) is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {round_index} awaits no MADE verdict"
            )
        wait, head = self._verdict, self._head
        if wait is None or head is None:
            raise RejectedError(ErrorCode.LATE, "the loss sum has not been sent")
        epoch = self._view.epoch_view()
        wait.offer(message.sender, message, lambda m: check_verdict(m, epoch, head))
        logger.info(
            "round %d: agent's verdict on %s version %d: stop=%s, best %d",
            round_index,
            self.config.made_model,
            head.version,
            message.stop,
            message.best_version,
        )
        self._decide(round_index, message, send)

    def _end_judging(self) -> int | None:
        """Forget the judgement's phases; the MADE version it judged, if any."""
        head, self._head = self._head, None
        self._loss, self._verdict = None, None
        if head is None:
            return None
        model = self.config.made_model
        self._view.store.drop_phase(loss_step_key(model, head.round))
        self._view.store.drop_phase(verdict_key(model, head.round))
        return head.version

    def _publish_made(self, round_index: int, send: Send) -> None:
        """Send the latest MADE version to all: they judge it before it trains."""
        self._made.publish_latest(round_index, send)

    def _online(self) -> Set[str]:
        return self._view.online_devices()
