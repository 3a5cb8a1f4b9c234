"""Training rounds over the in-memory bus: FedAvg, CLIMB's step over HE, refusals."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.before_training import BeforeTraining, StepBuilder, StepContext
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec, DubheSpec, FedAvgSpec
from ursa.coordinator.model_store import ModelStore
from ursa.coordinator.plugin import CoordinatorView, NoSteps, PluginContext
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.status import read_status
from ursa.coordinator.training import TrainingConfig, TrainingPlugin, round_figures
from ursa.coordinator.training_health import HEALTH_KEY, TrainingHealth
from ursa.edge_sdk import methods_config as device_specs
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    apply_dual_means_all,
    plain_dual_means,
)
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.spec import check_fits
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import ChunkRequest, ModelUpdate

FED = "fed"

UNREAD = PluginContext(cast(CoordinatorView, object()), NoSteps())
"""A plugin's context no test here reads (a plugin built outside a service)."""

PLAIN = AggregationConfig(mode="plain")
"""These tests check the plain path's wire (updates in the clear, by design)."""


class LinearTrainer(ModelTrainer):
    """A numpy stand-in: a fixed delta per device, a loss that depends on the model."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.num_examples = 10 + 3 * index

    def delta(self, arrays: Arrays) -> Arrays:
        return {
            k: np.full(np.shape(v), 0.01 * (self.index + 1), np.float32)
            - 0.1 * np.asarray(v, np.float32)
            for k, v in arrays.items()
        }

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        delta = {
            k: (v * delta_scale).astype(np.float32)
            for k, v in self.delta(global_arrays).items()
        }
        return LocalDelta(delta, self.num_examples)

    def local_loss(self, global_arrays: Arrays) -> float:
        return 0.3 * (self.index % 3) + 0.5 * float(np.abs(global_arrays["w"]).sum())


INITIAL: Arrays = {
    "w": np.array([0.1, -0.2, 0.3], np.float32),
    "b": np.zeros(2, np.float32),
}


def start_training(
    fed: Any,
    tmp_path: Path,
    config: TrainingConfig,
    *,
    climb: ClimbConfig | None = None,
    prepare: Callable[[EdgeClient], None] | None = None,
    evaluate: Any = None,
    steps: list[StepBuilder] | None = None,
) -> TrainingPlugin:
    """Swap in a coordinator with the training plugin, start it and the devices.

    With ``climb`` the devices run CLIMB and the plugin its dual step; the
    plugin runs ``steps`` after it.
    """
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(INITIAL))
    build = partial(
        TrainingPlugin,
        federation=FED,
        state_dir=fed.config.state_dir,
        config=config,
        initial_weights=initial,
        clock=fed.clock,
        evaluate=evaluate,
    )
    transport = InMemoryTransport(fed.bus, "coordinator")
    method = ClimbSpec() if climb is not None else FedAvgSpec()
    fed.config = fed.config.model_copy(update={"methods": (DubheSpec(), method)})
    fed.coordinator = CoordinatorService(
        fed.config,
        transport=transport,
        clock=fed.clock,
        plugin=build,
        steps=[*climb_steps(climb), *(steps or [])],
    )
    plugin = fed.coordinator.plugin
    assert isinstance(plugin, TrainingPlugin)
    fed.coordinator.start()
    for index, device_id in enumerate(fed.device_ids):
        device_config = fed.device_config(device_id).model_copy(
            update={
                "allow_plain_aggregation": not config.aggregation.secure,
                "methods": device_methods(climb),
            }
        )
        topic, payload = device_will(device_config)
        device_transport = InMemoryTransport(
            fed.bus, device_id, will=(topic, payload, True)
        )
        client = EdgeClient(
            device_config,
            np.arange(10).repeat(3),
            transport=device_transport,
            trainer=LinearTrainer(index),
            rng=np.random.default_rng(index),
        )
        if prepare is not None:
            prepare(client)
        fed.devices[device_id] = client
        fed.transports[device_id] = device_transport
        client.start()
    fed.settle()  # silent devices: each volunteering window runs out
    return plugin


def device_methods(climb: ClimbConfig | None) -> tuple[Any, ...]:
    """The devices' ``[[methods]]``: Dubhe, and CLIMB with ``climb``'s settings."""
    if climb is None:
        return (device_specs.DubheDeviceSpec(), device_specs.FedAvgDeviceSpec())
    settings = device_specs.ClimbDeviceSpec.model_validate(climb.model_dump())
    return (device_specs.DubheDeviceSpec(), settings)


def climb_steps(climb: ClimbConfig | None) -> list[StepBuilder]:
    """CLIMB's dual step when the devices run CLIMB, else none."""
    return [] if climb is None else [ClimbDualStep.later()]


def selections(fed: Any) -> dict[int, tuple[str, ...]]:
    return {m.round: m.selected for _, m in fed.messages("selection_result")}


def fedavg_oracle(fed: Any, rounds: int) -> Arrays:
    chosen = selections(fed)
    return _survivor_oracle(fed, {r: chosen[r] for r in range(1, rounds + 1)})


def test_fedavg_rounds_equal_the_plaintext_running_sum(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)

    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))

    assert fed.coordinator.is_done
    assert plugin.version == 3
    expected = fedavg_oracle(fed, 3)
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    assert [r.contributed for r in plugin.history] == list(selections(fed).values())
    store = ModelStore(fed.config.state_dir, "classifier")
    latest = store.latest()
    assert latest is not None and (latest.version, latest.round) == (3, 3)
    notices = [m for _, m in fed.messages("model_available")]
    assert [(m.round, m.model_version) for m in notices] == [(1, 0), (2, 1), (3, 2)]
    assert fed.messages("mean_request") == []
    assert [r.before_training for r in plugin.history] == [{}] * 3


def climb_oracle(
    fed: Any, rounds: int, config: ClimbConfig
) -> tuple[Arrays, np.ndarray]:
    """The same rounds with plaintext dual means (every device reports)."""
    trainers = [fed.devices[d].data.trainer for d in fed.device_ids]
    lambdas = np.zeros(len(trainers))
    arrays = {k: v.astype(np.float32) for k, v in INITIAL.items()}
    chosen = selections(fed)
    for r in range(1, rounds + 1):
        losses = np.array([t.local_loss(arrays) for t in trainers])
        means = plain_dual_means(losses, lambdas, config)
        weights, lambdas = apply_dual_means_all(losses, lambdas, means, config)
        step = {k: np.zeros(v.shape, np.float64) for k, v in arrays.items()}
        members = [fed.device_ids.index(d) for d in chosen[r]]
        for i in members:
            delta = trainers[i].delta(arrays)
            for k in step:
                step[k] += weights[i] * delta[k].astype(np.float64) / len(members)
        arrays = {k: (arrays[k] + step[k]).astype(np.float32) for k in arrays}
    return arrays, lambdas


def test_climb_over_he_equals_the_plaintext_dual_path(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)
    climb = ClimbConfig(eta_d=0.5, epsilon=0.01)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), climb=climb
    )

    assert fed.coordinator.is_done and plugin.version == 3
    assert plugin.weighting is Weighting.CLIMB and plugin.methods() == ("climb",)
    expected, lambdas = climb_oracle(fed, 3, climb)
    got = np.array([fed.devices[d].method(Climb).lam for d in fed.device_ids])
    np.testing.assert_allclose(got, lambdas, atol=1e-6)
    assert lambdas.max() > 0.1, "the test should move some dual variables"
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    assert [r.before_training for r in plugin.history] == [{"climb": 6}] * 3
    sums = [m for _, m in fed.messages("mean_sum")]
    assert [s.num_parties for s in sums] == [6, 6, 6]
    updates = [m for _, m in fed.messages("model_update")]
    assert updates and all(u.delta_scaled for u in updates)
    for _, stats in fed.messages("mean_report"):  # ciphertexts only
        assert stats.purpose == "climb.dual"
        assert len(stats.ciphertext) > 64 and b"loss" not in stats.ciphertext


def drop_first_selected_update(fed: Any) -> Callable[[str, str, str, bytes], bool]:
    """Lose every model update of the first device selected in round 1."""

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        chosen = selections(fed).get(1)
        return (
            chosen is not None
            and sender == chosen[0]
            and topic.endswith("/up/control")
            and decode(payload).kind == "model_update"
        )

    return drop


def test_silent_device_is_dropped_at_the_deadline(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    fed.bus.drop_filter = drop_first_selected_update(fed)
    config = TrainingConfig(aggregation=PLAIN, update_timeout_s=5.0)
    caplog.set_level(logging.WARNING, logger="ursa.coordinator.training")

    plugin = start_training(fed, tmp_path, config)
    silent = selections(fed)[1][0]
    assert not fed.coordinator.is_done
    fed.tick(6.0)

    assert fed.coordinator.is_done and plugin.version == 1
    (record,) = plugin.history
    assert record.dropped == (silent,)
    assert silent not in record.contributed and len(record.contributed) == 2
    assert f"dropped silent devices ('{silent}',)" in caplog.text


def test_wrong_version_and_duplicate_updates_are_refused_with_a_reason(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    fed.bus.drop_filter = drop_first_selected_update(fed)
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))
    chosen = selections(fed)[1]
    silent, other = chosen[0], chosen[1]
    assert not fed.coordinator.is_done
    delta = arrays_to_bytes({k: np.zeros_like(v) for k, v in INITIAL.items()})

    def update(sender: str, base: int) -> ModelUpdate:
        return ModelUpdate(
            federation=FED,
            round=1,
            sender=sender,
            base_version=base,
            num_examples=5,
            weights=delta,
        )

    fed.bus.drop_filter = None
    fed.send_as(silent, update(silent, 7))
    fed.send_as(other, update(other, 0))
    outsider = next(d for d in fed.device_ids if d not in chosen)
    fed.send_as(outsider, update(outsider, 0))

    assert [e.code for e in fed.errors_to(silent)] == ["wrong_version"]
    assert [e.code for e in fed.errors_to(other)] == ["late"]
    assert [e.code for e in fed.errors_to(outsider)] == ["unauthorised"]
    assert "update from version 7; round 1 trains version 0" in caplog.text
    assert "a second update for round 1 is ignored" in caplog.text
    assert not fed.coordinator.is_done and plugin.history == []


def test_chunked_uploads_and_a_missed_download_are_recovered(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=2)
    lost: set[tuple[str, str, str]] = set()

    def lose_first_model_push(
        sender: str, receiver: str, topic: str, payload: bytes
    ) -> bool:
        if sender != "coordinator" or not topic.endswith("/down/transfer"):
            return False
        message = decode(payload)
        if message.kind not in ("transfer_manifest", "chunk"):
            return False  # the coordinator's requests for upload chunks
        key = (receiver, message.kind, message.transfer_id)
        if key in lost:
            return False  # the answer to the device's fetch gets through
        lost.add(key)
        return True

    fed.bus.drop_filter = lose_first_model_push

    def small_messages(client: EdgeClient) -> None:
        client.training.uploads.inline_limit = 16
        client.training.uploads.chunk_size = 16
        client.downloads.retry_s = 0.0

    plugin = start_training(
        fed,
        tmp_path,
        TrainingConfig(aggregation=PLAIN, chunk_size=1024),
        prepare=small_messages,
    )
    for _ in range(10):
        if fed.coordinator.is_done:
            break
        for client in fed.devices.values():
            client.poll()
        fed.tick(1.0)

    assert fed.coordinator.is_done and plugin.version == 2
    expected = fedavg_oracle(fed, 2)
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    uploads = [m for _, m in fed.messages("model_update")]
    assert uploads and all(u.transfer_id is not None for u in uploads)
    fetched = {t.split("/")[4] for t, _ in fed.messages("chunk_request") if "/up/" in t}
    trained = {m.sender for m in uploads}
    assert lost and trained <= fetched  # each lost its push, fetched, trained


def test_a_restarted_plugin_resumes_from_the_latest_checkpoint(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=2)
    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))
    assert plugin.version == 2

    again = TrainingPlugin(UNREAD, federation=FED, state_dir=fed.config.state_dir)

    assert again.version == 2
    for name, value in again.global_arrays.items():
        np.testing.assert_array_equal(value, plugin.global_arrays[name])


def test_a_plugin_without_weights_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no initial weights"):
        TrainingPlugin(UNREAD, federation=FED, state_dir=tmp_path)


def test_float16_deltas_are_half_the_bytes_and_still_aggregate(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=2)

    def half_precision(client: EdgeClient) -> None:
        client.data.trainer.wire_dtype = "float16"  # type: ignore[attr-defined]

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=half_precision
    )

    assert plugin.version == 2
    expected = fedavg_oracle(fed, 2)
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-3, atol=1e-3)
    sizes = {len(m.weights) for _, m in fed.messages("model_update")}
    full = len(arrays_to_bytes(INITIAL))
    assert (
        sizes == {len(arrays_to_bytes(INITIAL, dtype="float16"))} and max(sizes) < full
    )


def restart_coordinator(
    fed: Any, config: TrainingConfig, climb: ClimbConfig | None = None
) -> TrainingPlugin:
    """Stop the coordinator; a new, unstarted one with a new plugin on its state."""
    fed.coordinator.stop()
    fed.coordinator = CoordinatorService(
        fed.config,
        transport=InMemoryTransport(fed.bus, "coordinator"),
        clock=fed.clock,
        plugin=partial(
            TrainingPlugin,
            federation=FED,
            state_dir=fed.config.state_dir,
            config=config,
            clock=fed.clock,
        ),
        steps=climb_steps(climb),
    )
    plugin = fed.coordinator.plugin
    assert isinstance(plugin, TrainingPlugin)
    return plugin


def test_a_coordinator_restart_mid_round_keeps_the_updates_already_counted(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    fed.bus.drop_filter = drop_first_selected_update(fed)
    start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))
    chosen = selections(fed)[1]
    silent = chosen[0]
    assert not fed.coordinator.is_done
    plugin = restart_coordinator(fed, TrainingConfig(aggregation=PLAIN))
    fed.bus.drop_filter = None
    fed.coordinator.start()  # resumes round 1; the silent device re-sends

    assert fed.coordinator.is_done and plugin.version == 1
    (record,) = plugin.history
    assert set(record.contributed) == set(chosen) and record.dropped == ()
    expected = fedavg_oracle(fed, 1)
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    assert silent in record.contributed


def test_a_coordinator_restart_mid_dual_step_resumes_its_encrypted_sum(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    climb = ClimbConfig(eta_d=0.5, epsilon=0.01)
    late = fed.device_ids[-1]

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        return sender == late and decode(payload).kind == "mean_report"

    fed.bus.drop_filter = drop
    config = TrainingConfig(aggregation=PLAIN)
    start_training(fed, tmp_path, config, climb=climb)
    assert not fed.coordinator.is_done and fed.messages("mean_sum") == []
    assert fed.coordinator.store.phase_keys() == ["climb.dual/classifier/1"]
    plugin = restart_coordinator(fed, config, climb)
    fed.bus.drop_filter = None
    fed.coordinator.start()  # re-asks; only the missing report is new

    assert fed.coordinator.is_done and plugin.version == 1
    assert [r.before_training for r in plugin.history] == [{"climb": 6}]
    assert [m.num_parties for _, m in fed.messages("mean_sum")] == [6]
    _, lambdas = climb_oracle(fed, 1, climb)
    got = np.array([fed.devices[d].method(Climb).lam for d in fed.device_ids])
    np.testing.assert_allclose(got, lambdas, atol=1e-6)
    assert fed.coordinator.store.phase_keys() == []


class ShapedTrainer(LinearTrainer):
    """A `LinearTrainer` that knows its features per sample and the model's (w)."""

    def __init__(self, index: int, device_id: str, misfit: Callable[[], str]) -> None:
        super().__init__(index)
        self.device_id = device_id
        self.misfit = misfit

    @property
    def features(self) -> int:
        return 2 if self.device_id == self.misfit() else 3

    def model_features(self, global_arrays: Arrays) -> int:
        return int(np.shape(global_arrays["w"])[0])


def test_a_device_whose_features_do_not_fit_sits_out_at_the_key_epoch(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=1, rounds=3)
    caplog.set_level(logging.INFO)
    bad = fed.device_ids[0]  # it holds 2 features; the model takes 3

    def shaped(client: EdgeClient) -> None:
        index = fed.device_ids.index(client.device_id)
        client.data.trainer = ShapedTrainer(index, client.device_id, lambda: bad)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=shaped
    )

    assert fed.coordinator.is_done and plugin.version == 3  # the clock never moved
    refusals = [m for _, m in fed.messages("error") if m.code == "data_mismatch"]
    reason = "samples have 2 features; the federation's model classifier takes 3"
    assert [(m.sender, m.reason) for m in refusals] == [(bad, reason)]
    assert all(bad not in r.contributed and r.dropped == () for r in plugin.history)
    assert all(bad not in chosen for chosen in selections(fed).values())
    assert all(m.sender != bad for _, m in fed.messages("registration"))
    assert all(m.sender != bad for _, m in fed.messages("model_update"))
    assert fed.devices[bad].sits_out and fed.devices[bad].model_version is None
    assert f"{bad} sits out: data_mismatch: {reason}" in caplog.text
    assert f"{bad}: sitting out key epoch 1: data_mismatch: {reason}" in caplog.text


class OtherModelTrainer(LinearTrainer):
    """A `LinearTrainer` whose own model has a 4-wide ``w`` on one device."""

    def __init__(self, index: int, device_id: str, misfit: Callable[[], str]) -> None:
        super().__init__(index)
        self.device_id = device_id
        self.misfit = misfit

    def check_arrays(self, global_arrays: Arrays) -> None:
        width = 4 if self.device_id == self.misfit() else 3
        own = {"w": np.zeros(width, np.float32), "b": np.zeros(2, np.float32)}
        check_fits(own, global_arrays)


def test_a_device_with_another_model_sits_out_at_the_key_epoch_naming_the_tensor(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=1, rounds=2)
    caplog.set_level(logging.INFO)
    bad = fed.device_ids[0]

    def other(client: EdgeClient) -> None:
        index = fed.device_ids.index(client.device_id)
        client.data.trainer = OtherModelTrainer(index, client.device_id, lambda: bad)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=other
    )

    assert fed.coordinator.is_done and plugin.version == 2
    (notice, *_) = [m for _, m in fed.messages("key_epoch_start")]
    assert notice.model_spec.triples() == (("w", (3,), "float"), ("b", (2,), "float"))
    refusals = [m for _, m in fed.messages("error") if m.code == "model_mismatch"]
    assert [m.sender for m in refusals] == [bad]
    assert refusals[0].reason == (
        "the federation's model classifier does not fit this device's model: "
        "tensor 'w': shape (4,) in this device's model, (3,) in the federation's "
        "model"
    )
    assert all(bad not in chosen for chosen in selections(fed).values())
    assert all(r.dropped == () for r in plugin.history)
    assert fed.devices[bad].model_version is None
    assert f"{bad} sits out: model_mismatch: " in caplog.text
    assert read_status(fed.config.state_dir).sitting_out == {
        bad: f"model_mismatch: {refusals[0].reason}"
    }


def test_without_a_signed_spec_the_download_finds_another_model(
    federation: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(TrainingPlugin, "model_spec", lambda self: None)
    fed = federation(num_devices=5, k=2, tries=1, rounds=2)
    caplog.set_level(logging.INFO)

    def misfit() -> str:  # the first device selected in round 1 has another model
        return selections(fed)[1][0]

    def other(client: EdgeClient) -> None:
        index = fed.device_ids.index(client.device_id)
        client.data.trainer = OtherModelTrainer(index, client.device_id, misfit)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=other
    )

    assert fed.coordinator.is_done and plugin.version == 2
    bad = misfit()
    refusals = [m for _, m in fed.messages("error") if m.code == "model_mismatch"]
    assert [m.sender for m in refusals] == [bad]
    assert (
        "tensor 'w': shape (4,) in this device's model, (3,) in the federation's"
        in (refusals[0].reason)
    )
    assert not [m for _, m in fed.messages("error") if m.code == "data_mismatch"]
    assert bad not in selections(fed)[2]
    assert f"{bad} sits out: model_mismatch: " in caplog.text


def test_device_metrics_are_averaged_and_samples_summed() -> None:
    from ursa.coordinator.training_round import summarise_device_metrics

    summary = summarise_device_metrics(
        {
            "d0": {"loss": 0.5, "samples": 10.0, "train_s": 1.0},
            "d1": {"loss": 1.5, "samples": 30.0},
        }
    )
    assert summary == {"reporting": 2.0, "loss": 1.0, "samples": 40.0, "train_s": 1.0}


def test_an_outage_gives_the_round_its_time_back(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    fed.bus.drop_filter = drop_first_selected_update(fed)
    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN, update_timeout_s=5.0)
    )
    plugin.extend_deadlines(30.0)  # what the service does when the broker is back
    fed.tick(6.0)
    assert not fed.coordinator.is_done  # the update may still be queued
    fed.tick(30.0)
    assert fed.coordinator.is_done and len(plugin.history[0].contributed) == 2


class FailingTrainer(LinearTrainer):
    """A LinearTrainer that raises in every round."""

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        raise RuntimeError("private detail 12345")


def test_a_failed_device_is_not_waited_for_and_the_end_names_the_final_model(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=4, k=4, tries=1, rounds=2)
    failing: list[str] = []

    def fail_first(client: EdgeClient) -> None:
        if not failing:
            failing.append(client.device_id)
            client.data.trainer = FailingTrainer(0)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=fail_first
    )

    assert fed.coordinator.is_done and plugin.version == 2
    (bad,) = failing
    chosen = selections(fed)
    assert len(plugin.history) == 2
    for record in plugin.history:
        assert record.failed == (bad,)
        assert record.dropped == ()
        assert set(record.contributed) == set(chosen[record.round]) - {bad}
    errors = [m for _, m in fed.messages("error") if m.sender == bad]
    assert [(m.code, m.round) for m in errors] == [
        ("training_failed", 1),
        ("training_failed", 2),
    ]
    assert all("12345" not in m.reason for m in errors)
    (end,) = [m for _, m in fed.messages("federation_end")]
    assert (end.rounds, end.model, end.model_version) == (2, "classifier", 2)
    assert end.signature and end.weights is not None
    for device_id, client in fed.devices.items():
        assert client.finished.wait(10), device_id  # set after the export thread
        saved = (client.final_dir / "model.ursw").read_bytes()
        assert saved == arrays_to_bytes(plugin.global_arrays)
    card = fed.config.state_dir / "final" / "model_card.json"
    assert '"version": 2' in card.read_text()


def test_a_device_failing_round_after_round_is_named_then_sits_out(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=5, k=4, tries=1, rounds=5)
    fed.config = fed.config.model_copy(update={"sit_out_after_failures": 2})
    failing: list[str] = []

    def fail_first(client: EdgeClient) -> None:
        if not failing:
            failing.append(client.device_id)
            client.data.trainer = FailingTrainer(0)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), prepare=fail_first
    )

    assert fed.coordinator.is_done and plugin.version == 5
    (bad,) = failing
    failed_in = [r.round for r in plugin.history if bad in r.failed]
    assert len(failed_in) == 2  # two failures, then never selected again
    later = [r for r in plugin.history if r.round > failed_in[-1]]
    assert later and all(bad not in r.selected for r in later)
    health = TrainingHealth(sit_out_after=2)  # as `ursa coordinator status` reads it
    health.restore(fed.coordinator.store.get_meta(HEALTH_KEY))
    assert list(health.failing()) == [bad] and health.sitting_out() == {bad}
    from ursa.coordinator.status import read_status

    status = read_status(fed.config.state_dir)
    assert status.failing == {bad: 2} and bad in status.sat_out


def test_the_federation_ends_once_the_target_accuracy_is_reached(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=5)
    fed.config = fed.config.model_copy(update={"target_accuracy": 0.5})

    def evaluate(round_index: int, version: int, arrays: Arrays) -> dict[str, float]:
        return {"accuracy": 0.2 * round_index}

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), evaluate=evaluate
    )

    assert fed.coordinator.is_done
    assert [r.round for r in plugin.history] == [1, 2, 3]
    (end,) = [m for _, m in fed.messages("federation_end")]
    assert end.rounds == 3 and end.metrics == {"accuracy": pytest.approx(0.6)}


def test_status_shows_the_last_training_rounds_figures(
    federation: Any, tmp_path: Path
) -> None:
    from ursa.coordinator.status import read_status
    from ursa.tools.cli.fleet import _trained_line

    fed = federation(num_devices=4, k=2, tries=1, rounds=2)

    def evaluate(round_index: int, version: int, arrays: Arrays) -> dict[str, float]:
        return {"accuracy": 0.25 * round_index}

    start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN), evaluate=evaluate)
    assert fed.coordinator.is_done
    figures = read_status(fed.config.state_dir).trained["classifier"]
    assert (figures["round"], figures["version"], figures["updates"]) == (2, 2, 2)
    assert figures["accuracy"] == 0.5 and figures["federated_accuracy"] is None
    assert figures["devices"]["reporting"] == 2 and figures["devices"]["samples"] > 0
    line = _trained_line("classifier", figures)
    assert line.startswith("last classifier round 2: 2/2 updates -> version 2")
    assert "accuracy 0.5000 (federated -)" in line


# --- secure aggregation (the default): the same rounds, summed under masks ----------


def _survivor_oracle(fed: Any, survivors: dict[int, tuple[str, ...]]) -> Arrays:
    """FedAvg over only the given devices of each round (the plaintext truth)."""
    arrays = {k: v.astype(np.float64) for k, v in INITIAL.items()}
    for r in sorted(survivors):
        trainers = [fed.devices[d].data.trainer for d in survivors[r]]
        total = sum(t.num_examples for t in trainers)
        step = {k: np.zeros_like(v) for k, v in arrays.items()}
        for t in trainers:
            delta = t.delta({k: v.astype(np.float32) for k, v in arrays.items()})
            for k in step:
                step[k] += t.num_examples * delta[k].astype(np.float64) / total
        arrays = {k: arrays[k] + step[k] for k in arrays}
    return arrays


def test_secure_rounds_equal_the_plaintext_sum_and_no_update_crosses_in_clear(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)
    kinds: list[str] = []

    def record(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        if receiver == "coordinator":
            with contextlib.suppress(ProtocolError):
                kinds.append(decode(payload).kind)
        return False

    fed.bus.drop_filter = record

    plugin = start_training(fed, tmp_path, TrainingConfig())

    assert fed.coordinator.is_done and plugin.version == 3
    expected = fedavg_oracle(fed, 3)
    for name, value in plugin.global_arrays.items():
        # quantisation: K * 2^-(s+1) / sum(n) with s = 12 here, far below 1e-4
        np.testing.assert_allclose(value, expected[name], rtol=0, atol=1e-4)
    assert "model_update" not in kinds and kinds.count("masked_update") == 9
    record_1 = plugin.history[0]
    assert record_1.metrics["secure_aggregation"]["masked"] == 3
    assert record_1.metrics["devices"]["reporting"] == 3.0
    assert record_1.metrics["devices"]["samples"] == sum(
        fed.devices[d].data.trainer.num_examples for d in record_1.selected
    )


def test_a_device_lost_after_sharing_keys_is_unmasked_from_the_others_shares(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        chosen = selections(fed).get(1)
        return (
            chosen is not None
            and sender == chosen[0]
            and decode(payload).kind == "masked_update"
        )

    fed.bus.drop_filter = drop
    config = TrainingConfig(update_timeout_s=5.0)

    plugin = start_training(fed, tmp_path, config)
    assert not fed.coordinator.is_done
    fed.tick(6.0)  # the update deadline: unmask the two that arrived

    chosen = selections(fed)[1]
    assert fed.coordinator.is_done and plugin.version == 1
    expected = _survivor_oracle(fed, {1: chosen[1:]})
    for name, value in plugin.global_arrays.items():
        np.testing.assert_allclose(value, expected[name], rtol=0, atol=1e-4)
    assert plugin.history[0].contributed == tuple(sorted(chosen[1:]))


def test_fewer_masked_updates_than_the_threshold_abandon_the_round(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)

    def fail_first(client: EdgeClient) -> None:
        if client.device_id == fed.device_ids[0]:
            client.data.trainer = FailingTrainer(0)  # type: ignore[attr-defined]

    caplog.set_level(logging.WARNING, logger="ursa.coordinator.training")
    config = TrainingConfig(aggregation=AggregationConfig(threshold=3))

    plugin = start_training(fed, tmp_path, config, prepare=fail_first)

    if fed.device_ids[0] in selections(fed)[1]:
        assert fed.coordinator.is_done and plugin.version == 0
        assert plugin.history[0].contributed == ()
        assert "the threshold is 3" in caplog.text
    else:  # the failing device was not selected: all three summed
        assert plugin.version == 1


def test_distributed_dp_rounds_spend_privacy_that_grows_and_is_reported(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)
    aggregation = AggregationConfig(noise_multiplier=1.0, max_examples=30)

    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=aggregation))

    assert fed.coordinator.is_done and plugin.version == 3
    spent = [r.metrics["privacy"] for r in plugin.history]
    totals = [s["epsilon_total"] for s in spent]
    assert all(np.isfinite(t) and t > 0 for t in totals)
    assert totals[0] < totals[1] < totals[2]  # composed over the rounds
    assert [s["rounds"] for s in spent] == [1, 2, 3]
    assert round_figures(plugin.history[-1])["epsilon"] == totals[-1]
    assert "devices" not in plugin.history[0].metrics  # no metrics under DP
    for value in plugin.global_arrays.values():
        assert np.all(np.isfinite(value))


def model_receivers(fed: Any) -> dict[int, set[str | None]]:
    """Per global version: the devices its manifest was pushed to (None: all)."""
    out: dict[int, set[str | None]] = {}
    for topic, message in fed.messages("transfer_manifest"):
        if not message.purpose.startswith("classifier.v"):
            continue
        version = int(message.purpose.rsplit(".v", 1)[1])
        levels = topic.split("/")
        to = None if levels[3] == "global" else levels[4]
        if message.sender == "coordinator" and (to is None or "/down/" in topic):
            out.setdefault(version, set()).add(to)
    return out


def chunk_bytes_received(fed: Any, device: str) -> int:
    """Model chunk bytes that reached ``device`` (its down topic or the global one)."""
    return sum(
        len(m.data)
        for t, m in fed.messages("chunk")
        if m.sender == "coordinator"
        and (t.endswith("/global/transfer") or f"/dev/{device}/down/" in t)
    )


def test_only_a_rounds_selected_devices_receive_its_model(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)

    plugin = start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))

    assert fed.coordinator.is_done and plugin.version == 3
    chosen = selections(fed)
    # round r trains from version r - 1: pushed to its selected devices alone
    assert model_receivers(fed) == {r - 1: set(chosen[r]) for r in (1, 2, 3)}
    assert not any(t.endswith("/global/transfer") for t, _ in fed.messages("chunk"))
    never = set(fed.device_ids) - {d for r in chosen.values() for d in r}
    for device in never:  # a device never selected received no model chunk...
        assert chunk_bytes_received(fed, device) == 0
        assert fed.devices[device].model_version is None
    assert not any("/up/" in t for t, _ in fed.messages("chunk_request"))
    (end,) = [m for _, m in fed.messages("federation_end")]
    assert end.model_version == 3 and end.weights is not None  # ...but the final
    for client in fed.devices.values():
        assert client.finished.wait(10)


class FleetReads(BeforeTraining):
    """A step in which every online device reads the model of round 2."""

    name = "probe"
    signed = False

    def register(self, router: Any) -> None:
        pass

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx

    def open(self, info: Any, now: float) -> None:
        return None

    def on_tick(self, round_index: int, now: float) -> None:
        pass

    def is_done(self, round_index: int) -> bool:
        return True

    def republish(self, round_index: int) -> None:
        pass

    def close(self, round_index: int) -> None:
        pass

    def fleet_needs_model(self, round_index: int) -> bool:
        return round_index == 2


def test_a_round_the_whole_fleet_evaluates_sends_its_model_to_all(
    federation: Any, tmp_path: Path
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=3)

    plugin = start_training(
        fed, tmp_path, TrainingConfig(aggregation=PLAIN), steps=[FleetReads.later()]
    )

    assert fed.coordinator.is_done and plugin.version == 3
    chosen = selections(fed)
    receivers = model_receivers(fed)
    assert receivers[1] == {None}  # round 2's model went to every device, once
    assert receivers[0] == set(chosen[1]) and receivers[2] == set(chosen[3])
    for device in set(fed.device_ids) - set(chosen[2]):
        assert fed.devices[device].model_version is not None


def test_a_device_that_needs_a_version_fetches_it_within_bounds(
    federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=3, tries=1, rounds=1)
    fed.bus.drop_filter = drop_first_selected_update(fed)  # round 1 stays open
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    start_training(fed, tmp_path, TrainingConfig(aggregation=PLAIN))
    fed.bus.drop_filter = None
    chosen = selections(fed)[1]
    outsider = next(d for d in fed.device_ids if d not in chosen)
    assert not fed.coordinator.is_done and chunk_bytes_received(fed, outsider) == 0

    def fetch(version: int, indices: tuple[int, ...] = (0,)) -> None:
        fed.send_as(
            outsider,
            ChunkRequest(
                federation=FED,
                round=1,
                sender=outsider,
                transfer_id=model_transfer_id(FED, "classifier", version),
                indices=indices,
            ),
        )

    before = len(fed.messages("chunk"))
    fetch(0)
    answers = fed.messages("chunk")[before:]
    assert [t for t, _ in answers] == [f"ursa/v1/{FED}/dev/{outsider}/down/transfer"]
    fetch(0)  # again at once: at most one answer per 0.5 s
    fed.tick(1.0)
    fetch(7)  # not a current version
    fetch(0, (5,))  # no such chunk
    assert len(fed.messages("chunk")) == before + 1  # nothing more sent, to anyone
    reasons = [e.reason for e in fed.errors_to(outsider)]
    assert [e.code for e in fed.errors_to(outsider)] == ["transfer_failed"] * 3
    assert "at most one per 0.5 s" in reasons[0]
    assert "not a current model version" in reasons[1]
    assert "a request answered" in caplog.text
    fed.raw.publish(f"ursa/v1/{FED}/dev/{outsider}/up/transfer", b"\x93garbage")
    assert fed.bus.handler_errors == 0 and not fed.coordinator.is_done
