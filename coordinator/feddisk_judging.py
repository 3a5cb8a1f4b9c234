"""FedDisk's loss step inside a round: request, blind sum, deadlines, the verdict.

Steps 2-4 of `ursa.coordinator.feddisk_plugin` (whose docstring has the
protocol) as the base class of `FeddiskPlugin`, so the plugin reads as the
phase machine (MADE round, judgement, switch) and this as one judgement:
open or resume the `MadeLossStep` of the latest MADE version, take reports,
send the sum when all registered online devices reported or at
``loss_timeout_s``, then take the agent's verdict until
``verdict_timeout_s``. What the verdict means is the plugin's `_decide`.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from typing import TYPE_CHECKING

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.clock import Clock
from ursa.coordinator.feddisk_state import FeddiskState, Role
from ursa.coordinator.feddisk_steps import DualStepError, MadeLossStep
from ursa.coordinator.plugin import CoordinatorView, RoundPlugin, Send
from ursa.coordinator.training import TrainingPlugin
from ursa.protocol.messages import ErrorCode, MadeLoss, MadeVerdict
from ursa.protocol.router import RejectedError

if TYPE_CHECKING:
    from ursa.coordinator.feddisk_plugin import FeddiskConfig

__all__ = ["FeddiskJudging"]

logger = logging.getLogger("ursa.coordinator.feddisk")


class FeddiskJudging(RoundPlugin):
    """The loss step and verdict wait of FedDisk's rounds (`FeddiskPlugin`'s base).

    The subclass sets the attributes and decides after each judgement.
    """

    config: FeddiskConfig
    _federation: str
    _made: TrainingPlugin
    _clock: Clock
    _state: FeddiskState
    _view: CoordinatorView | None
    _step: MadeLossStep | None
    _deadline_at: float

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
        step = self._open_step(round_index)
        if step is None:
            return False
        if not step.sent_sum:
            if step.is_complete(self._online()) or now >= self._deadline_at:
                self._close_loss(step, now, send)
        elif now >= self._deadline_at:
            logger.warning(
                "round %d: no verdict on %s version %d from the agent; training on",
                round_index,
                step.model,
                step.model_version,
            )
            self._decide(round_index, None, send)
        return True

    def _open_step(self, round_index: int) -> MadeLossStep | None:
        step = self._step
        if (
            step is None
            or step.round != round_index
            or self._state.switch_round is not None
        ):
            return None
        return step

    def _open_loss(self, round_index: int, version: int, send: Send) -> None:
        epoch = None if self._view is None else self._view.epoch_view()
        if epoch is None or epoch.public_key is None:
            logger.warning(
                "round %d: no key epoch; %s version %d is not judged",
                round_index,
                self.config.made_model,
                version,
            )
            self._state.judged_version = version
            self._decide(round_index, None, send)
            return
        step = MadeLossStep.resume_or_open(
            round_index,
            epoch,
            self.config.made_model,
            version,
            self._state.loss_step,
            max_parties=self.config.max_parties,
        )
        self._step = step
        self._state.enter(round_index, Role.LOSS, step.to_record())
        self._publish_made(round_index, send)
        now = self._clock()
        if step.sent_sum:  # a restart while waiting for the verdict
            result = step.result(self._federation)
            if result is not None:
                send(result, None)
            self._deadline_at = now + self.config.verdict_timeout_s
            return
        self._deadline_at = now + self.config.loss_timeout_s
        send(step.request(self._federation), None)
        if step.is_complete(self._online()):
            self._close_loss(step, now, send)

    def _on_loss(self, round_index: int, message: MadeLoss, send: Send) -> None:
        step = self._open_step(round_index)
        if step is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {round_index} has no open MADE loss step"
            )
        try:
            outcome = step.add(message.sender, message)
        except DualStepError as exc:
            raise RejectedError(exc.code, str(exc)) from None
        if outcome is UpdateOutcome.DUPLICATE:
            logger.info(
                "round %d: second loss report of %s ignored",
                round_index,
                message.sender,
            )
            return
        self._state.save_step(step.to_record())
        if step.is_complete(self._online()):
            self._close_loss(step, self._clock(), send)

    def _close_loss(self, step: MadeLossStep, now: float, send: Send) -> None:
        result = step.result(self._federation)
        step.mark_sent()
        if result is None:
            logger.warning(
                "round %d: no loss report on %s version %d; training on",
                step.round,
                step.model,
                step.model_version,
            )
            self._decide(step.round, None, send)
            return
        self._state.save_step(step.to_record())
        self._deadline_at = now + self.config.verdict_timeout_s
        send(result, None)
        logger.info(
            "round %d: summed %d loss reports on %s version %d",
            step.round,
            result.num_parties,
            step.model,
            step.model_version,
        )

    def _on_verdict(self, round_index: int, message: MadeVerdict, send: Send) -> None:
        step = self._open_step(round_index)
        if step is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {round_index} awaits no MADE verdict"
            )
        epoch = None if self._view is None else self._view.epoch_view()
        try:
            step.check_verdict(message, epoch)
        except DualStepError as exc:
            raise RejectedError(exc.code, str(exc)) from None
        logger.info(
            "round %d: agent's verdict on %s version %d: stop=%s, best %d",
            round_index,
            step.model,
            step.model_version,
            message.stop,
            message.best_version,
        )
        self._decide(round_index, message, send)

    def _publish_made(self, round_index: int, send: Send) -> None:
        """Send the latest MADE version to all: they judge it before it trains."""
        self._made.publish_latest(round_index, send)

    def _online(self) -> frozenset[str]:
        return frozenset() if self._view is None else self._view.online_devices()
