"""CLIMB dual steps over the wire, device side (SPEC §5; coordinator: climb_steps).

A device whose trainer has a `ClimbConfig` keeps its own dual variable
``lambda_i`` (0 at first, persisted in ``climb.json`` in its state
directory) and its current weight ``w_i`` (1 at first). Per dual step:

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

import json
import logging
import time
from dataclasses import dataclass

from ursa.crypto.paillier import encrypted_vector_from
from ursa.edge_sdk.climb import (
    apply_dual_means,
    decrypt_dual_means,
    encrypt_dual_report,
)
from ursa.edge_sdk.device_core import derived_id
from ursa.edge_sdk.model_steps import ModelSteps
from ursa.protocol.messages import ClimbStats, ClimbSum, DualStepRequest, ErrorReply
from ursa.protocol.router import NotReadyError

__all__ = ["CLIMB_STATE_FILE", "DUAL_WAIT_S", "ClimbSteps"]

logger = logging.getLogger("ursa.edge_sdk")

CLIMB_STATE_FILE = "climb.json"
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


class ClimbSteps(ModelSteps):
    """Dual steps of CLIMB on top of the model steps."""

    climb_lambda: float
    climb_weight: float
    _dual_request: DualStepRequest | None
    _report: _Report | None

    def _init_climb_steps(self) -> None:
        self.climb_lambda = 0.0
        self.climb_weight = 1.0
        self._dual_request = None
        self._report = None

    def _restore_climb(self) -> None:
        """Reload lambda_i and w_i from the state directory."""
        path = self._config.state_dir / CLIMB_STATE_FILE
        if not path.exists():
            return
        try:
            data = json.loads(path.read_text())
            self.climb_lambda = float(data["lambda"])
            self.climb_weight = float(data["weight"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "%s: %s unreadable (%s); lambda reset", self.device_id, path, exc
            )

    def _save_climb(self) -> None:
        path = self._config.state_dir / CLIMB_STATE_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(
            json.dumps({"lambda": self.climb_lambda, "weight": self.climb_weight})
        )
        tmp.replace(path)

    # --- hooks ----------------------------------------------------------------

    def _dual_pending(self, round_index: int) -> bool:
        report = self._report
        if report is None or report.round != round_index or report.done:
            return False
        return time.monotonic() - self._notice_at < DUAL_WAIT_S

    def _delta_scale(self) -> tuple[float, bool]:
        trainer = self._model_trainer()
        if trainer is None or trainer.climb is None:
            return 1.0, False
        return self.climb_weight, True

    def _on_model_ready(self) -> None:
        self._continue_dual()
        super()._on_model_ready()

    # --- handlers -------------------------------------------------------------

    def _on_dual_step_request(self, message: DualStepRequest) -> None:
        trainer = self._model_trainer()
        if trainer is None or trainer.climb is None:
            return
        self._require_epoch(message.epoch)
        if self._public_key is None or self._secret_key is None:
            raise NotReadyError
        report = self._report
        if report is not None and (report.epoch, report.round) == (
            message.epoch,
            message.round,
        ):
            if report.message is not None:
                self._send(report.message)  # a re-published request
            return
        self._dual_request = message
        self._continue_dual()

    def _continue_dual(self) -> None:
        """Report ``Enc([f_i, lambda_i])`` once the requested version is here."""
        request, trainer = self._dual_request, self._model_trainer()
        public_key = self._public_key
        if request is None or trainer is None or trainer.climb is None:
            return
        if public_key is None:
            return
        arrays = self._model_arrays_at(request.model_version)
        if arrays is None:
            return  # downloading; `_on_model_ready` calls back
        self._dual_request = None
        loss = trainer.local_loss(arrays)
        started = time.perf_counter()
        vector = encrypt_dual_report(
            public_key, trainer.climb, loss, self.climb_lambda, obfuscators=self._pool
        )
        self.stats.crypto_s += time.perf_counter() - started
        message = ClimbStats(
            federation=self._config.federation,
            round=request.round,
            sender=self.device_id,
            message_id=derived_id(
                self.device_id, "climb", request.epoch, request.round
            ),
            epoch=request.epoch,
            stats=vector.to_bytes(public_key),
        )
        self._report = _Report(
            request.round, request.epoch, loss, self.climb_lambda, message
        )
        self._send(message)

    def _on_climb_sum(self, message: ClimbSum) -> None:
        trainer = self._model_trainer()
        report = self._report
        if trainer is None or trainer.climb is None or report is None:
            return
        if (report.epoch, report.round) != (
            message.epoch,
            message.round,
        ) or report.done:
            return
        secret_key = self._secret_key
        if secret_key is None:
            raise NotReadyError
        started = time.perf_counter()
        vector = encrypted_vector_from(message.stats_sum, secret_key.public_key)
        if vector.num_parties != message.num_parties:
            raise ValueError("climb sum: party count differs from its header")
        means = decrypt_dual_means(secret_key, trainer.climb, vector)
        self.stats.crypto_s += time.perf_counter() - started
        step = apply_dual_means(report.lambda_, report.loss, means, trainer.climb)
        self.climb_weight, self.climb_lambda = step.weight, step.next_lambda
        report.done = True
        self.training_stats.dual_steps += 1
        self._save_climb()
        logger.info(
            "%s: dual step of round %d over %d devices: w=%.3f",
            self.device_id,
            message.round,
            means.num_parties,
            step.weight,
        )
        self._maybe_train()

    def _on_dual_refused(self, message: ErrorReply) -> None:
        """The coordinator refused our report: keep the weight, do not wait."""
        report = self._report
        sent = None if report is None else report.message
        if report is not None and sent is not None:
            if message.in_reply_to != sent.message_id:
                return
            report.done = True
            self._maybe_train()
