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
3. `FeddiskSwitch(made_version)` (retained): the device takes the global
   MADE of that version (the kept best, else the one it holds, else its
   closest with a warning; it never downloads again), trains its local MADE
   and density-ratio classifier (`PhasedTrainer.switch`, on the delivery
   thread like training), persists the phase and its sample weights
   (``feddisk_weights.npy``) and forgets the MADE downloads, because the
   classifier's versions restart at 0. A second switch is ignored; a
   restarted device resumes phase 2 from its state directory.

While in phase 1 a `ModelAvailable` of another model is parked (retried
after the switch); classifier transfers seen before it are dropped and
re-requested later. Losses are logged at DEBUG only.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.crypto.paillier import encrypted_vector_from
from ursa.edge_sdk.device_core import BlockedError, derived_id
from ursa.edge_sdk.made_loss import decrypt_fleet_loss, encrypt_made_loss
from ursa.edge_sdk.made_stop import MadeStopper, apply_validation_loss
from ursa.edge_sdk.model_steps import ModelSteps
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.models.weights import Arrays, arrays_from_bytes, arrays_to_bytes
from ursa.protocol.messages import (
    FeddiskSwitch,
    MadeLoss,
    MadeLossRequest,
    MadeLossSum,
    MadeVerdict,
    ModelAvailable,
)

if TYPE_CHECKING:
    from ursa.edge_sdk.feddisk_trainer import FeddiskSettings

__all__ = [
    "FEDDISK_MADE_FILE",
    "FEDDISK_STATE_FILE",
    "FEDDISK_WEIGHTS_FILE",
    "FeddiskSteps",
    "PhasedTrainer",
]

logger = logging.getLogger("ursa.edge_sdk")

FEDDISK_STATE_FILE = "feddisk.json"
FEDDISK_WEIGHTS_FILE = "feddisk_weights.npy"
FEDDISK_MADE_FILE = "feddisk_made.bin"
UNCAPPED_ROUNDS = 1 << 30
"""The device's stopper has no round cap: the coordinator enforces its own."""

Phase = Literal["made", "classifier"]


class PhasedTrainer(ModelTrainer):
    """A `ModelTrainer` with FedDisk's two phases (no torch here).

    Attributes:
        phase: ``"made"`` (trains the global MADE, `model` is the MADE's name)
            or ``"classifier"`` (phase 2, the classifier with sample weights).
        settings: FedDisk's settings (MADE name, patience, loss codec, ...).
    """

    phase: Phase
    settings: FeddiskSettings

    @abstractmethod
    def validation_loss(self, made_arrays: Arrays) -> tuple[float, int]:
        """The MADE's mean NLL on the validation split, and the split's size."""

    @abstractmethod
    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        """Compute the sample weights from the global MADE; enter phase 2.

        ``None`` (no global MADE reached this device) gives uniform weights.
        Returns a summary for reports (no per-sample data).
        """

    @abstractmethod
    def restore_weights(self, weights: npt.NDArray[np.float64] | None) -> None:
        """Enter phase 2 with persisted sample weights (None: uniform)."""

    @property
    @abstractmethod
    def sample_weights(self) -> npt.NDArray[np.float64] | None:
        """The phase-2 sample weights (None before the switch or if uniform)."""


@dataclass
class _MadeReport:
    epoch: int
    round: int
    version: int
    arrays: Arrays
    message: MadeLoss


class FeddiskSteps(ModelSteps):
    """FedDisk phase 1 (loss reports, stop rule, switch) on top of the model steps."""

    feddisk_summary: dict[str, float] | None
    _made_request: MadeLossRequest | None
    _made_report: _MadeReport | None
    _made_stopper: MadeStopper
    _made_best: tuple[int, Arrays] | None
    _made_applied: tuple[int, int, int] | None

    def _init_feddisk_steps(self) -> None:
        self.feddisk_summary = None
        self._made_request = None
        self._made_report = None
        trainer = self._phased()
        patience = 1 if trainer is None else trainer.settings.made_patience
        self._made_stopper = MadeStopper(patience=patience, max_rounds=UNCAPPED_ROUNDS)
        self._made_best = None
        self._made_applied = None

    def _phased(self) -> PhasedTrainer | None:
        trainer = self._trainer
        return trainer if isinstance(trainer, PhasedTrainer) else None

    def _in_made_phase(self) -> PhasedTrainer | None:
        trainer = self._phased()
        return trainer if trainer is not None and trainer.phase == "made" else None

    # --- hooks ----------------------------------------------------------------

    def _on_model_ready(self) -> None:
        self._continue_made()
        super()._on_model_ready()

    def _on_model_available(self, message: ModelAvailable) -> None:
        trainer = self._in_made_phase()
        if trainer is not None and message.model != trainer.model:
            raise BlockedError  # phase 2's model: retried after the switch
        super()._on_model_available(message)

    # --- handlers -------------------------------------------------------------

    def _on_made_loss_request(self, message: MadeLossRequest) -> None:
        trainer = self._in_made_phase()
        if trainer is None or message.model != trainer.model:
            return
        self._require_epoch(message.epoch)
        if self._public_key is None:
            raise BlockedError
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
        self._made_report = _MadeReport(
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
            raise BlockedError
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
                self._write_atomic(FEDDISK_MADE_FILE, arrays_to_bytes(report.arrays))
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

    def _on_feddisk_switch(self, message: FeddiskSwitch) -> None:
        trainer = self._in_made_phase()
        if trainer is None:
            return  # not FedDisk, or already switched
        if message.made_model != trainer.model:
            logger.warning(
                "%s: switch names MADE %r, this device trains %r",
                self.device_id,
                message.made_model,
                trainer.model,
            )
        try:
            summary = trainer.switch(self._switch_made(message.made_version))
        except ValueError as exc:  # e.g. a MADE that does not fit: take part anyway
            logger.error(
                "%s: FedDisk weights failed (%s); phase 2 with uniform weights",
                self.device_id,
                exc,
            )
            summary = trainer.switch(None)
        if trainer.model != message.model:
            logger.warning(
                "%s: phase 2 trains %r, this device's classifier is %r",
                self.device_id,
                message.model,
                trainer.model,
            )
        weights = trainer.sample_weights
        if weights is not None:
            self._write_atomic(FEDDISK_WEIGHTS_FILE, _npy_bytes(weights))
        self._save_feddisk("classifier", made_version=message.made_version)
        self.feddisk_summary = summary
        self._reset_downloads()
        logger.info(
            "%s: FedDisk phase 2 from MADE version %d",
            self.device_id,
            message.made_version,
        )
        logger.debug("%s: FedDisk weights %s", self.device_id, summary)
        self._maybe_train()

    def _switch_made(self, version: int) -> Arrays | None:
        """The global MADE of ``version``, else the closest held, with a warning."""
        best, report = self._made_best, self._made_report
        held: list[tuple[int, Arrays]] = []
        if best is not None:
            held.append(best)
        if self._model_version is not None and self._model_arrays is not None:
            held.append((self._model_version, self._model_arrays))
        if report is not None:
            held.append((report.version, report.arrays))
        for held_version, arrays in held:
            if held_version == version:
                return arrays
        if not held:
            logger.warning(
                "%s: no global MADE here; phase 2 with uniform weights",
                self.device_id,
            )
            return None
        logger.warning(
            "%s: MADE version %d is not here; weights from version %d",
            self.device_id,
            version,
            held[0][0],
        )
        return held[0][1]

    def _reset_downloads(self) -> None:
        """Forget phase 1's model downloads (the classifier's versions restart)."""
        for transfer_id in self._model_inflight:
            self._model_parts.discard(transfer_id)
        self._model_inflight.clear()
        self._model_version = self._model_arrays = self._model_notice = None
        self._notice_at = 0.0
        self._wanted = None
        self._sent_updates.clear()
        self._made_request = self._made_report = self._made_best = None

    # --- persistence ----------------------------------------------------------

    def _restore_feddisk(self) -> None:
        """Reload the stopper, the best MADE or phase 2's weights (state dir)."""
        trainer = self._phased()
        path = self._config.state_dir / FEDDISK_STATE_FILE
        if trainer is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text())
            if data["phase"] == "classifier":
                weights = None
                if data.get("weighted", True):
                    stored = np.load(self._feddisk_path(FEDDISK_WEIGHTS_FILE))
                    weights = np.asarray(stored, dtype=np.float64)
                trainer.restore_weights(weights)
                return
            best_loss = data["best_loss"]
            self._made_stopper = MadeStopper(
                patience=trainer.settings.made_patience,
                max_rounds=UNCAPPED_ROUNDS,
                rounds=int(data["rounds"]),
                best_round=int(data["best_round"]),
                best_loss=math.inf if best_loss is None else float(best_loss),
                since_best=int(data["since_best"]),
            )
            applied = data["applied"]
            if applied is not None:
                epoch, round_index, version = (int(v) for v in applied)
                self._made_applied = (epoch, round_index, version)
            if data["best_version"] is not None:
                made = self._feddisk_path(FEDDISK_MADE_FILE).read_bytes()
                self._made_best = (int(data["best_version"]), arrays_from_bytes(made))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error(
                "%s: %s unreadable (%s); FedDisk state reset", self.device_id, path, exc
            )
            self._init_feddisk_steps()

    def _save_feddisk(self, phase: Phase, *, made_version: int | None = None) -> None:
        stopper, best = self._made_stopper, self._made_best
        trainer = self._phased()
        data: dict[str, Any] = {
            "phase": phase,
            "rounds": stopper.rounds,
            "best_round": stopper.best_round,
            "best_loss": None if math.isinf(stopper.best_loss) else stopper.best_loss,
            "since_best": stopper.since_best,
            "applied": self._made_applied,
            "best_version": None if best is None else best[0],
            "made_version": made_version,
            "weighted": trainer is not None and trainer.sample_weights is not None,
        }
        self._write_atomic(FEDDISK_STATE_FILE, json.dumps(data).encode())

    def _feddisk_path(self, name: str) -> Path:
        return Path(self._config.state_dir) / name

    def _write_atomic(self, name: str, payload: bytes) -> None:
        path = self._feddisk_path(name)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(payload)
        tmp.replace(path)


def _npy_bytes(weights: npt.NDArray[np.float64]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(weights, dtype=np.float64), allow_pickle=False)
    return buffer.getvalue()
