"""FedDisk on the device: its phase-1 state, the switch to phase 2, its state files.

The base of `ursa.edge_sdk.feddisk_steps.FeddiskSteps` (whose docstring has
the protocol): the state both phases share, `FeddiskSwitch` (step 3) and the
restart path, so the loss reports and verdicts read alone there. Files:
`ursa.edge_sdk.feddisk_state`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ursa.edge_sdk.feddisk_state import (
    FEDDISK_STATE_FILE,
    FeddiskRecord,
    load_state,
    read_made,
    read_weights,
    save_state,
    write_weights,
)
from ursa.edge_sdk.made_stop import MadeStopper
from ursa.edge_sdk.model_steps import ModelSteps
from ursa.edge_sdk.phased_trainer import Phase, PhasedTrainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import FeddiskSwitch, MadeLoss, MadeLossRequest

__all__ = ["UNCAPPED_ROUNDS", "FeddiskSwitchSteps", "MadeReport"]

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


class FeddiskSwitchSteps(ModelSteps):
    """FedDisk's device state, its files and the switch to phase 2."""

    feddisk_summary: dict[str, float] | None
    _made_request: MadeLossRequest | None
    _made_report: MadeReport | None
    _made_stopper: MadeStopper
    _made_best: tuple[int, Arrays] | None
    _made_applied: tuple[int, int, int] | None

    def _init_feddisk_steps(self) -> None:
        self.feddisk_summary = None
        self._made_request = None
        self._made_report = None
        self._made_stopper = self._fresh_stopper()
        self._made_best = None
        self._made_applied = None

    def _fresh_stopper(self) -> MadeStopper:
        trainer = self._phased()
        patience = 1 if trainer is None else trainer.settings.made_patience
        return MadeStopper(patience=patience, max_rounds=UNCAPPED_ROUNDS)

    def _phased(self) -> PhasedTrainer | None:
        trainer = self._trainer
        return trainer if isinstance(trainer, PhasedTrainer) else None

    def _in_made_phase(self) -> PhasedTrainer | None:
        trainer = self._phased()
        return trainer if trainer is not None and trainer.phase == "made" else None

    # --- the switch (step 3) ------------------------------------------------------

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
            write_weights(self._state_dir(), weights)
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
        self._forget_downloads()
        self._made_request = self._made_report = self._made_best = None

    # --- persistence (`ursa.edge_sdk.feddisk_state`) ---------------------------

    def _restore_feddisk(self) -> None:
        """Reload the stopper, the best MADE or phase 2's weights (state dir)."""
        trainer = self._phased()
        if trainer is None:
            return
        state_dir = self._state_dir()
        try:
            record = load_state(state_dir, self._fresh_stopper())
            if record is None:
                return
            if record.phase == "classifier":
                trainer.restore_weights(
                    read_weights(state_dir) if record.weighted else None
                )
                return
            self._made_stopper, self._made_applied = record.stopper, record.applied
            if record.best_version is not None:
                self._made_best = (record.best_version, read_made(state_dir))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            path = state_dir / FEDDISK_STATE_FILE
            logger.error(
                "%s: %s unreadable (%s); FedDisk state reset", self.device_id, path, exc
            )
            self._init_feddisk_steps()

    def _save_feddisk(self, phase: Phase, *, made_version: int | None = None) -> None:
        best, trainer = self._made_best, self._phased()
        record = FeddiskRecord(
            phase,
            self._made_stopper,
            self._made_applied,
            best_version=None if best is None else best[0],
            made_version=made_version,
            weighted=trainer is not None and trainer.sample_weights is not None,
        )
        save_state(self._state_dir(), record)

    def _state_dir(self) -> Path:
        return Path(self._config.state_dir)
