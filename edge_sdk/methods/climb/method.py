"""CLIMB's dual steps, device side (docs/methods.md; coordinator: ``methods/climb``).

A device running `Climb` keeps its own dual variable ``lambda_i`` (0 at
first) and its current weight ``w_i`` (1 at first), both persisted as the
method's state in the device's state directory. A dual step is an encrypted
mean of purpose ``climb.dual`` (`ursa.edge_sdk.secure_mean` encrypts,
reports and decrypts; `Climb` is its `MeanParticipant`):

1. `MeanRequest(climb.dual, round, key epoch, version)`: the device fetches
   that global version if needed, evaluates ``f_i`` there
   (`ModelTrainer.local_loss`, nats per sample), and its values are
   ``[f_i, lambda_i]`` (`ursa.edge_sdk.methods.climb.dual.report_values`), reported as
   one packed fixed-point Paillier vector under the epoch key.
2. The `MeanSum`: the runtime decrypts the totals; the device takes the
   reporters' ``mean f`` and ``mean lambda`` and applies
   `ursa.edge_sdk.methods.climb.dual.apply_dual_means`: ``w_i = clip(1 + lambda_i - mean
   lambda, 0, 1 + lambda_max)`` for this round's delta, then ``lambda_i <-
   clip(lambda_i + eta_D (f_i - mean f - eps), 0, lambda_max)``. A sum no
   honest fleet of its parties could produce (a mean beyond ``[0, loss_bound]``
   or ``[0, lambda_max]``, `ursa.edge_sdk.methods.climb.dual.dual_means`) is refused by
   the    runtime (an ERROR log line and a ``mean_refused`` reply): the device keeps
   its weight and lambda, as for a sum that never came.
3. If the device is selected in that round, it trains only after step 2
   (or `DUAL_WAIT_S` after the round's `ModelAvailable`, if the sum never
   comes: then with its previous weight) and scales its delta by ``w_i``.

Neither ``f_i`` nor ``lambda_i`` leaves the device unencrypted, and the
coordinator cannot decrypt (it never holds an epoch secret key). Limit: a
sum does not list its reporters, so a device whose report arrived after the
coordinator closed the step still applies the means (its own values were
not in them); the coordinator refuses such a late report with an
`ErrorReply`, and the device then keeps its weight.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from ursa.edge_sdk.method import DeviceContext, DeviceMethod, TrainPlan, model_trainer
from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    apply_dual_means,
    dual_means,
    report_values,
)
from ursa.edge_sdk.secure_mean import FloatVector, MeanCodec, MeanParticipant
from ursa.protocol.messages import CLIMB_DUAL, CLIMB_DUAL_LENGTH, MeanRequest, MeanSum
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Router

__all__ = ["DUAL_WAIT_S", "Climb"]

logger = logging.getLogger("ursa.edge_sdk")

DUAL_WAIT_S = 10.0
"""How long a selected device waits for the round's dual sum after its notice."""


@dataclass
class _Report:
    round: int
    epoch: int
    loss: float
    lambda_: float
    done: bool = False


class Climb(DeviceMethod, MeanParticipant):
    """CLIMB's device half: report ``Enc([f_i, lambda_i])``, apply the means."""

    name: ClassVar[str] = "climb"
    role: ClassVar[MethodRole | None] = MethodRole.TRAINING
    purpose: ClassVar[str] = CLIMB_DUAL

    def __init__(self, ctx: DeviceContext, config: ClimbConfig) -> None:
        self.ctx = ctx
        """The device this method runs on."""
        self.config = config
        self.lam = 0.0
        """``lambda_i``, this device's dual variable."""
        self.weight = 1.0
        """``w_i``, the scale of this device's next delta."""
        self._report: _Report | None = None

    def register(self, router: Router) -> None:
        """No kinds of its own: the dual step is the runtime's secure mean."""

    def start(self) -> None:
        """Reload lambda_i and w_i."""
        ctx = self.ctx
        try:
            data = ctx.store.method_state(self.name)
            if data is None:
                return
            self.lam = float(data["lambda"])
            self.weight = float(data["weight"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "%s: CLIMB state unreadable (%s); lambda reset", ctx.device_id, exc
            )

    def new_run(self) -> None:
        """A new run starts from lambda_i = 0 and w_i = 1."""
        self.lam, self.weight, self._report = 0.0, 1.0, None

    def _save(self) -> None:
        self.ctx.store.save_method_state(
            self.name, {"lambda": self.lam, "weight": self.weight}
        )

    # --- hooks ----------------------------------------------------------------

    def ready_to_train(self, round_index: int) -> bool:
        """Wait for this round's dual step, at most `DUAL_WAIT_S` after its notice."""
        report = self._report
        if report is None or report.round != round_index or report.done:
            return True
        return self.ctx.seconds_since_model_notice() >= DUAL_WAIT_S

    def plan(self, plan: TrainPlan) -> TrainPlan:
        """Scale the delta by ``w_i``."""
        return TrainPlan(plan.round, delta_scale=self.weight, scaled=True)

    # --- the dual step (a secure mean) -----------------------------------------

    def mean_codec(self) -> MeanCodec:
        """``[f_i, lambda_i]`` in the config's fixed point."""
        config = self.config
        return MeanCodec(
            config.codec(),
            config.max_parties,
            CLIMB_DUAL_LENGTH,
            config.honest_range(),
        )

    def takes_part(self, request: MeanRequest) -> bool:
        """Every device that evaluates models reports."""
        return model_trainer(self.ctx) is not None

    def mean_values(self, request: MeanRequest) -> FloatVector | None:
        """``[f_i, lambda_i]`` at the requested version (None: downloading)."""
        trainer = model_trainer(self.ctx)
        if trainer is None:
            return None
        arrays = self.ctx.model_arrays_at(request.model_version)
        if arrays is None:
            return None  # the runtime asks again on `on_model_ready`
        loss = trainer.local_loss(arrays)
        values = report_values(loss, self.lam, self.config)
        self._report = _Report(request.round, request.epoch, loss, self.lam)
        return values

    def on_refused(self, request: MeanRequest) -> None:
        """Our report or the sum was refused: keep weight and lambda, do not wait."""
        report = self._report
        if report is None or (report.epoch, report.round) != (
            request.epoch,
            request.round,
        ):
            return
        report.done = True
        self.ctx.retry_training()

    def on_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """Apply the reporters' means: ``w_i`` now, ``lambda_i`` next."""
        ctx, report = self.ctx, self._report
        if report is None or report.done:
            return
        if (report.epoch, report.round) != (result.epoch, result.round):
            return
        parties = result.num_parties
        means = dual_means(totals, parties, self.config)  # checked by the runtime
        step = apply_dual_means(report.lambda_, report.loss, means, self.config)
        self.weight, self.lam = step.weight, step.next_lambda
        report.done = True
        ctx.training_stats.dual_steps += 1
        self._save()
        logger.info(
            "%s: dual step of round %d over %d devices: w=%.3f",
            ctx.device_id,
            result.round,
            parties,
            step.weight,
        )
        ctx.retry_training()
