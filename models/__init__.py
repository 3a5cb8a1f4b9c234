"""Torch models, weight (de)serialisation, ONNX export and onnxruntime inference.

Only the torch-free parts are exported here (weights on the wire, ONNX
inference), so `import ursa.models` works on the coordinator and on an
inference-only device. The torch models live in their submodules
(`ursa.models.registry`, `mlp`, `cnn`, `made`, `onnx_export`).
"""

from ursa.models.inference import InferenceError, OnnxClassifier
from ursa.models.weights import (
    Arrays,
    WeightsError,
    WeightsFormatError,
    WeightsMismatchError,
    WeightsSpecError,
    arrays_from_bytes,
    arrays_to_bytes,
)

__all__ = [
    "Arrays",
    "InferenceError",
    "OnnxClassifier",
    "WeightsError",
    "WeightsFormatError",
    "WeightsMismatchError",
    "WeightsSpecError",
    "arrays_from_bytes",
    "arrays_to_bytes",
]
