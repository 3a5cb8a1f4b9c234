"""CLIMB's dual steps, device side (SPEC §5; coordinator: ``coordinator/climb_steps``).

A device running `Climb` keeps its own dual variable ``lambda_i`` (0 at
first) and its current weight ``w_i`` (1 at first), both persisted as the
method's state in the device's state directory. Per dual step:

1. `DualStepRequest(round, key epoch, version)`: the device fetches that
   global version if needed, evaluates ``f_i`` there (`ModelTrainer.local_loss`,
   nats per sample), and sends `ClimbStats` = ``Enc([f_i, lambda_i])``, one
   packed fixed-point Paillier vector under the epoch key (pooled
   obfuscators). Its message id derives from (device, epoch, round), and a
   repeated request re-sends the same report.
2. `ClimbSum(round, epoch, Enc(sum), num_parties)`: the device decrypts the
   reporters' ``mean f`` and ``mean lambda`` with the epoch's secret key and
   applies `ursa.edge_sdk.climb.apply_dual_means`: ``w_i = 1 + lambda_i -
   mean lambda`` for this round's delta, then ``lambda_i <- clip(lambda_i +
   eta_D (f_i - mean f - eps), 0, lambda_max)``.
3. If the device is selected in that round, it trains only after step 2
   (or `DUAL_WAIT_S` after the round's `ModelAvailable`, if the sum never
   comes: then with its previous weight) and scales its delta by ``w_i``.

Neither ``f_i`` nor ``lambda_i`` leaves the device unencrypted, and the
coordinator cannot decrypt (it never holds an epoch secret key). Limit: a
`ClimbSum` does not list its reporters, so a device whose report arrived
after the coordinator closed the step still applies the means (its own
values were not in them); the coordinator refuses such a late report with
an `ErrorReply`, and the device then keeps its weight.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar

from ursa.crypto.paillier import encrypted_vector_from
from ursa.edge_sdk.climb import (
    ClimbConfig,
    apply_dual_means,
    decrypt_dual_means,
    encrypt_dual_report,
)
from ursa.edge_sdk.device_core import derived_id
from ursa.edge_sdk.method import DeviceMethod, TrainPlan, model_trainer
from ursa.protocol.messages import ClimbStats, ClimbSum, DualStepRequest, ErrorReply
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import NotReadyError, Router

__all__ = ["DUAL_WAIT_S", "Climb"]

logger = logging.getLogger("ursa.edge_sdk")

DUAL_WAIT_S = 10.0
"""How long a selected device waits for the round's ClimbSum after its notice."""


@dataclass
class _Report:
    round: int
    epoch: int
    loss: float
    lambda_: float
    message: ClimbStats | None = None
    done: bool = False


class Climb(DeviceMethod):
    """CLIMB's device half: report ``Enc([f_i, lambda_i])``, apply the means."""

    name: ClassVar[str] = "climb"
    role: ClassVar[MethodRole | None] = MethodRole.TRAINING

    def __init__(self, config: ClimbConfig) -> None:
        self.config = config
        self.lam = 0.0
        """``lambda_i``, this device's dual variable."""
        self.weight = 1.0
        """``w_i``, the scale of this device's next delta."""
        self._request: DualStepRequest | None = None
        self._report: _Report | None = None

    def register(self, router: Router) -> None:
        """Handle dual step requests and sums."""
        router.register(DualStepRequest, self._on_dual_step_request, owner=self.name)
        router.register(ClimbSum, self._on_climb_sum, owner=self.name)

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

    def on_model_ready(self) -> None:
        """A requested version may have arrived: report on it."""
        self._continue()

    def on_error_reply(self, message: ErrorReply) -> None:
        """The coordinator refused our report: keep the weight, do not wait."""
        report = self._report
        sent = None if report is None else report.message
        if report is None or sent is None or message.in_reply_to != sent.message_id:
            return
        report.done = True
        self.ctx.retry_training()

    # --- handlers -------------------------------------------------------------

    def _on_dual_step_request(self, message: DualStepRequest) -> None:
        ctx = self.ctx
        if model_trainer(ctx) is None:
            return
        keys = ctx.keys(message.epoch)
        if keys.secret_key is None:
            raise NotReadyError
        report = self._report
        if report is not None and (report.epoch, report.round) == (
            message.epoch,
            message.round,
        ):
            if report.message is not None:
                ctx.send(report.message)  # a re-published request
            return
        self._request = message
        self._continue()

    def _continue(self) -> None:
        """Report ``Enc([f_i, lambda_i])`` once the requested version is here."""
        ctx, request = self.ctx, self._request
        trainer, keys = model_trainer(ctx), ctx.current_keys()
        if request is None or trainer is None or keys is None:
            return
        arrays = ctx.model_arrays_at(request.model_version)
        if arrays is None:
            return  # downloading; `on_model_ready` calls back
        self._request = None
        loss = trainer.local_loss(arrays)
        started = time.perf_counter()
        vector = encrypt_dual_report(
            keys.public_key, self.config, loss, self.lam, obfuscators=keys.pool
        )
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        message = ClimbStats(
            federation=ctx.federation,
            round=request.round,
            sender=me,
            message_id=derived_id(me, "climb", request.epoch, request.round),
            epoch=request.epoch,
            stats=vector.to_bytes(keys.public_key),
        )
        self._report = _Report(request.round, request.epoch, loss, self.lam, message)
        ctx.send(message)

    def _on_climb_sum(self, message: ClimbSum) -> None:
        ctx, report = self.ctx, self._report
        if report is None or report.done:
            return
        if (report.epoch, report.round) != (message.epoch, message.round):
            return
        keys = ctx.current_keys()
        secret_key = None if keys is None else keys.secret_key
        if secret_key is None:
            raise NotReadyError
        started = time.perf_counter()
        vector = encrypted_vector_from(message.stats_sum, secret_key.public_key)
        if vector.num_parties != message.num_parties:
            raise ValueError("climb sum: party count differs from its header")
        means = decrypt_dual_means(secret_key, self.config, vector)
        ctx.stats.crypto_s += time.perf_counter() - started
        step = apply_dual_means(report.lambda_, report.loss, means, self.config)
        self.weight, self.lam = step.weight, step.next_lambda
        report.done = True
        ctx.training_stats.dual_steps += 1
        self._save()
        logger.info(
            "%s: dual step of round %d over %d devices: w=%.3f",
            ctx.device_id,
            message.round,
            means.num_parties,
            step.weight,
        )
        ctx.retry_training()
