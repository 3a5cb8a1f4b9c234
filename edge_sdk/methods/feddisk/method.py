"""FedDisk on the device (coordinator: ``coordinator/methods/feddisk``).

A device running `FedDisk` (its trainer a `PhasedTrainer`) trains the global MADE in
ordinary rounds (model ``settings.made_model``) and, per MADE round:

1. `MeanRequest(feddisk.made_loss, round, epoch, model, version)`: it
   fetches that version if needed, measures the MADE's NLL on its
   validation split, and its values are ``[nll * n_val, n_val]``
   (`ursa.edge_sdk.methods.feddisk.made_loss.loss_report_values`). The runtime's
   secure mean (`ursa.edge_sdk.secure_mean`; `FedDisk` is its `MeanParticipant`)
   encrypts and reports them and re-sends the same report on a repeat.
2. Its `MeanSum(round, epoch, version)`: the runtime decrypts the totals
   and refuses a sum no honest fleet reports (`check_mean`: the stopper
   stays, no verdict, the coordinator trains on);
   the device takes the fleet's sample-weighted mean NLL and applies it to
   its own `MadeStopper` (persisted
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
from dataclasses import dataclass
from typing import ClassVar

from ursa.edge_sdk.method import DeviceContext, DeviceMethod
from ursa.edge_sdk.methods.feddisk.made_loss import fleet_loss
from ursa.edge_sdk.methods.feddisk.made_loss import (
    loss_report_values as made_loss_values,
)
from ursa.edge_sdk.methods.feddisk.made_stopper import (
    MadeStopper,
    apply_validation_loss,
)
from ursa.edge_sdk.methods.feddisk.phased_trainer import Phase, PhasedTrainer
from ursa.edge_sdk.methods.feddisk.state import (
    FeddiskRecord,
    read_made,
    read_weights,
    record_from_json,
    record_to_json,
    write_made,
    write_weights,
)
from ursa.edge_sdk.secure_mean import (
    FloatVector,
    MeanAbandonedError,
    MeanCodec,
    MeanParticipant,
)
from ursa.models.weights import Arrays
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    MADE_LOSS,
    MADE_LOSS_LENGTH,
    FeddiskSwitch,
    MadeVerdict,
    MeanRequest,
    MeanSum,
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


class FedDisk(DeviceMethod, MeanParticipant):
    """FedDisk's device half over a `PhasedTrainer` (see the module docstring)."""

    name: ClassVar[str] = "feddisk"
    role: ClassVar[MethodRole | None] = MethodRole.TRAINING
    purpose: ClassVar[str] = MADE_LOSS

    def __init__(self, ctx: DeviceContext, trainer: PhasedTrainer) -> None:
        self.ctx = ctx
        """The device this method runs on."""
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
        self._report: MadeReport | None = None
        self._applied: tuple[int, int, int] | None = None

    @property
    def in_made_phase(self) -> bool:
        """Whether the device still trains the global MADE (phase 1)."""
        return self.trainer.phase == "made"

    def register(self, router: Router) -> None:
        """Handle the switch (the loss step is the runtime's secure mean)."""
        router.register(FeddiskSwitch, self._on_switch, owner=self.name)

    # --- hooks ----------------------------------------------------------------

    def admit_model(self, message: ModelAvailable) -> None:
        """In phase 1, hold phase 2's model notice back until the switch."""
        if self.in_made_phase and message.model != self.trainer.model:
            raise NotReadyError

    # --- loss reports and sums (steps 1 and 2, a secure mean) ------------------

    def mean_codec(self) -> MeanCodec:
        """``[nll * n, n]`` in the loss codec's fixed point."""
        loss = self.trainer.settings.loss
        return MeanCodec(
            loss.codec(), loss.max_parties, MADE_LOSS_LENGTH, loss.honest_range()
        )

    def check_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """Refuse a loss no honest fleet reports (`made_loss.fleet_loss`).

        Raises:
            ImplausibleSumError: why.
        """
        fleet_loss(totals, result.num_parties, self.trainer.settings.loss)

    def takes_part(self, request: MeanRequest) -> bool:
        """In phase 1, the loss of the MADE this device trains."""
        return self.in_made_phase and request.model == self.trainer.model

    def mean_values(self, request: MeanRequest) -> FloatVector | None:
        """``[nll * n, n]`` at the requested MADE version (None: downloading).

        Raises:
            MeanAbandonedError: phase 1 is over, or a newer version is here.
        """
        ctx = self.ctx
        if not self.in_made_phase:
            raise MeanAbandonedError("FedDisk switched")
        version = request.model_version
        report = self._report
        if report is not None and report.version == version:
            arrays: Arrays | None = report.arrays
        else:
            arrays = ctx.model_arrays_at(version)
        if arrays is None:
            held = ctx.model_version
            if held is not None and held > version:
                raise MeanAbandonedError(
                    f"MADE version {version} asked for, but {held} is already here"
                )
            return None  # downloading; the runtime asks again when it arrives
        loss, num_examples = self.trainer.validation_loss(arrays)
        values = made_loss_values(loss, num_examples, self.trainer.settings.loss)
        self._report = MadeReport(request.epoch, request.round, version, arrays)
        logger.info("%s: MADE loss of version %d reported", ctx.device_id, version)
        return values

    def on_sum_again(self, result: MeanSum) -> None:
        """A re-published sum already applied: the agent sends its verdict again."""
        key = (result.epoch, result.round, result.model_version)
        if self.in_made_phase and self._applied == key:
            self._send_verdict(*key)

    def on_mean(self, result: MeanSum, totals: FloatVector) -> None:
        """Apply the fleet's mean NLL to the stopper; the agent sends the verdict."""
        if not self.in_made_phase:
            return
        ctx = self.ctx
        key = (result.epoch, result.round, result.model_version)
        if self._applied == key:
            self._send_verdict(*key)
            return
        report = self._report
        if report is None or (report.epoch, report.round, report.version) != key:
            return
        if not self.stopper.stopped:
            mean_nll = fleet_loss(
                totals, result.num_parties, self.trainer.settings.loss
            ).mean_nll
            self.stopper = apply_validation_loss(self.stopper, mean_nll)
            if self.stopper.improved:
                self.best = (report.version, report.arrays)
                write_made(ctx.store.path, report.arrays)
            logger.debug("%s: fleet MADE NLL %.4f", ctx.device_id, mean_nll)
            logger.info(
                "%s: MADE round %d over %d devices: stop=%s",
                ctx.device_id,
                result.round,
                result.num_parties,
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
        self._report = self.best = None
        logger.info(
            "%s: FedDisk phase 2 from MADE version %d; weights %s",
            ctx.device_id,
            message.made_version,
            " ".join(f"{k}={v:.3g}" for k, v in summary.items()),
        )
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
