"""A failing trainer does not hold the round up; the end reaches every device.

Over a real Mosquitto: the update deadline is 600 s and the pytest timeout
far below it, so the test passes only if the failure closes the round. The
one round is also the last: every device saves the final model from the
signed, retained `federation_end`, and one that reconnects after the
coordinator has gone gets it from the broker.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import (
    TrainingConfig,
    TrainingPlugin,
    TrainingRoundReport,
)
from ursa.edge_sdk import DeviceCallbacks, DeviceError, EdgeClient, Finished, Selected
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.messages import ErrorCode

from .conftest import polling

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

N = 3
SECRET = "label-7-of-sample-42"
"""Text in the trainer's exception: it must not reach the coordinator."""


class ShiftTrainer(ModelTrainer):
    """A numpy trainer: a small fixed delta (or, failing, an exception)."""

    def __init__(self, *, fails: bool) -> None:
        self.fails = fails

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        if self.fails:
            raise RuntimeError(SECRET)
        delta = {
            k: np.full(np.shape(v), 0.1, np.float32) for k, v in global_arrays.items()
        }
        return LocalDelta(delta, 20)

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.0


class Recorder(DeviceCallbacks):
    """Records errors; its on_selected raises (that must not stop the device)."""

    def __init__(self) -> None:
        self.errors: list[DeviceError] = []
        self.finished: list[Finished] = []

    def on_finished(self, event: Finished) -> None:
        self.finished.append(event)

    def on_selected(self, event: Selected) -> None:
        raise ValueError("a buggy progress display")

    def on_error(self, event: DeviceError) -> None:
        self.errors.append(event)


def test_a_failing_trainer_closes_the_round_before_its_deadline(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("fails")
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes({"w": np.zeros(4, np.float32)}))
    config = fed.coordinator_config(
        N, k=N, tries=2, rounds=1, methods=(DubheSpec(), FedAvgSpec())
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 600})}
    )
    records: list[TrainingRoundReport] = []
    build = partial(
        TrainingPlugin,
        federation="fails",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=600),
        initial_weights=initial,
        on_round=records.append,
    )
    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    ids = fed.device_ids(N)
    failing = ids[0]
    recorder = Recorder()
    clients = []
    for i, device_id in enumerate(ids):
        client = fed.start_device(
            device_id,
            np.arange(10).repeat(3),
            seed=i,
            trainer=ShiftTrainer(fails=device_id == failing),
            callbacks=recorder if device_id == failing else None,
        )
        clients.append(client)
    try:
        with polling(clients):
            fed.capture.wait_for(lambda: bool(records), 100, "round 1 to close")
            fed.capture.wait_for(
                lambda: all(c.finished.is_set() for c in clients), 30, "the end"
            )
    finally:
        service.stop()
        loop.join(5)

    (record,) = records
    assert record.failed == (failing,)
    assert record.contributed == tuple(ids[1:])
    assert record.dropped == ()
    assert record.version == 1
    replies = [m for _, m in fed.capture.messages("error") if m.sender == failing]
    assert [m.code for m in replies] == [ErrorCode.TRAINING_FAILED]
    assert replies[0].round == 1
    assert SECRET not in replies[0].reason and "Traceback" not in replies[0].reason
    assert [(e.code, e.source) for e in recorder.errors] == [
        ("training_failed", "device")
    ]
    (end,) = [m for _, m in fed.capture.messages("federation_end")]
    assert (end.rounds, end.model_version) == (1, 1) and end.signature
    (finished,) = recorder.finished
    assert finished.version == 1 and finished.model_path is not None
    final = clients[1].final_dir / "model.ursw"
    expected = arrays_to_bytes(plugin.global_arrays)
    assert final.read_bytes() == expected

    late = clients[2]  # offline at the end: gets the retained end from the broker
    late.stop()
    (late.final_dir / "model.ursw").unlink()
    again = EdgeClient(
        fed.device_config(late.device_id),
        np.arange(10).repeat(3),
        trainer=ShiftTrainer(fails=False),
    )
    fed.clients["again"] = again
    again.start()
    fed.capture.wait_for(again.finished.is_set, 30, "the retained end")
    assert (again.final_dir / "model.ursw").read_bytes() == expected
