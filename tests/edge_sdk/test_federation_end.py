"""The end of the federation on a device: which final models it saves, and a
kept-running device finishing each run once (`EndOfFederation`)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.edge_sdk.trainers import PlainTrainer, ShapedTrainer
from ursa.edge_sdk.federation_end import EndOfFederation
from ursa.edge_sdk.trainer import ModelTrainer
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.messages import COORDINATOR, FederationEnd

FINAL: Arrays = {"w": np.ones((3, 4), dtype=np.float32)}


class _NoDownloads:
    """The downloads when the final model comes inline: nothing is held."""

    model_version: int | None = None
    model_arrays: Arrays | None = None

    def want(self, version: int, transfer_id: str) -> None:
        raise AssertionError("the final model came inline")


class _Held:
    """The downloads: version 1 (`FINAL`) is here."""

    model_version: int | None = 1
    model_arrays: Arrays | None = FINAL

    def want(self, version: int, transfer_id: str) -> None:
        raise AssertionError("the final version is held")


class _SlowExport(PlainTrainer):
    """A trainer whose ONNX export waits until the test lets it go."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def onnx(self, arrays: Arrays) -> bytes | None:
        assert self.release.wait(10)
        return None


def _end_of_federation(
    tmp_path: Path,
    trainer: ModelTrainer,
    *,
    models: _NoDownloads | _Held,
    sits_out: bool = False,
) -> EndOfFederation:
    """The one way these tests build it: device d0, final models in ``final``."""
    return EndOfFederation(
        device_id="d0",
        final_dir=tmp_path / "final",
        trainer=trainer,
        models=models,
        sits_out=lambda: sits_out,
        lock=threading.RLock(),
        callbacks=None,
    )


def _federation_end(
    rounds: int, *, model_version: int, weights: bytes | None = None
) -> FederationEnd:
    return FederationEnd(
        federation="fed",
        round=rounds,
        sender=COORDINATOR,
        rounds=rounds,
        model="classifier",
        model_version=model_version,
        transfer_id="t" * 16,
        weights=weights,
    )


def _finished_inline(
    tmp_path: Path, trainer: ModelTrainer, *, sits_out: bool
) -> EndOfFederation:
    """An end whose final model (`FINAL`, version 3) came inline, taken."""
    end = _end_of_federation(
        tmp_path, trainer, models=_NoDownloads(), sits_out=sits_out
    )
    end.on_federation_end(
        _federation_end(3, model_version=3, weights=arrays_to_bytes(FINAL))
    )
    assert end.finished.wait(10)
    return end


def _export_thread() -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == "ursa-final-d0"]
    return thread


def test_a_fitting_device_saves_the_final_model(tmp_path: Path) -> None:
    end = _finished_inline(tmp_path, ShapedTrainer((3, 4)), sits_out=False)
    assert (end.final_dir / "model.ursw").read_bytes() == arrays_to_bytes(FINAL)


def test_a_device_that_sat_the_epoch_out_saves_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    end = _finished_inline(tmp_path, ShapedTrainer((3, 4)), sits_out=True)
    assert not end.final_dir.exists()
    assert "d0: no final model saved: this device sat the key epoch out" in caplog.text


def test_a_final_model_its_own_model_cannot_load_is_not_saved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    end = _finished_inline(tmp_path, ShapedTrainer((5, 4)), sits_out=False)
    assert not end.final_dir.exists()
    assert "final model not saved: it does not fit this device's model: " in (
        caplog.text
    )
    assert "tensor 'w'" in caplog.text


def test_an_export_of_the_old_run_finishes_nothing_once_a_new_run_is_joined(
    tmp_path: Path,
) -> None:
    trainer = _SlowExport()
    end = _end_of_federation(tmp_path, trainer, models=_Held())
    end.on_federation_end(_federation_end(3, model_version=1))
    exporting = _export_thread()  # the weights are saved; the export runs
    assert (tmp_path / "final" / "model.ursw").is_file()
    end.new_run()  # the coordinator's next run, joined meanwhile
    trainer.release.set()
    exporting.join(10)
    assert not end.finished.is_set()  # the old run's export ended nothing

    end.on_federation_end(_federation_end(5, model_version=1))  # the new run's end
    assert end.finished.wait(10)
    assert '"rounds": 5' in (tmp_path / "final" / "final.json").read_text()
