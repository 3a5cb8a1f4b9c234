"""FedDisk on the device (SPEC §5; coordinator: ``coordinator/methods/feddisk``).

A device running `FedDisk` (its trainer a `PhasedTrainer`) trains the global MADE in
ordinary rounds (model ``settings.made_model``) and, per MADE round:

1. `MadeLossRequest(round, epoch, model, version)`: it fetches that version
   if needed, measures the MADE's NLL on its validation split and sends
   `MadeLoss` = ``Enc([nll * n_val, n_val])`` under the epoch key (pooled
   obfuscators). The id derives from (device, epoch, round); a repeated
   request re-sends the same report.
2. `MadeLossSum(round, epoch, version)`: the device decrypts the fleet's
   sample-weighted mean NLL and applies it to its own `MadeStopper` (persisted
   as the method's state; patience from the settings, no round cap: the
   coordinator owns it), keeping the best version's weights in
   ``feddisk_made.bin``. The epoch's agent then sends the signed
   `MadeVerdict` (stop bit and best version). Every device applies every sum,
   so whichever device is agent of a later epoch holds the same stopper.
   Limits: a device that missed a request or a sum (offline) has a stale
   stopper and would give a different verdict if it became agent; a device
   whose report came too late still applies the sum (as in CLIMB).
3. `FeddiskSwitch(made_version)` (retained):
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
from dataclasses import dataclass
from typing import ClassVar

from ursa.crypto.paillier import encrypted_vector_from
from ursa.edge_sdk.device_core import derived_id
from ursa.edge_sdk.made_loss import decrypt_fleet_loss, encrypt_made_loss
from ursa.edge_sdk.made_stop import MadeStopper, apply_validation_loss
from ursa.edge_sdk.method import DeviceMethod
from ursa.edge_sdk.methods.feddisk.state import (
    FeddiskRecord,
    read_made,
    read_weights,
    record_from_json,
    record_to_json,
    write_made,
    write_weights,
)
from ursa.edge_sdk.phased_trainer import Phase, PhasedTrainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    FeddiskSwitch,
    MadeLoss,
    MadeLossRequest,
    MadeLossSum,
    MadeVerdict,
    ModelAvailable,
)
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import NotReadyError, Router

__all__ = ["UNCAPPED_ROUNDS", "FedDisk", "MadeReport"]

logger = logging.getLogger("ursa.edge_sdk")

UNCAPPED_ROUNDS = 1 << 30
"""The device's stopper has no round cap: the coordinator enforces its own."""


@dataclass
class MadeReport:
    """This device's last MADE loss report and the version it judged."""

    epoch: int
    round: int
    version: int
    arrays: Arrays
    message: MadeLoss


class FedDisk(DeviceMethod):
    """FedDisk's device half over a `PhasedTrainer` (see the module docstring)."""

    name: ClassVar[str] = "feddisk"
    role: ClassVar[MethodRole | None] = MethodRole.TRAINING

    def __init__(self, trainer: PhasedTrainer) -> None:
        self.trainer = trainer
        self.summary: dict[str, float] | None = None
        """The sample weights' figures after the switch (min, max, ...)."""
        self._reset()

    def _reset(self) -> None:
        self.stopper = MadeStopper(
            patience=self.trainer.settings.made_patience, max_rounds=UNCAPPED_ROUNDS
        )
        self.best: tuple[int, Arrays] | None = None
        """The best global MADE judged so far: (version, weights)."""
        self._request: MadeLossRequest | None = None
        self._report: MadeReport | None = None
        self._applied: tuple[int, int, int] | None = None

    @property
    def in_made_phase(self) -> bool:
        """Whether the device still trains the global MADE (phase 1)."""
        return self.trainer.phase == "made"

    def register(self, router: Router) -> None:
        """Handle loss requests, loss sums and the switch."""
        router.register(MadeLossRequest, self._on_made_loss_request, owner=self.name)
        router.register(MadeLossSum, self._on_made_loss_sum, owner=self.name)
        router.register(FeddiskSwitch, self._on_switch, owner=self.name)

    # --- hooks ----------------------------------------------------------------

    def admit_model(self, message: ModelAvailable) -> None:
        """In phase 1, hold phase 2's model notice back until the switch."""
        if self.in_made_phase and message.model != self.trainer.model:
            raise NotReadyError

    def on_model_ready(self) -> None:
        """A requested MADE version may have arrived: report on it."""
        self._continue()

    # --- loss reports and sums (steps 1 and 2) --------------------------------

    def _on_made_loss_request(self, message: MadeLossRequest) -> None:
        if not self.in_made_phase or message.model != self.trainer.model:
            return
        self.ctx.keys(message.epoch)  # NotReadyError until the epoch's key is here
        report = self._report
        if report is not None and (report.epoch, report.round) == (
            message.epoch,
            message.round,
        ):
            self.ctx.send(report.message)  # a re-published request
            return
        self._request = message
        self._continue()

    def _continue(self) -> None:
        """Report ``Enc([nll * n, n])`` once the requested version is here."""
        ctx, request = self.ctx, self._request
        keys = ctx.current_keys()
        if request is None or not self.in_made_phase or keys is None:
            return
        version = request.model_version
        report = self._report
        if report is not None and report.version == version:
            arrays: Arrays | None = report.arrays
        else:
            arrays = ctx.model_arrays_at(version)
        if arrays is None:
            held = ctx.model_version
            if held is not None and held > version:
                self._request = None
                logger.warning(
                    "%s: MADE version %d asked for, but %d is already here",
                    ctx.device_id,
                    version,
                    held,
                )
            return  # downloading; `on_model_ready` calls back
        self._request = None
        loss, num_examples = self.trainer.validation_loss(arrays)
        started = time.perf_counter()
        vector = encrypt_made_loss(
            keys.public_key,
            self.trainer.settings.loss,
            loss,
            num_examples,
            obfuscators=keys.pool,
        )
        ctx.stats.crypto_s += time.perf_counter() - started
        me = ctx.device_id
        message = MadeLoss(
            federation=ctx.federation,
            round=request.round,
            sender=me,
            message_id=derived_id(me, "made_loss", request.epoch, request.round),
            epoch=request.epoch,
            model_version=version,
            loss=vector.to_bytes(keys.public_key),
        )
        self._report = MadeReport(
            request.epoch, request.round, version, arrays, message
        )
        ctx.send(message)
        logger.info("%s: MADE loss of version %d reported", me, version)

    def _on_made_loss_sum(self, message: MadeLossSum) -> None:
        if not self.in_made_phase:
            return
        ctx = self.ctx
        key = (message.epoch, message.round, message.model_version)
        if self._applied == key:
            self._send_verdict(*key)  # a re-published sum
            return
        report = self._report
        if report is None or (report.epoch, report.round, report.version) != key:
            return
        keys = ctx.keys(message.epoch)
        if keys.secret_key is None:
            raise NotReadyError
        if not self.stopper.stopped:
            started = time.perf_counter()
            vector = encrypted_vector_from(message.loss_sum, keys.public_key)
            if vector.num_parties != message.num_parties:
                raise ValueError("MADE loss sum: party count differs from its header")
            fleet = decrypt_fleet_loss(
                keys.secret_key, self.trainer.settings.loss, vector
            )
            ctx.stats.crypto_s += time.perf_counter() - started
            self.stopper = apply_validation_loss(self.stopper, fleet.mean_nll)
            if self.stopper.improved:
                self.best = (report.version, report.arrays)
                write_made(ctx.store.path, report.arrays)
            logger.debug("%s: fleet MADE NLL %.4f", ctx.device_id, fleet.mean_nll)
            logger.info(
                "%s: MADE round %d over %d devices: stop=%s",
                ctx.device_id,
                message.round,
                fleet.num_parties,
                self.stopper.stopped,
            )
        self._applied = key
        self._save("made")
        self._send_verdict(*key)

    def _send_verdict(self, epoch: int, round_index: int, version: int) -> None:
        """The agent's signed verdict for the sum of (epoch, round, version)."""
        ctx = self.ctx
        notice = ctx.epoch
        if notice is None or notice.agent != ctx.device_id or notice.epoch != epoch:
            return
        best = self.best
        verdict = MadeVerdict(
            federation=ctx.federation,
            round=round_index,
            sender=ctx.device_id,
            message_id=derived_id(ctx.device_id, "made_verdict", epoch, round_index),
            epoch=epoch,
            model_version=version,
            stop=self.stopper.stopped,
            best_version=version if best is None else best[0],
        )
        ctx.send(ctx.signed(verdict))

    # --- the switch (step 3) --------------------------------------------------

    def _on_switch(self, message: FeddiskSwitch) -> None:
        if not self.in_made_phase:
            return  # already switched
        ctx, trainer = self.ctx, self.trainer
        if message.made_model != trainer.model:
            logger.warning(
                "%s: switch names MADE %r, this device trains %r",
                ctx.device_id,
                message.made_model,
                trainer.model,
            )
        try:
            summary = trainer.switch(self._switch_made(message.made_version))
        except ValueError as exc:  # e.g. a MADE that does not fit: take part anyway
            logger.error(
                "%s: FedDisk weights failed (%s); phase 2 with uniform weights",
                ctx.device_id,
                exc,
            )
            summary = trainer.switch(None)
        if trainer.model != message.model:
            logger.warning(
                "%s: phase 2 trains %r, this device's classifier is %r",
                ctx.device_id,
                message.model,
                trainer.model,
            )
        weights = trainer.sample_weights
        if weights is not None:
            write_weights(ctx.store.path, weights)
        self._save("classifier", made_version=message.made_version)
        self.summary = summary
        ctx.forget_downloads()  # the classifier's versions restart at 0
        self._request = self._report = self.best = None
        logger.info(
            "%s: FedDisk phase 2 from MADE version %d",
            ctx.device_id,
            message.made_version,
        )
        logger.debug("%s: FedDisk weights %s", ctx.device_id, summary)
        ctx.retry_training()

    def _switch_made(self, version: int) -> Arrays | None:
        """The global MADE of ``version``, else the closest held, with a warning."""
        ctx, best, report = self.ctx, self.best, self._report
        held: list[tuple[int, Arrays]] = []
        if best is not None:
            held.append(best)
        current = ctx.model_version
        arrays = None if current is None else ctx.model_arrays_at(current)
        if current is not None and arrays is not None:
            held.append((current, arrays))
        if report is not None:
            held.append((report.version, report.arrays))
        for held_version, held_arrays in held:
            if held_version == version:
                return held_arrays
        if not held:
            logger.warning(
                "%s: no global MADE here; phase 2 with uniform weights", ctx.device_id
            )
            return None
        logger.warning(
            "%s: MADE version %d is not here; weights from version %d",
            ctx.device_id,
            version,
            held[0][0],
        )
        return held[0][1]

    # --- persistence ----------------------------------------------------------

    def start(self) -> None:
        """Reload the stopper and the best MADE, or phase 2's weights."""
        ctx = self.ctx
        try:
            data = ctx.store.method_state(self.name)
            if data is None:
                return
            record = record_from_json(data, self.stopper)
            if record.phase == "classifier":
                self.trainer.restore_weights(
                    read_weights(ctx.store.path) if record.weighted else None
                )
                return
            self.stopper, self._applied = record.stopper, record.applied
            if record.best_version is not None:
                self.best = (record.best_version, read_made(ctx.store.path))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error(
                "%s: FedDisk state unreadable (%s); FedDisk state reset",
                ctx.device_id,
                exc,
            )
            self._reset()

    def _save(self, phase: Phase, *, made_version: int | None = None) -> None:
        best = self.best
        record = FeddiskRecord(
            phase,
            self.stopper,
            self._applied,
            best_version=None if best is None else best[0],
            made_version=made_version,
            weighted=self.trainer.sample_weights is not None,
        )
        self.ctx.store.save_method_state(self.name, record_to_json(record))
