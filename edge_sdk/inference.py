"""On-device inference with the federation's final model, on onnxruntime, no torch.

    from ursa.edge_sdk import inference

    model = inference.load(state_dir / "final")   # or a path to model.onnx
    labels = model.predict(rows)                  # NumPy in, class indices out

`load` takes the ONNX file the device saved at the end of the federation
(``<state_dir>/final/model.onnx``, `ursa.edge_sdk.federation_end`) or the one the
coordinator wrote. Only numpy and onnxruntime (the ``infer`` extra) are
imported, so an inference-only device runs without torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from ursa.models.inference import InferenceError, OnnxClassifier

__all__ = ["InferenceError", "InferenceModel", "load"]

ONNX_FILENAME = "model.onnx"


class InferenceModel:
    """A loaded classifier: `predict` labels, `predict_proba` probabilities."""

    def __init__(self, path: Path, classifier: OnnxClassifier) -> None:
        self.path = path
        self._classifier = classifier

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample (a row may also be it flattened)."""
        return self._classifier.input_shape

    def predict(self, x: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The predicted class per sample of ``x`` (``(n, *input_shape)`` or flat).

        Raises:
            InferenceError: ``x`` does not fit the model's input.
        """
        return self._classifier.predict(x)

    def predict_proba(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Class probabilities per sample, ``(n, classes)``."""
        return self._classifier.predict_proba(x)


def load(path: str | Path, *, num_threads: int = 1) -> InferenceModel:
    """Load an ONNX classifier from a file or a folder holding ``model.onnx``.

    Raises:
        InferenceError: no such file, or not a usable ONNX classifier.
        ImportError: onnxruntime is not installed (``pip install 'ursa-fl[infer]'``).
    """
    file = Path(path)
    if file.is_dir():
        file = file / ONNX_FILENAME
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise InferenceError(f"cannot read {file}: {exc.strerror or exc}") from None
    return InferenceModel(file, OnnxClassifier(data, num_threads=num_threads))
