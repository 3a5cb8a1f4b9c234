"""Export a registry model to ONNX and check onnxruntime against torch on it.

What the coordinator's final model and the demo's report both need: the
ONNX bytes, and evidence they compute what torch computes (the same class
for every sample, the largest logit difference) on the samples given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ursa.models.inference import OnnxClassifier
from ursa.models.onnx_export import export_arrays_to_onnx
from ursa.models.registry import build_model, load_arrays
from ursa.models.weights import Arrays

__all__ = ["checked_onnx"]


def checked_onnx(
    architecture: str,
    model_config: Mapping[str, Any],
    arrays: Arrays,
    x: npt.NDArray[np.float32],
) -> tuple[bytes, dict[str, Any]]:
    """The ONNX bytes and how onnxruntime agrees with torch on ``x``."""
    onnx_bytes = export_arrays_to_onnx(architecture, model_config, arrays)
    model = build_model(architecture, model_config, seed=0)
    load_arrays(model, arrays)
    model.eval()
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(np.asarray(x, np.float32))).numpy()
    onnx_logits = OnnxClassifier(onnx_bytes).logits(x)
    torch_pred = torch_logits.argmax(axis=1)
    onnx_pred = onnx_logits.argmax(axis=1)
    check = {
        "identical": bool(np.array_equal(torch_pred, onnx_pred)),
        "agreement": float((torch_pred == onnx_pred).mean()),
        "samples": len(x),
        "max_abs_logit_diff": float(np.abs(torch_logits - onnx_logits).max()),
        "onnx_bytes": len(onnx_bytes),
    }
    return onnx_bytes, check
