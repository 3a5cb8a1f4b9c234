"""CLIMB's coordinator half: the dual step before a round trains (SPEC §5, Alg. 1).

`ClimbDualStep` is a `ursa.coordinator.before_training.BeforeTraining` step:
in rounds 1, 1 + ``dual_period``, ... it runs CLIMB's dual step as a
`ursa.coordinator.secure_mean` of purpose ``climb.dual`` (`dual_wire`)::

    coordinator -> MeanRequest(climb.dual, round, key epoch, model, version) -> all
    device      -> MeanReport(Enc([f_i, lambda_i]))    (every registered device)
    [every registered online device reported, or dual_timeout_s]
    coordinator -> MeanSum(Enc(sum), num_parties) -> all

and then the round trains. Devices scale their deltas by their own weight
``w_i`` (`ursa.edge_sdk.methods.climb`), so the round averages them equally
and never rescales (`Weighting.CLIMB`): the coordinator never learns a loss,
a dual variable or a weight.

The step's gather is a phase record in the coordinator's store, saved in the
transaction of every report that changed it: `open` for the same round after
a restart resumes it (fresh deadline, the request or the sum sent again),
so a report already summed is not counted twice. A second report of a device
is ignored; a report with no open dual step in its round is refused
(``late``), as are the refusals of `ursa.coordinator.secure_mean`.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from ursa.coordinator.aggregation import UpdateOutcome, Weighting
from ursa.coordinator.before_training import (
    BeforeTraining,
    RoundInfo,
    StepContext,
    StepPhase,
)
from ursa.coordinator.encrypted_sum import EncryptedSum
from ursa.coordinator.gather import Gather
from ursa.coordinator.methods.climb.wire import dual_step_key, dual_wire
from ursa.coordinator.methods_config import ClimbSpec
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.secure_mean import MeanHead, secure_mean
from ursa.protocol.messages import ErrorCode, MeanReport, ModelUpdate
from ursa.protocol.router import RejectedError, Router

__all__ = ["ClimbDualStep"]

logger = logging.getLogger("ursa.coordinator.climb")


class ClimbDualStep(BeforeTraining):
    """CLIMB's encrypted dual step before the rounds that need one.

    Args:
        spec: The ``[[methods]]`` ``kind = "climb"`` table (timeout, period,
            the devices' codec bound on parties).
    """

    name: ClassVar[str] = "climb"
    weighting: ClassVar[Weighting | None] = Weighting.CLIMB

    def __init__(self, spec: ClimbSpec | None = None) -> None:
        self.spec = spec or ClimbSpec()
        self._ctx: StepContext | None = None
        self._round: int | None = None
        self._dual: Gather[MeanReport, EncryptedSum] | None = None

    # --- BeforeTraining ----------------------------------------------------------

    def register(self, router: Router) -> None:
        """The devices' dual reports are CLIMB's."""
        router.register(MeanReport, self._on_stats, owner=self.name)

    def attach(self, ctx: StepContext) -> None:
        """Keep the training plugin's context."""
        self._ctx = ctx

    def is_due(self, round_index: int) -> bool:
        """Whether round ``round_index`` starts with a dual step."""
        return (round_index - 1) % self.spec.dual_period == 0

    def open(self, info: RoundInfo, now: float) -> StepPhase | None:
        """The round's dual step if due: resumed from the store, else asked."""
        self._round, self._dual = info.round, None
        ctx = self._ctx
        if not self.is_due(info.round):
            return None
        epoch = None if ctx is None else ctx.view.epoch_view()
        if ctx is None or epoch is None or epoch.public_key is None:
            logger.warning("round %d: no epoch key; no dual step", info.round)
            return None
        key = dual_step_key(info.model, info.round)
        head = MeanHead(ctx.federation, info.round, epoch.epoch, info.version)
        self._dual = secure_mean(
            dual_wire(info.model),
            head,
            key=key,
            public_key=epoch.public_key,
            registered=epoch.registered,
            online=ctx.view.online_devices(),
            max_parties=self.spec.max_parties,
            now=now,
            timeout_s=self.spec.dual_timeout_s,
            send=ctx.send,
            saved=ctx.view.store.phase(key),
        )
        self._changed(self._dual)
        return self._dual

    def on_tick(self, round_index: int, now: float) -> None:
        """Follow last wills; close the dual step at its deadline."""
        dual = self._open_dual(round_index)
        if dual is None or self._ctx is None:
            return
        dual.track_online(self._ctx.view.online_devices(), self._ctx.send)
        if dual.poll(now, self._ctx.send) is not PhaseStatus.OPEN:
            self._changed(dual)  # no write on a quiet tick

    def is_done(self, round_index: int) -> bool:
        """Whether the round's dual step is closed (or the round has none)."""
        return self._open_dual(round_index) is None

    def republish(self, round_index: int) -> None:
        """Ask again, or send the sum again (devices are idempotent)."""
        dual = self._dual
        if dual is not None and self._ctx is not None and self._round == round_index:
            dual.republish(self._ctx.send)

    def close(self, round_index: int) -> None:
        """Drop the round's dual step record."""
        if self._round != round_index or self._dual is None:
            return
        if self._ctx is not None:
            self._ctx.view.store.drop_phase(self._dual.key)
        self._dual = None

    def on_update(self, round_index: int, device: str, message: ModelUpdate) -> None:
        """Note a device that did not scale its delta (it counts with w=1)."""
        if not message.delta_scaled:
            logger.info(
                "round %d: %s sent an unscaled delta (w=1)", round_index, device
            )

    # --- reports -------------------------------------------------------------------

    def _on_stats(self, message: MeanReport) -> None:
        dual = self._open_dual(message.round)
        if dual is None or self._ctx is None:
            raise RejectedError(
                ErrorCode.LATE, f"round {message.round} has no open dual step"
            )
        device = message.sender
        if dual.offer(device, message, self._ctx.send) is UpdateOutcome.DUPLICATE:
            logger.info(
                "round %d: second dual report of %s ignored", message.round, device
            )
            return
        self._changed(dual)

    def _open_dual(self, round_index: int) -> Gather[MeanReport, EncryptedSum] | None:
        dual = self._dual
        if dual is None or self._round != round_index or not dual.is_open:
            return None
        return dual

    def _changed(self, dual: Gather[MeanReport, EncryptedSum]) -> None:
        """Save the step in the message's transaction; log once it closed."""
        assert self._ctx is not None and self._round is not None
        self._ctx.view.store.save_phase(dual.key, self._round, dual.to_record())
        if dual.is_open:
            return
        if dual.status is PhaseStatus.FALLBACK:
            logger.warning("round %d: no dual report; weights unchanged", self._round)
        else:
            logger.info(
                "round %d: dual step summed %d reports",
                self._round,
                len(dual.answered),
            )
