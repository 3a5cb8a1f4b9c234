"""FedDisk phase 1 over the wire, device side (SPEC §5; coordinator: feddisk_plugin).

A device whose trainer is a `PhasedTrainer` trains the global MADE in
ordinary rounds (model ``settings.made_model``) and, per MADE round:

1. `MadeLossRequest(round, epoch, model, version)`: it fetches that version
   if needed, measures the MADE's NLL on its validation split and sends
   `MadeLoss` = ``Enc([nll * n_val, n_val])`` under the epoch key (pooled
   obfuscators). The id derives from (device, epoch, round); a repeated
   request re-sends the same report.
2. `MadeLossSum(round, epoch, version)`: the device decrypts the fleet's
   sample-weighted mean NLL and applies it to its own `MadeStopper` (persisted
   in ``feddisk.json``; patience from the settings, no round cap: the
   coordinator owns it), keeping the best version's weights in
   ``feddisk_made.bin``. The epoch's agent then sends the signed
   `MadeVerdict` (stop bit and best version). Every device applies every sum,
   so whichever device is agent of a later epoch holds the same stopper.
   Limits: a device that missed a request or a sum (offline) has a stale
   stopper and would give a different verdict if it became agent; a device
   whose report came too late still applies the sum (as in CLIMB).
3. `FeddiskSwitch(made_version)` (retained; `ursa.edge_sdk.feddisk_switch`):
   the device takes the global MADE of that version (the kept best, else the
   one it holds, else its closest with a warning; it never downloads again),
   trains its local MADE and density-ratio classifier (`PhasedTrainer.switch`,
   on the delivery thread like training), persists the phase and its sample
   weights (``feddisk_weights.npy``) and forgets the MADE downloads, because
   the classifier's versions restart at 0. A second switch is ignored; a
   restarted device resumes phase 2 from its state directory.

While in phase 1 a `ModelAvailable` of another model is parked (retried
after the switch); classifier transfers seen before it are dropped and
re-requested later. Losses are logged at DEBUG only.
"""

from __future__ import annotations

import logging
import time

from ursa.crypto.paillier import encrypted_vector_from
from ursa.edge_sdk.device_core import derived_id
from ursa.edge_sdk.feddisk_state import write_made
from ursa.edge_sdk.feddisk_switch import FeddiskSwitchSteps, MadeReport
from ursa.edge_sdk.made_loss import decrypt_fleet_loss, encrypt_made_loss
from ursa.edge_sdk.made_stop import apply_validation_loss
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    MadeLoss,
    MadeLossRequest,
    MadeLossSum,
    MadeVerdict,
    ModelAvailable,
)
from ursa.protocol.router import NotReadyError

__all__ = ["FeddiskSteps"]

logger = logging.getLogger("ursa.edge_sdk")


class FeddiskSteps(FeddiskSwitchSteps):
    """FedDisk phase 1 (loss reports, stop rule, switch) on top of the model steps."""

    # --- hooks ----------------------------------------------------------------

    def _on_model_ready(self) -> None:
        self._continue_made()
        super()._on_model_ready()

    def _on_model_available(self, message: ModelAvailable) -> None:
        trainer = self._in_made_phase()
        if trainer is not None and message.model != trainer.model:
            raise NotReadyError  # phase 2's model: retried after the switch
        super()._on_model_available(message)

    # --- handlers -------------------------------------------------------------

    def _on_made_loss_request(self, message: MadeLossRequest) -> None:
        trainer = self._in_made_phase()
        if trainer is None or message.model != trainer.model:
            return
        self._require_epoch(message.epoch)
        if self._public_key is None:
            raise NotReadyError
        report = self._made_report
        if report is not None and (report.epoch, report.round) == (
            message.epoch,
            message.round,
        ):
            self._send(report.message)  # a re-published request
            return
        self._made_request = message
        self._continue_made()

    def _continue_made(self) -> None:
        """Report ``Enc([nll * n, n])`` once the requested version is here."""
        request, trainer = self._made_request, self._in_made_phase()
        public_key = self._public_key
        if request is None or trainer is None or public_key is None:
            return
        version = request.model_version
        report = self._made_report
        if report is not None and report.version == version:
            arrays: Arrays | None = report.arrays
        else:
            arrays = self._model_arrays_at(version)
        if arrays is None:
            if self._model_version is not None and self._model_version > version:
                self._made_request = None
                logger.warning(
                    "%s: MADE version %d asked for, but %d is already here",
                    self.device_id,
                    version,
                    self._model_version,
                )
            return  # downloading; `_on_model_ready` calls back
        self._made_request = None
        loss, num_examples = trainer.validation_loss(arrays)
        started = time.perf_counter()
        vector = encrypt_made_loss(
            public_key,
            trainer.settings.loss,
            loss,
            num_examples,
            obfuscators=self._pool,
        )
        self.stats.crypto_s += time.perf_counter() - started
        me = self.device_id
        message = MadeLoss(
            federation=self._config.federation,
            round=request.round,
            sender=me,
            message_id=derived_id(me, "made_loss", request.epoch, request.round),
            epoch=request.epoch,
            model_version=version,
            loss=vector.to_bytes(public_key),
        )
        self._made_report = MadeReport(
            request.epoch, request.round, version, arrays, message
        )
        self._send(message)
        logger.info("%s: MADE loss of version %d reported", me, version)

    def _on_made_loss_sum(self, message: MadeLossSum) -> None:
        trainer = self._in_made_phase()
        if trainer is None:
            return
        key = (message.epoch, message.round, message.model_version)
        if self._made_applied == key:
            self._send_made_verdict(*key)  # a re-published sum
            return
        report = self._made_report
        if report is None or (report.epoch, report.round, report.version) != key:
            return
        self._require_epoch(message.epoch)
        secret_key = self._secret_key
        if secret_key is None:
            raise NotReadyError
        if not self._made_stopper.stopped:
            started = time.perf_counter()
            vector = encrypted_vector_from(message.loss_sum, secret_key.public_key)
            if vector.num_parties != message.num_parties:
                raise ValueError("MADE loss sum: party count differs from its header")
            fleet = decrypt_fleet_loss(secret_key, trainer.settings.loss, vector)
            self.stats.crypto_s += time.perf_counter() - started
            self._made_stopper = apply_validation_loss(
                self._made_stopper, fleet.mean_nll
            )
            if self._made_stopper.improved:
                self._made_best = (report.version, report.arrays)
                write_made(self._state_dir(), report.arrays)
            logger.debug("%s: fleet MADE NLL %.4f", self.device_id, fleet.mean_nll)
            logger.info(
                "%s: MADE round %d over %d devices: stop=%s",
                self.device_id,
                message.round,
                fleet.num_parties,
                self._made_stopper.stopped,
            )
        self._made_applied = key
        self._save_feddisk("made")
        self._send_made_verdict(*key)

    def _send_made_verdict(self, epoch: int, round_index: int, version: int) -> None:
        """The agent's signed verdict for the sum of (epoch, round, version)."""
        if self._epoch is None or self._epoch.agent != self.device_id:
            return
        if self._epoch.epoch != epoch:
            return
        best = self._made_best
        me = self.device_id
        verdict = MadeVerdict(
            federation=self._config.federation,
            round=round_index,
            sender=me,
            message_id=derived_id(me, "made_verdict", epoch, round_index),
            epoch=epoch,
            model_version=version,
            stop=self._made_stopper.stopped,
            best_version=version if best is None else best[0],
        )
        self._send(self._signed(verdict))
