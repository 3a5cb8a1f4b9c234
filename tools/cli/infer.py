"""``ursa device run --infer``: serve the latest final model on stdin/stdout.

The device takes part in the federation as usual (in a thread); the command
reads samples from stdin, one per line (numbers separated by commas or
spaces, a sample flattened), and prints one predicted class per line on
stdout. Lines that come before the device has a final model wait for it
(the end of the federation, or a model saved by an earlier run). Before
each line the model file is checked: a newer final model (a later
federation) is loaded. A line that does not fit the model is answered on
stderr (``line N: why``) and skipped. End of input stops the device and
exits 0. Only onnxruntime is used (the ``infer`` extra), never torch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import numpy as np

from ursa.edge_sdk.inference import InferenceError, InferenceModel, load

__all__ = ["ModelWatch", "parse_row", "serve_lines"]

logger = logging.getLogger("ursa.tools.cli")


def parse_row(line: str) -> np.ndarray | None:
    """One sample from a line of numbers (None for a blank line).

    Raises:
        ValueError: a field is not a finite number.
    """
    fields = line.replace(",", " ").split()
    if not fields:
        return None
    row = np.array([float(f) for f in fields], dtype=np.float32)
    if not np.isfinite(row).all():
        raise ValueError("not a finite number")
    return row


class ModelWatch:
    """The ONNX file of the final model, reloaded when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._model: InferenceModel | None = None

    def current(self) -> InferenceModel | None:
        """The model in the file now (None while there is none)."""
        try:
            stat = self.path.stat()
        except OSError:
            return self._model
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            try:
                self._model = load(self.path)
            except InferenceError as exc:
                logger.warning("final model not loaded: %s", exc)
                return self._model
            self._stamp = stamp
            logger.info("serving %s (input %s)", self.path, self._model.input_shape)
        return self._model


def serve_lines(
    lines: Iterable[str],
    watch: ModelWatch,
    out: TextIO,
    err: TextIO,
    *,
    ready: threading.Event,
    stop: threading.Event,
    wait_s: float = 0.5,
) -> int:
    """Answer every line with a class; returns the number of lines answered."""
    answered = 0
    for number, line in enumerate(lines, start=1):
        try:
            row = parse_row(line)
        except ValueError as exc:
            print(f"line {number}: {exc}", file=err, flush=True)
            continue
        if row is None:
            continue
        model = watch.current()
        while model is None and not stop.is_set():
            ready.wait(wait_s)
            model = watch.current()
        if model is None:
            return answered
        try:
            label = int(model.predict(row[None])[0])
        except InferenceError as exc:
            print(f"line {number}: {exc}", file=err, flush=True)
            continue
        print(label, file=out, flush=True)
        answered += 1
    return answered
