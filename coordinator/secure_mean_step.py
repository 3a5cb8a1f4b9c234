"""A before-training step that is one encrypted mean: asked, summed blind, saved.

CLIMB's dual step and federated evaluation have the same shape: in the
rounds that need one, ask every registered online device for a
`ursa.coordinator.secure_mean` of the step's purpose, sum the reports under
the key epoch's public key, send the sum, and then let the round train.
`SecureMeanStep` is that shape once; a step says only when it is due, what
its wire is (purpose, length, model), its deadline and its party bound, and
what to do once the sum went out (`closed`).

The step's gather is a phase record in the coordinator's store, saved in the
transaction of every report that changed it: `open` for the same round after
a restart resumes it (fresh deadline, the request or the sum sent again), so
a report already summed is not counted twice. A second report of a device is
ignored; a report with no open mean in its round is refused (``late``), as
are the refusals of `ursa.coordinator.secure_mean`. Reports reach the step
by their purpose (`ursa.protocol.router.Router`), so several such steps share
the `MeanReport` kind.
"""

from __future__ import annotations

import logging
from abc import abstractmethod

from ursa.coordinator.aggregation import UpdateOutcome
from ursa.coordinator.before_training import (
    BeforeTraining,
    RoundInfo,
    StepContext,
    StepPhase,
)
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather, save_gather
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_mean import MeanHead, MeanWire, offer_report, secure_mean
from ursa.protocol.messages import ErrorCode, MeanReport
from ursa.protocol.router import RejectedError, Router

__all__ = ["SecureMeanStep"]

logger = logging.getLogger("ursa.coordinator.secure_mean")


class SecureMeanStep(BeforeTraining):
    """One encrypted mean before the rounds that need it (see the module doc)."""

    def __init__(self, ctx: StepContext) -> None:
        super().__init__(ctx)
        self._round: int | None = None
        self._mean: Gather[MeanReport, EncryptedSum] | None = None
        self._head: MeanHead | None = None

    # --- what a step says ---------------------------------------------------------

    @property
    @abstractmethod
    def purpose(self) -> str:
        """The mean's purpose on the wire (its reports are routed by it)."""

    @abstractmethod
    def is_due(self, round_index: int) -> bool:
        """Whether round ``round_index`` starts with this mean."""

    def fleet_needs_model(self, round_index: int) -> bool:
        """When due: every online device reports at the round's model version."""
        return self.is_due(round_index)

    @abstractmethod
    def wire(self, info: RoundInfo) -> MeanWire | None:
        """The round's wire (None: the step cannot run in this round)."""

    @abstractmethod
    def timeout_s(self) -> float:
        """How long the step waits for reports."""

    @abstractmethod
    def max_parties(self) -> int:
        """The devices' codec bound on the parties of one sum."""

    def closed(self, head: MeanHead, mean: Gather[MeanReport, EncryptedSum]) -> None:
        """The mean closed (summed, or nobody reported): log it, note it."""

    # --- BeforeTraining -------------------------------------------------------------

    def register(self, router: Router) -> None:
        """The reports of this step's purpose are its own."""
        router.register(
            MeanReport, self._on_report, owner=self.name, purpose=self.purpose
        )

    def open(self, info: RoundInfo, now: float) -> StepPhase | None:
        """The round's mean if due: resumed from the store, else asked."""
        self._round, self._mean, self._head = info.round, None, None
        ctx = self.ctx
        if not self.is_due(info.round):
            return None
        epoch = ctx.view.epoch_view()
        if epoch is None or epoch.public_key is None:
            logger.warning("round %d: no epoch key; no %s", info.round, self.purpose)
            return None
        wire = self.wire(info)
        if wire is None:
            return None
        key = f"{self.purpose}/{info.model}/{info.round}"
        head = MeanHead(ctx.federation, info.round, epoch.epoch, info.version)
        self._head = head
        self._mean = secure_mean(
            wire,
            head,
            key=key,
            public_key=epoch.public_key,
            registered=epoch.registered,
            online=ctx.view.online_devices(),
            max_parties=self.max_parties(),
            now=now,
            timeout_s=self.timeout_s(),
            send=ctx.send,
            saved=ctx.view.store.phase(key),
        )
        self._changed(self._mean)
        return self._mean

    def on_tick(self, round_index: int, now: float) -> None:
        """Follow last wills; close the mean at its deadline."""
        mean = self._open_mean(round_index)
        if mean is None:
            return
        mean.track_online(self.ctx.view.online_devices(), self.ctx.send)
        if mean.poll(now, self.ctx.send) is not PhaseStatus.OPEN:
            self._changed(mean)  # no write on a quiet tick

    def is_done(self, round_index: int) -> bool:
        """Whether the round's mean is closed (or the round has none)."""
        return self._open_mean(round_index) is None

    def republish(self, round_index: int) -> None:
        """Ask again, or send the sum again (devices are idempotent)."""
        mean = self._mean
        if mean is not None and self._round == round_index:
            mean.republish(self.ctx.send)

    def extend_deadlines(self, seconds: float) -> None:
        """The open mean waits ``seconds`` longer (the broker was away)."""
        if self._mean is not None:
            self._mean.extend(seconds)

    def close(self, round_index: int) -> None:
        """Drop the round's mean record."""
        if self._round != round_index or self._mean is None:
            return
        self.ctx.view.store.drop_phase(self._mean.key)
        self._mean = None

    # --- reports ------------------------------------------------------------------

    def _on_report(self, message: MeanReport) -> None:
        mean = self._open_mean(message.round)
        if mean is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {message.round} has no open {self.purpose}"
            )
        device = message.sender
        try:
            outcome = offer_report(mean, message, self.ctx.send)
        except RejectedError:
            self._changed(mean)  # no longer waited for: the mean may have closed
            raise
        if outcome is UpdateOutcome.DUPLICATE:
            logger.info(
                "round %d: second %s report of %s ignored",
                message.round,
                self.purpose,
                device,
            )
            return
        self._changed(mean, device)

    def _open_mean(self, round_index: int) -> Gather[MeanReport, EncryptedSum] | None:
        mean = self._mean
        if mean is None or self._round != round_index or not mean.is_open:
            return None
        return mean

    def _changed(
        self, mean: Gather[MeanReport, EncryptedSum], replied: str | None = None
    ) -> None:
        """Save the mean in the message's transaction; tell the step once closed.

        ``replied``: the device whose report it was (saved as one row).
        """
        assert self._round is not None
        save_gather(self.ctx.view.store, mean, self._round, replied)
        if not mean.is_open and self._head is not None:
            self.closed(self._head, mean)
