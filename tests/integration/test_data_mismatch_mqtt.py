"""A device whose data or model does not fit sits out over a real Mosquitto.

It sits the key epoch out before any selection, so no round waits on it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import CoordinatorConfig, DeadlinesConfig
from ursa.coordinator.methods_config import FedAvgSpec, RandomSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.status import read_status
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.methods_config import FedAvgDeviceSpec as DeviceFedAvgSpec
from ursa.edge_sdk.methods_config import RandomDeviceSpec as DeviceRandomSpec
from ursa.models.weights import arrays_to_bytes

from .conftest import device_labels, polling

pytestmark = pytest.mark.integration

NEVER_S = 3600
"""Every deadline: a run that finishes has waited out none of them."""
DEADLINES = DeadlinesConfig(
    key_epoch_s=NEVER_S,
    registration_s=NEVER_S,
    volunteer_s=NEVER_S,
    distributions_s=NEVER_S,
    agent_s=NEVER_S,
    training_s=NEVER_S,
)


def test_a_misfit_device_answers_data_mismatch_and_is_never_selected(
    mqtt_federation: Any,
) -> None:
    fed = mqtt_federation("itmisfit")
    config = fed.coordinator_config(
        4, k=2, tries=1, rounds=3, methods=(RandomSpec(),), deadlines=DEADLINES
    )
    service = CoordinatorService(config)
    service.start()
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    misfit, *others = fed.device_ids(4)
    for index, device_id in enumerate(fed.device_ids(4)):
        labels = (
            np.r_[np.arange(10), 12] if device_id == misfit else device_labels(index)
        )
        fed.start_device(
            device_id, labels, seed=index, method_specs=(DeviceRandomSpec(),)
        )

    thread.join(timeout=60)
    assert service.is_done, f"stuck at {service.state}"
    refusals = [m for _, m in fed.capture.messages("error") if m.sender == misfit]
    assert {(m.code, m.reason) for m in refusals} == {
        ("data_mismatch", "labels 12 lie outside the federation's 10 classes 0..9")
    }
    chosen = {
        m.round: set(m.selected) for _, m in fed.capture.messages("selection_result")
    }
    assert sorted(chosen) == [1, 2, 3]
    assert all(misfit not in s and len(s) == 2 for s in chosen.values())
    assert fed.clients[misfit].sits_out
    assert not any(fed.clients[d].sits_out for d in others)


@dataclass
class _TorchFederation:
    """Four torch devices training over Mosquitto, the first a misfit."""

    config: CoordinatorConfig
    service: CoordinatorService
    plugin: TrainingPlugin
    thread: threading.Thread
    clients: list[EdgeClient]
    misfit: str


def _torch_federation(
    fed: Any,
    tmp_path: Path,
    model: dict[str, Any],
    misfit_model: dict[str, Any],
) -> _TorchFederation:
    """The coordinator on ``model``, 4 devices; the first trains ``misfit_model``.

    Each device's data has the features its own model takes.
    """
    from ursa.edge_sdk.torch_trainer import TorchTrainer
    from ursa.edge_sdk.training import TrainConfig
    from ursa.models.registry import initial_arrays

    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", model, seed=0)))
    config = fed.coordinator_config(
        4,
        k=2,
        tries=1,
        rounds=3,
        methods=(RandomSpec(), FedAvgSpec()),
        deadlines=DEADLINES,
    )
    build = partial(
        TrainingPlugin,
        federation=config.federation,
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=NEVER_S),
        initial_weights=initial,
    )
    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    misfit = fed.device_ids(4)[0]
    rng = np.random.default_rng(0)
    clients = []
    for index, device_id in enumerate(fed.device_ids(4)):
        own = misfit_model if device_id == misfit else model
        y = device_labels(index)
        trainer = TorchTrainer(
            rng.normal(size=(len(y), own["input_dim"])).astype(np.float32),
            y,
            model_config=own,
            train=TrainConfig(batch_size=32),
            seed=index,
        )
        methods = (DeviceRandomSpec(), DeviceFedAvgSpec())
        clients.append(
            fed.start_device(
                device_id, y, seed=index, trainer=trainer, method_specs=methods
            )
        )
    return _TorchFederation(config, service, plugin, thread, clients, misfit)


def _never_selected(fed: Any, run: _TorchFederation) -> None:
    """Every round ran with two devices, none the misfit, and none dropped one."""
    chosen = {
        m.round: set(m.selected) for _, m in fed.capture.messages("selection_result")
    }
    assert sorted(chosen) == [1, 2, 3]
    assert all(run.misfit not in s and len(s) == 2 for s in chosen.values())
    assert run.plugin.version == 3
    assert all(run.misfit not in r.contributed for r in run.plugin.history)
    assert all(r.dropped == () and r.failed == () for r in run.plugin.history)
    assert fed.clients[run.misfit].sits_out


def test_a_device_with_32_features_sits_out_of_a_64_feature_federation(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("itwide")
    model = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}
    run = _torch_federation(fed, tmp_path, model, {**model, "input_dim": 32})

    with polling(run.clients):
        run.thread.join(timeout=60)
    assert run.service.is_done, f"stuck at {run.service.state}"
    refusals = [m for _, m in fed.capture.messages("error") if m.sender == run.misfit]
    reason = "samples have 32 features; the federation's model classifier takes 64"
    assert {(m.code, m.reason) for m in refusals} == {("data_mismatch", reason)}
    _never_selected(fed, run)  # out at the key epoch, before round 1


def test_a_device_with_a_wrong_shaped_model_sits_out_at_the_key_epoch(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    """It names the tensor before any selection, trains nothing, saves no model."""
    fed = mqtt_federation("itshape")
    model = {"input_dim": 16, "num_classes": 10, "hidden_sizes": [8]}
    run = _torch_federation(fed, tmp_path, model, {**model, "hidden_sizes": [12]})
    misfit = run.misfit

    with polling(run.clients):
        run.thread.join(timeout=60)
        fed.capture.wait_for(
            lambda: all(c.finished.is_set() for c in run.clients), 30, "the end"
        )
    assert run.service.is_done, f"stuck at {run.service.state}"
    (notice, *_) = [m for _, m in fed.capture.messages("key_epoch_start")]
    assert notice.model_spec is not None and notice.model_spec.model == "classifier"
    refusals = [m for _, m in fed.capture.messages("error") if m.sender == misfit]
    assert [m.code for m in refusals] == ["model_mismatch"]
    assert refusals[0].reason.startswith(
        "the federation's model classifier does not fit this device's model: "
        "tensor 'net.1.weight': shape (12, 16) in this device's model, (8, 16) "
        "in the federation's model"
    )
    assert all(m.sender != misfit for _, m in fed.capture.messages("registration"))
    _never_selected(fed, run)
    assert not (fed.clients[misfit].final_dir / "model.ursw").exists()
    for client in run.clients[1:]:
        assert (client.final_dir / "model.ursw").is_file()
    status = read_status(run.config.state_dir)
    assert status.sitting_out == {misfit: f"model_mismatch: {refusals[0].reason}"}
