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
without files.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ursa.edge_sdk.callbacks import Finished
from ursa.edge_sdk.model_steps import ModelSteps
from ursa.models.weights import Arrays, WeightsError, arrays_from_bytes, arrays_to_bytes
from ursa.protocol.messages import FederationEnd
from ursa.protocol.router import NotReadyError

__all__ = [
    "FINAL_DIRNAME",
    "FINAL_INFO_FILENAME",
    "ONNX_FILENAME",
    "WEIGHTS_FILENAME",
    "EndSteps",
    "onnx_of",
]

logger = logging.getLogger("ursa.edge_sdk")

FINAL_DIRNAME = "final"
WEIGHTS_FILENAME = "model.ursw"
ONNX_FILENAME = "model.onnx"
FINAL_INFO_FILENAME = "final.json"


def onnx_of(trainer: object, arrays: Arrays) -> bytes | None:
    """The final model as ONNX, if the trainer names a registry architecture.

    A trainer that wraps the classifier's (FedDisk's, as ``classifier``) is
    looked through. Needs torch and onnx (imported here only); None when
    either is missing or the model is not a built-in architecture.
    """
    trainer = getattr(trainer, "classifier", trainer)
    architecture = getattr(trainer, "architecture", None)
    options = getattr(trainer, "model_config", None)
    if not isinstance(architecture, str) or not isinstance(options, dict):
        return None
    try:
        from ursa.models.onnx_export import export_arrays_to_onnx
    except ImportError:
        return None
    try:
        return export_arrays_to_onnx(architecture, options, arrays)
    except (ImportError, RuntimeError, ValueError) as exc:
        logger.warning("the final model was not exported to ONNX: %s", exc)
        return None


class EndSteps(ModelSteps):
    """`FederationEnd`: the final model saved, ``on_finished``, `finished` set."""

    finished: threading.Event
    _end: FederationEnd | None
    _finishing: bool
    _lock: threading.RLock

    def _init_end_steps(self) -> None:
        self.finished = threading.Event()
        self._end = None
        self._finishing = False

    @property
    def final_dir(self) -> Path:
        """Where the final model is saved."""
        return self._config.state_dir / FINAL_DIRNAME

    def _on_federation_end(self, message: FederationEnd) -> None:
        if self._coordinator is None:
            raise NotReadyError
        self._verify(self._coordinator, message)
        if self._finishing or self._end is not None:
            return
        self._end = message
        logger.info(
            "%s: the federation is over after %d rounds (final version %s)",
            self.device_id,
            message.rounds,
            message.model_version,
        )
        trainer = self._model_trainer()
        if message.model is None or trainer is None or message.model != trainer.model:
            self._finish(message, None)
            return
        version = message.model_version
        assert version is not None and message.transfer_id is not None
        if message.weights is not None:
            try:
                arrays = arrays_from_bytes(message.weights, self._model_arrays)
            except WeightsError as exc:
                logger.warning(
                    "%s: inline final model refused: %s", self.device_id, exc
                )
            else:
                self._finish(message, arrays)
                return
        if self._model_version == version and self._model_arrays is not None:
            self._finish(message, self._model_arrays)
            return
        self._want(version, message.transfer_id)  # `_on_model_ready` finishes

    def _on_model_ready(self) -> None:
        super()._on_model_ready()
        end = self._end
        if end is None or self._finishing or self._model_arrays is None:
            return
        if self._model_version == end.model_version:
            self._finish(end, self._model_arrays)

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
        if arrays is None:
            self._finished(message, None, None)
            return
        weights = self._save_weights(message, arrays)
        if weights is None:
            self._finished(message, None, None)
            return
        threading.Thread(
            target=self._export_then_finish,
            args=(message, arrays, weights),
            name=f"ursa-final-{self.device_id}",
            daemon=True,
        ).start()

    def _export_then_finish(
        self, message: FederationEnd, arrays: Arrays, weights: Path
    ) -> None:
        onnx_path: Path | None = None
        try:
            onnx = onnx_of(self._trainer, arrays)
            if onnx is not None:
                onnx_path = weights.parent / ONNX_FILENAME
                partial = onnx_path.with_suffix(".onnx.part")
                partial.write_bytes(onnx)
                os.replace(partial, onnx_path)  # a reader never sees half a file
        except Exception:  # the exporter's many errors, a full disk
            logger.exception("%s: final model not exported to ONNX", self.device_id)
            onnx_path = None
        logger.info(
            "%s: final model version %s saved in %s%s",
            self.device_id,
            message.model_version,
            weights.parent,
            "" if onnx_path is None else " (with ONNX)",
        )
        with self._lock:
            self._finished(message, weights, onnx_path)

    def _finished(
        self, message: FederationEnd, weights: Path | None, onnx: Path | None
    ) -> None:
        event = Finished(
            message.rounds, message.model_version, weights, onnx, dict(message.metrics)
        )
        self._notify_finished(event)
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
            weights = folder / WEIGHTS_FILENAME
            weights.write_bytes(arrays_to_bytes(arrays))
            (folder / FINAL_INFO_FILENAME).write_text(json.dumps(info, indent=2))
        except OSError as exc:
            logger.error("%s: could not save the final model: %s", self.device_id, exc)
            return None
        return weights
