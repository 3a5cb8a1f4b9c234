"""The end of a federation: what the coordinator announces and what it writes.

When the rounds are done the runtime asks its `RoundPlugin` for the final
model (`FinalModel`: the training plugin publishes its chunks first), signs a
`FederationEnd` (`end_message`) and publishes it retained. With an output
folder it also writes the final model for people and other tools
(`write_final_model`): ``model.ursw`` (the weights file), ``model_card.json``
(model, version, rounds, methods, evaluation, and the architecture and input
shape when known) and ``model.onnx`` when an exporter is given (it needs
torch; the coordinator does not). Pure but for the writing.

A `FinalModel` that holds NaN or inf cannot be made (`UnsafeModelError`): no
such model is announced or written, whatever the plugin holds.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ursa.coordinator.model_store import check_model
from ursa.models.weights import WEIGHTS_FILENAME, Arrays
from ursa.protocol.messages import (
    COORDINATOR,
    MAX_CHUNK_SIZE,
    MAX_END_METRICS,
    NAME_PATTERN,
    FederationEnd,
)

__all__ = [
    "CARD_FILENAME",
    "ONNX_FILENAME",
    "WEIGHTS_FILENAME",
    "FinalModel",
    "FinalOutput",
    "OnnxExporter",
    "end_message",
    "end_metrics",
    "fits_inline",
    "write_final_model",
]

ONNX_FILENAME = "model.onnx"
CARD_FILENAME = "model_card.json"

_NAME = re.compile(NAME_PATTERN)

OnnxExporter = Callable[[Arrays], tuple[bytes, Mapping[str, Any]]]
"""``export(arrays) -> (ONNX bytes, how onnxruntime agreed with torch)``
(built where the architecture is known: it needs torch)."""


@dataclass(frozen=True)
class FinalModel:
    """The federation's final model as the training plugin holds it."""

    model: str
    version: int
    transfer_id: str
    payload: bytes
    """The weights file (`ursa.models.weights`)."""
    arrays: Arrays
    metrics: Mapping[str, Any] = field(default_factory=dict)
    """The last round's evaluation (the operator's ``evaluate`` hook)."""

    def __post_init__(self) -> None:
        """Refuse a final model no one may be handed.

        Raises:
            UnsafeModelError: an array holds NaN or inf.
        """
        check_model(self.arrays)


@dataclass(frozen=True)
class FinalOutput:
    """What the coordinator knows of the model's architecture, for its output."""

    card: Mapping[str, Any]
    """Put into the model card (architecture, options, input shape, classes)."""
    export: OnnxExporter | None = None


def end_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The figures a `FederationEnd` can carry: named, finite numbers, at most 32."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if len(out) >= MAX_END_METRICS:
            break
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if _NAME.match(name) and math.isfinite(value):
            out[name] = float(value)
    return out


def fits_inline(payload: bytes) -> bool:
    """Whether a final model's bytes ride in the `FederationEnd` itself (one chunk).

    Then every device has it with the notice, and no transfer of it is sent.
    """
    return 0 < len(payload) <= MAX_CHUNK_SIZE


def end_message(
    federation: str, rounds: int, final: FinalModel | None
) -> FederationEnd:
    """The (unsigned) `FederationEnd`; the weights inline when they fit a chunk."""
    if final is None:
        return FederationEnd(
            federation=federation, round=rounds, sender=COORDINATOR, rounds=rounds
        )
    inline = fits_inline(final.payload)
    return FederationEnd(
        federation=federation,
        round=rounds,
        sender=COORDINATOR,
        rounds=rounds,
        model=final.model,
        model_version=final.version,
        transfer_id=final.transfer_id,
        weights=final.payload if inline else None,
        metrics=end_metrics(final.metrics),
    )


def write_final_model(
    folder: Path,
    final: FinalModel,
    *,
    rounds: int,
    methods: Sequence[str],
    architecture: Mapping[str, Any] | None = None,
    export: OnnxExporter | None = None,
) -> list[str]:
    """Write the weights, the model card and (with ``export``) the ONNX model.

    ``architecture`` is what the card says about the model (e.g. its
    registry name, options, input shape and classes). Returns the files
    written; an exporter that fails is noted in the card, not raised.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WEIGHTS_FILENAME).write_bytes(final.payload)
    written = [WEIGHTS_FILENAME]
    card: dict[str, Any] = {
        "model": final.model,
        "version": final.version,
        "rounds": rounds,
        "methods": list(methods),
        "evaluation": end_metrics(final.metrics),
        "arrays": {k: list(v.shape) for k, v in final.arrays.items()},
        "files": {"weights": WEIGHTS_FILENAME},
    }
    if architecture is not None:
        card["architecture"] = dict(architecture)
    if export is not None:
        try:
            onnx, check = export(final.arrays)
        except Exception as exc:  # no torch, or the exporter's many errors
            card["onnx_error"] = f"{type(exc).__name__}: {exc}"[:256]
        else:
            (folder / ONNX_FILENAME).write_bytes(onnx)
            written.append(ONNX_FILENAME)
            card["files"]["onnx"] = ONNX_FILENAME
            card["onnx_check"] = dict(check)
    (folder / CARD_FILENAME).write_text(json.dumps(card, indent=2, sort_keys=True))
    written.append(CARD_FILENAME)
    return written
