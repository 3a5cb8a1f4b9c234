"""`ursa.coordinator.federation_end`: the end message and the final model's files."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.federation_end import (
    FinalModel,
    end_message,
    end_metrics,
    write_final_model,
)
from ursa.coordinator.model_store import UnsafeModelError
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import MAX_CHUNK_SIZE, FederationEnd

ARRAYS: Arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}


def final(payload: bytes | None = None, **metrics: Any) -> FinalModel:
    data = arrays_to_bytes(ARRAYS) if payload is None else payload
    return FinalModel("classifier", 7, "t" * 32, data, ARRAYS, metrics)


def test_metrics_keep_finite_named_numbers_only() -> None:
    got = end_metrics(
        {
            "accuracy": 0.9,
            "loss": float("nan"),
            "per_class": [1.0],
            "Bad": 1.0,
            "ok": True,
            "rounds": 3,
        }
    )
    assert got == {"accuracy": 0.9, "rounds": 3.0}


def test_the_end_carries_the_model_inline_when_it_fits_a_chunk() -> None:
    message = end_message("fed", 5, final(accuracy=0.8))
    again = decode(encode(message))
    assert isinstance(again, FederationEnd)
    assert (again.rounds, again.model_version, again.metrics) == (
        5,
        7,
        {"accuracy": 0.8},
    )
    assert again.weights == arrays_to_bytes(ARRAYS)
    big = end_message("fed", 5, final(b"x" * (MAX_CHUNK_SIZE + 1)))
    assert big.weights is None and big.transfer_id == "t" * 32
    bare = end_message("fed", 0, None)
    assert bare.model is None and bare.transfer_id is None


def test_a_model_is_named_whole() -> None:
    with pytest.raises(ValueError, match="together"):
        FederationEnd(
            federation="f", round=1, sender="coordinator", rounds=1, model="m"
        )


def test_the_final_model_is_written_with_its_card(tmp_path: Path) -> None:
    def export(arrays: Arrays) -> tuple[bytes, Mapping[str, Any]]:
        return b"onnx!", {"identical": True}

    written = write_final_model(
        tmp_path / "out",
        final(accuracy=0.5),
        rounds=3,
        methods=("dubhe", "fedavg"),
        architecture={"name": "mlp", "input_shape": [3]},
        export=export,
    )
    assert written == ["model.ursw", "model.onnx", "model_card.json"]
    card = json.loads((tmp_path / "out" / "model_card.json").read_text())
    assert card["version"] == 7 and card["rounds"] == 3
    assert card["methods"] == ["dubhe", "fedavg"]
    assert card["evaluation"] == {"accuracy": 0.5}
    assert card["architecture"]["input_shape"] == [3]
    assert card["onnx_check"] == {"identical": True}
    assert (tmp_path / "out" / "model.ursw").read_bytes() == arrays_to_bytes(ARRAYS)


def test_a_failing_exporter_is_noted_not_raised(tmp_path: Path) -> None:
    def export(arrays: Arrays) -> tuple[bytes, Mapping[str, Any]]:
        raise ImportError("no torch")

    written = write_final_model(tmp_path, final(), rounds=1, methods=(), export=export)
    assert written == ["model.ursw", "model_card.json"]
    card = json.loads((tmp_path / "model_card.json").read_text())
    assert card["onnx_error"] == "ImportError: no torch"


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_final_model_cannot_be_made(bad: float) -> None:
    arrays = {"w": ARRAYS["w"].copy()}
    arrays["w"][0, 0] = bad
    with pytest.raises(UnsafeModelError):
        FinalModel("classifier", 7, "t" * 32, arrays_to_bytes(arrays), arrays)
