"""The end of the federation on a device: which final models it saves."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.edge_sdk.trainers import ShapedTrainer
from ursa.edge_sdk.federation_end import EndOfFederation
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.messages import COORDINATOR, FederationEnd

FINAL: Arrays = {"w": np.ones((3, 4), dtype=np.float32)}


class _NoDownloads:
    model_version: int | None = None
    model_arrays: Arrays | None = None

    def want(self, version: int, transfer_id: str) -> None:
        raise AssertionError("the final model came inline")


def _end(tmp_path: Path, trainer: ModelTrainer, *, sits_out: bool) -> EndOfFederation:
    end = EndOfFederation(
        device_id="d0",
        final_dir=tmp_path / "final",
        trainer=trainer,
        models=_NoDownloads(),
        sits_out=lambda: sits_out,
        lock=threading.RLock(),
        callbacks=None,
    )
    end.on_federation_end(
        FederationEnd(
            federation="fed",
            round=3,
            sender=COORDINATOR,
            rounds=3,
            model="classifier",
            model_version=3,
            transfer_id="t" * 16,
            weights=arrays_to_bytes(FINAL),
        )
    )
    assert end.finished.wait(10)
    return end


def test_a_fitting_device_saves_the_final_model(tmp_path: Path) -> None:
    end = _end(tmp_path, ShapedTrainer((3, 4)), sits_out=False)
    assert (end.final_dir / "model.ursw").read_bytes() == arrays_to_bytes(FINAL)


def test_a_device_that_sat_the_epoch_out_saves_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    end = _end(tmp_path, ShapedTrainer((3, 4)), sits_out=True)
    assert not end.final_dir.exists()
    assert "d0: no final model saved: this device sat the key epoch out" in caplog.text


def test_a_final_model_its_own_model_cannot_load_is_not_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    end = _end(tmp_path, ShapedTrainer((5, 4)), sits_out=False)
    assert not end.final_dir.exists()
    assert "final model not saved: it does not fit this device's model: " in (
        caplog.text
    )
    assert "tensor 'w'" in caplog.text
