"""Device steps at the end of the federation: take the final model, save it, stop.

On the coordinator's signed, retained `FederationEnd` (a device that was
offline gets it when it reconnects) a device that trains the final model
takes its weights (inline, else the version's chunked transfer, downloaded
as every version is) and saves them in ``<state_dir>/final``:

    model.ursw      the weights file (`ursa.models.weights`)
    model.onnx      when the trainer knows its architecture and torch and
                    onnx can export it (the ``train`` + ``infer`` extras)
    final.json      version, rounds, the coordinator's evaluation figures

then calls the app's ``on_finished`` and sets `finished` (`EdgeClient.run`
returns, ``ursa device run`` exits 0). The ONNX export runs in a thread of
its own: a device stopped meanwhile exits at once, with the weights only.
A device that trains no model (a selection-only one) finishes at once
without files, and so does one that sat the last key epoch out (its data or
model does not fit the federation's, `ursa.edge_sdk.model_fit`) or whose
trainer refuses the final weights (`ModelTrainer.check_arrays`): it saves
no model its own module could not load.

A device kept running after the end (``EdgeClient.run(until_finished=False)``,
``ursa device run --keep-running``) follows the coordinator's next run
(``ursa coordinator new-run``): joining it calls `new_run`, which clears
`finished` so that the new run's end is taken again. The old run's end
cannot end the new one: its messages carry the old run's id, which the
device has left (`RunMembership`), and an export still running for it
writes and finishes nothing once the run changed. Each run's final model
replaces the last one in ``final`` (an older run's ``model.onnx`` goes with
its weights).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ursa.edge_sdk.callbacks import DeviceCallbacks, Finished, notify
from ursa.edge_sdk.downloads import model_trainer_of
from ursa.edge_sdk.trainer import ModelTrainer, Trainer
from ursa.models.weights import (
    WEIGHTS_FILENAME,
    Arrays,
    WeightsError,
    arrays_from_bytes,
    arrays_to_bytes,
)
from ursa.protocol.messages import FederationEnd

__all__ = [
    "FINAL_DIRNAME",
    "FINAL_INFO_FILENAME",
    "ONNX_FILENAME",
    "WEIGHTS_FILENAME",
    "EndOfFederation",
    "ModelView",
    "onnx_of",
]

logger = logging.getLogger("ursa.edge_sdk")

FINAL_DIRNAME = "final"
ONNX_FILENAME = "model.onnx"
FINAL_INFO_FILENAME = "final.json"


def onnx_of(trainer: Trainer, arrays: Arrays) -> bytes | None:
    """The final model as ONNX, if the trainer can export it (`ModelTrainer.onnx`).

    Needs torch and onnx (imported by the export only); None when either is
    missing, the trainer cannot export, or the export fails (logged).
    """
    if not isinstance(trainer, ModelTrainer):
        return None
    try:
        return trainer.onnx(arrays)
    except (ImportError, RuntimeError, ValueError) as exc:
        logger.warning("the final model was not exported to ONNX: %s", exc)
        return None


class ModelView(Protocol):
    """What the end of the federation needs of the device's downloads."""

    @property
    def model_version(self) -> int | None:
        """The latest global version downloaded."""

    @property
    def model_arrays(self) -> Arrays | None:
        """Its weights."""

    def want(self, version: int, transfer_id: str) -> None:
        """Download ``version`` (then `EndOfFederation.on_model_ready` is called)."""


class EndOfFederation:
    """`FederationEnd`: the final model saved, ``on_finished``, `finished` set.

    Handed the device's downloads (to take the final version as every
    version is downloaded), whether it sits the key epoch out (``sits_out``:
    then no model is saved) and the client's lock (the ONNX export finishes
    on a thread of its own). The coordinator's signature is checked by the
    client before the message gets here.
    """

    def __init__(
        self,
        *,
        device_id: str,
        final_dir: Path,
        trainer: Trainer,
        models: ModelView,
        sits_out: Callable[[], bool],
        lock: threading.RLock,
        callbacks: DeviceCallbacks | None,
    ) -> None:
        self.device_id = device_id
        self.final_dir = final_dir
        """Where the final model is saved."""
        self.finished = threading.Event()
        """Set once the final model is saved and ``on_finished`` called."""
        self._trainer = trainer
        self._models = models
        self._sits_out = sits_out
        self._lock = lock
        self._callbacks = callbacks
        self._end: FederationEnd | None = None
        self._finishing = False
        self._run = 0
        """Bumped by `new_run`: an export of an older run's end finishes nothing."""

    def new_run(self) -> None:
        """A new run was joined: its end is taken again (the final model replaced)."""
        self._run += 1
        self._end = None
        self._finishing = False
        self.finished.clear()

    def on_federation_end(self, message: FederationEnd) -> None:
        """The signed end: finish with the final model, downloaded if need be."""
        if self._finishing or self._end is not None:
            return
        self._end = message
        logger.info(
            "%s: the federation is over after %d rounds (final version %s)",
            self.device_id,
            message.rounds,
            message.model_version,
        )
        models = self._models
        trainer = model_trainer_of(self._trainer)
        if message.model is None or trainer is None or message.model != trainer.model:
            self._finish(message, None)
            return
        if self._sits_out():
            logger.warning(
                "%s: no final model saved: this device sat the key epoch out "
                "(its data or model does not fit the federation's; see the error "
                "above)",
                self.device_id,
            )
            self._finish(message, None)
            return
        version = message.model_version
        assert version is not None and message.transfer_id is not None
        if message.weights is not None:
            try:
                arrays = arrays_from_bytes(message.weights, models.model_arrays)
            except WeightsError as exc:
                logger.warning(
                    "%s: inline final model refused: %s", self.device_id, exc
                )
            else:
                self._finish(message, arrays)
                return
        held = models.model_arrays
        if models.model_version == version and held is not None:
            self._finish(message, held)
            return
        models.want(version, message.transfer_id)  # `on_model_ready` finishes

    def on_model_ready(self) -> None:
        """A global version was downloaded: finish if it is the final one."""
        end, arrays = self._end, self._models.model_arrays
        if end is None or self._finishing or arrays is None:
            return
        if self._models.model_version == end.model_version:
            self._finish(end, arrays)

    def _finish(self, message: FederationEnd, arrays: Arrays | None) -> None:
        """Save the final model (if any), tell the app, set `finished`.

        The weights are saved at once; the ONNX export (torch's exporter:
        seconds, more on a busy device) runs in a daemon thread outside the
        client's lock, so a stop meanwhile is not held up by it (the device
        then keeps the weights and no ONNX file). ``on_finished`` and
        `finished` follow the export.
        """
        if self._finishing:
            return
        self._finishing = True
        if arrays is None or not self._loadable(arrays):
            self._finished(message, None, None)
            return
        weights = self._save_weights(message, arrays)
        if weights is None:
            self._finished(message, None, None)
            return
        threading.Thread(
            target=self._export_then_finish,
            args=(message, arrays, weights, self._run),
            name=f"ursa-final-{self.device_id}",
            daemon=True,
        ).start()

    def _loadable(self, arrays: Arrays) -> bool:
        """Whether the trainer's own model takes ``arrays`` (else logged)."""
        trainer = model_trainer_of(self._trainer)
        if trainer is None:
            return True
        try:
            trainer.check_arrays(arrays)
        except ValueError as exc:
            logger.error(
                "%s: final model not saved: it does not fit this device's model: %s",
                self.device_id,
                exc,
            )
            return False
        return True

    def _export_then_finish(
        self, message: FederationEnd, arrays: Arrays, weights: Path, run: int
    ) -> None:
        try:
            onnx = onnx_of(self._trainer, arrays)
        except Exception:  # the exporter's many errors
            logger.exception("%s: final model not exported to ONNX", self.device_id)
            onnx = None
        with self._lock:
            if run != self._run:
                return  # a new run was joined meanwhile: these are not its files
            onnx_path = None if onnx is None else self._write_onnx(weights, onnx)
            logger.info(
                "%s: final model version %s saved in %s%s",
                self.device_id,
                message.model_version,
                weights.parent,
                "" if onnx_path is None else " (with ONNX)",
            )
            self._finished(message, weights, onnx_path)

    def _write_onnx(self, weights: Path, onnx: bytes) -> Path | None:
        """``model.onnx`` beside the weights; None if it could not be written."""
        path = weights.parent / ONNX_FILENAME
        partial = path.with_suffix(".onnx.part")
        try:
            partial.write_bytes(onnx)
            os.replace(partial, path)  # a reader never sees half a file
        except OSError as exc:  # a full disk
            logger.error("%s: final model's ONNX not saved: %s", self.device_id, exc)
            return None
        return path

    def _finished(
        self, message: FederationEnd, weights: Path | None, onnx: Path | None
    ) -> None:
        event = Finished(
            message.rounds, message.model_version, weights, onnx, dict(message.metrics)
        )
        notify(self._callbacks, "on_finished", event, device=self.device_id)
        self.finished.set()

    def _save_weights(self, message: FederationEnd, arrays: Arrays) -> Path | None:
        """``model.ursw`` and ``final.json``; None if they could not be written."""
        folder = self.final_dir
        info: dict[str, Any] = {
            "model": message.model,
            "version": message.model_version,
            "rounds": message.rounds,
            "metrics": dict(message.metrics),
        }
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / ONNX_FILENAME).unlink(missing_ok=True)  # an older run's
            weights = folder / WEIGHTS_FILENAME
            weights.write_bytes(arrays_to_bytes(arrays))
            (folder / FINAL_INFO_FILENAME).write_text(json.dumps(info, indent=2))
        except OSError as exc:
            logger.error("%s: could not save the final model: %s", self.device_id, exc)
            return None
        return weights
