"""Export a torch model to ONNX bytes for onnxruntime inference on devices.

Uses the TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``):
the default dynamo exporter of torch >= 2.9 needs the ``onnxscript`` package,
which the ``train`` extra does not install. The legacy exporter's
DeprecationWarnings are silenced inside the call only. The graph has one input
``"x"`` of shape ``(batch, *input_shape)`` (batch dynamic) and one output
``"logits"``. The exporter keeps global state (``GLOBALS.in_onnx_export``),
so exports in one process are serialised: several devices in one process (a
gateway app, `ursa bench learning`) otherwise fail each other's export.
"""

from __future__ import annotations

import tempfile
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ursa.models.registry import build_model, input_shape_of, load_arrays
from ursa.models.weights import FloatArray

DEFAULT_OPSET = 17
INPUT_NAME = "x"
OUTPUT_NAME = "logits"
_EXPORT_LOCK = threading.Lock()


class OnnxExportError(RuntimeError):
    """torch could not export the model to ONNX."""


def export_onnx(
    model: nn.Module, input_shape: tuple[int, ...], *, opset: int = DEFAULT_OPSET
) -> bytes:
    """Export ``model`` (in eval mode) to ONNX bytes.

    Args:
        model: a classifier returning logits.
        input_shape: shape of one sample, without the batch dimension.
        opset: ONNX opset version.

    Raises:
        OnnxExportError: the exporter failed.
    """
    if not input_shape or any(d <= 0 for d in input_shape):
        raise ValueError(f"input_shape must be non-empty and positive: {input_shape}")
    was_training = model.training
    model.eval()
    example = torch.zeros((1, *input_shape), dtype=torch.float32)
    # a file, not a BytesIO: torch types the exporter's `f` as a path
    with tempfile.TemporaryDirectory(prefix="ursa-onnx-") as folder:
        path = Path(folder) / "model.onnx"
        try:
            with _EXPORT_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(
                    model,
                    (example,),
                    str(path),
                    dynamo=False,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                    opset_version=opset,
                )
        except Exception as exc:  # the exporter raises many internal types
            raise OnnxExportError(f"ONNX export failed: {exc}") from exc
        finally:
            model.train(was_training)
        return path.read_bytes()


def export_arrays_to_onnx(
    name: str,
    config: Mapping[str, Any],
    arrays: Mapping[str, FloatArray],
    *,
    opset: int = DEFAULT_OPSET,
) -> bytes:
    """Build model ``name`` from ``config``, load ``arrays`` and export it to ONNX."""
    model = build_model(name, config, seed=0)
    load_arrays(model, arrays)
    return export_onnx(model, input_shape_of(name, config), opset=opset)
