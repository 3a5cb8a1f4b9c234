"""`EndOfFederation` across runs: a kept-running device finishes each run once."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ursa.edge_sdk.federation_end import EndOfFederation
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import COORDINATOR, FederationEnd

ARRAYS: Arrays = {"w": np.ones((2, 2), dtype=np.float32)}


class _SlowExport(ModelTrainer):
    """A trainer whose ONNX export waits until the test lets it go."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        return LocalDelta(dict(global_arrays), 1)

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.0

    def onnx(self, arrays: Arrays) -> bytes | None:
        assert self.release.wait(10)
        return None


class _Held:
    """The downloads: version 1 is here."""

    model_version: int | None = 1
    model_arrays: Arrays | None = ARRAYS

    def want(self, version: int, transfer_id: str) -> None:
        raise AssertionError("the final version is held")


def _end(rounds: int) -> FederationEnd:
    return FederationEnd(
        federation="f",
        round=rounds,
        sender=COORDINATOR,
        rounds=rounds,
        model="classifier",
        model_version=1,
        transfer_id="t" * 32,
    )


def _export_thread() -> threading.Thread:
    (thread,) = [t for t in threading.enumerate() if t.name == "ursa-final-d0"]
    return thread


def test_an_export_of_the_old_run_finishes_nothing_once_a_new_run_is_joined(
    tmp_path: Path,
) -> None:
    trainer = _SlowExport()
    end = EndOfFederation(
        device_id="d0",
        final_dir=tmp_path / "final",
        trainer=trainer,
        models=_Held(),
        sits_out=lambda: False,
        lock=threading.RLock(),
        callbacks=None,
    )
    end.on_federation_end(_end(3))
    exporting = _export_thread()  # the weights are saved; the export runs
    assert (tmp_path / "final" / "model.ursw").is_file()
    end.new_run()  # the coordinator's next run, joined meanwhile
    trainer.release.set()
    exporting.join(10)
    assert not end.finished.is_set()  # the old run's export ended nothing

    end.on_federation_end(_end(5))  # the new run's end is taken
    assert end.finished.wait(10)
    assert '"rounds": 5' in (tmp_path / "final" / "final.json").read_text()
