"""FedProx's coordinator half: config, mu signed into each key epoch, a federation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from pydantic import ValidationError

pytest.importorskip("torch")  # the federation here trains: torch-free Pythons skip

from tests.mu_recording_trainer import MuRecordingTrainer
from ursa.coordinator.config import CoordinatorConfig, TrainingSection
from ursa.coordinator.methods_config import DubheSpec, FedProxSpec
from ursa.coordinator.plugin import CoordinatorView, NoSteps, PluginContext
from ursa.coordinator.training import TrainingPlugin
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.methods.fedprox import FedProx
from ursa.edge_sdk.methods_config import DubheDeviceSpec as DeviceDubheSpec
from ursa.edge_sdk.methods_config import FedProxDeviceSpec as DeviceFedProxSpec
from ursa.edge_sdk.training import TrainConfig
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import KeyEpochStart, MethodSetting
from ursa.tools import compose
from ursa.tools.data.loaders import load_digits

MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}


def _config(tmp_path: Path, methods: list[dict[str, Any]]) -> CoordinatorConfig:
    return CoordinatorConfig.model_validate(
        {"federation": "f", "state_dir": tmp_path / "c", "methods": methods}
    )


def test_the_table_defaults_mu_and_signs_it_beside_the_names(tmp_path: Path) -> None:
    config = _config(tmp_path, [{"kind": "dubhe"}, {"kind": "fedprox"}])
    assert config.training_method() == FedProxSpec(mu=0.01)
    assert config.method_names() == ("dubhe", "fedprox")
    assert config.method_settings() == (
        MethodSetting(method="fedprox", name="mu", value=0.01),
    )
    fedavg = _config(tmp_path, [{"kind": "dubhe"}, {"kind": "fedavg"}])
    assert fedavg.method_settings() == ()


@pytest.mark.parametrize("mu", [-0.5, 10.01, float("nan"), float("inf"), "x"])
def test_a_bad_mu_is_refused_at_load(tmp_path: Path, mu: Any) -> None:
    with pytest.raises(ValidationError, match="mu"):
        _config(tmp_path, [{"kind": "dubhe"}, {"kind": "fedprox", "mu": mu}])


def test_a_fedprox_table_has_only_mu(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="weights"):
        _config(tmp_path, [{"kind": "dubhe"}, {"kind": "fedprox", "weights": "equal"}])


def test_the_plugin_aggregates_as_fedavg_and_runs_fedprox(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        federation="f",
        state_dir=tmp_path / "c",
        methods=(DubheSpec(), FedProxSpec(mu=1.0)),
        training={"architecture": "mlp", "model_options": MODEL},
    )
    build = compose.training_plugin(config)
    assert build is not None and compose.before_training_steps(config) == []
    plugin = build(PluginContext(cast(CoordinatorView, object()), NoSteps()))
    assert isinstance(plugin, TrainingPlugin)
    assert plugin.methods() == ("fedprox",)
    assert plugin.weighting == "fedavg"


def test_settings_must_belong_to_a_listed_method() -> None:
    with pytest.raises(ValidationError, match="listed methods"):
        KeyEpochStart.model_validate(
            {
                **_notice_fields(),
                "methods": ("dubhe", "fedavg"),
                "method_settings": [{"method": "fedprox", "name": "mu", "value": 0.1}],
            }
        )
    twice = [{"method": "fedprox", "name": "mu", "value": 0.1}] * 2
    with pytest.raises(ValidationError, match="unique"):
        KeyEpochStart.model_validate(
            {**_notice_fields(), "methods": ("fedprox",), "method_settings": twice}
        )


def _notice_fields() -> dict[str, Any]:
    keys = {
        "device_id": "d0",
        "x25519_public": b"\x01" * 32,
        "ed25519_public": b"\x02" * 32,
    }
    return {
        "federation": "f",
        "round": 0,
        "sender": "coordinator",
        "epoch": 1,
        "agent": "d0",
        "agent_keys": keys,
        "num_classes": 10,
        "groups": (10,),
        "sigma": (0.0,),
        "max_parties": 100,
    }


def test_a_fedprox_federation_in_memory_trains_with_the_signed_mu(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, rounds=2)
    fed.coordinator.stop()  # the fixture's is selection-only: one that trains
    fed.config = fed.config.model_copy(
        update={
            "methods": (DubheSpec(), FedProxSpec(mu=0.5)),
            "training": TrainingSection(architecture="mlp", model_options=MODEL),
        }
    )
    fed.coordinator = compose.build_coordinator(
        fed.config,
        transport=InMemoryTransport(fed.bus, "coordinator"),
        clock=fed.clock,
    )
    data = load_digits()
    x, y = data.flat()[:400], data.y[:400]
    parts = np.array_split(np.argsort(y, kind="stable"), 4)
    fed.coordinator.start()
    trainers: dict[str, MuRecordingTrainer] = {}
    for i, device_id in enumerate(fed.device_ids):
        config = fed.device_config(device_id).model_copy(
            update={"methods": (DeviceDubheSpec(), DeviceFedProxSpec())}
        )
        topic, payload = device_will(config)
        transport = InMemoryTransport(fed.bus, device_id, will=(topic, payload, True))
        trainers[device_id] = MuRecordingTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=1, batch_size=16, lr=0.1),
            seed=i,
        )
        client = EdgeClient(
            config,
            y[parts[i]],
            trainer=trainers[device_id],
            transport=transport,
            rng=np.random.default_rng(i),
        )
        fed.devices[device_id] = client
        client.start()
    for _ in range(200):
        if fed.coordinator.is_done:
            break
        fed.settle()
        fed.tick(1)
        for client in fed.devices.values():
            client.poll()

    assert fed.coordinator.is_done
    notice = fed.messages("key_epoch_start")[0][1]
    verify_signature(fed.coordinator.identity, signing_bytes(notice), notice.signature)
    assert notice.methods == ("dubhe", "fedprox")
    assert notice.method_setting("fedprox", "mu") == 0.5
    assert {d.methods() for d in fed.devices.values()} == {("dubhe", "fedprox")}
    assert all(isinstance(d.method(FedProx), FedProx) for d in fed.devices.values())
    trained = [mu for t in trainers.values() for mu in t.mus.values()]
    assert trained == [0.5] * 4  # K devices in each of the 2 rounds
    assert fed.messages("masked_update")  # the sum is FedAvg's, under masks
