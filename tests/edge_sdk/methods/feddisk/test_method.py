"""The FedDisk method on EdgeClients over the in-memory bus, a scripted coordinator."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.crypto.identity import DeviceIdentity, verify_signature
from ursa.crypto.paillier import encrypted_vector_from, sum_encrypted
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.methods.feddisk.made_loss import decrypt_fleet_loss
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods.feddisk.state import FEDDISK_MADE_FILE, FEDDISK_WEIGHTS_FILE
from ursa.edge_sdk.methods.feddisk.trainer import FeddiskSettings, FeddiskTrainer
from ursa.edge_sdk.methods_config import DubheDeviceSpec, FeddiskDeviceSpec
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.models.registry import initial_arrays
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.chunking import split
from ursa.protocol.envelope import (
    decode,
    encode,
    message_kind,
    signed_by_coordinator,
    signing_bytes,
)
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    COORDINATOR,
    MADE_LOSS,
    BaseMessage,
    DeviceKeys,
    EnrolResult,
    FeddiskSwitch,
    IdentityKeys,
    KeyEpochStart,
    MeanRequest,
    MeanSum,
    ModelAvailable,
    SealedSecretKey,
    SealRequest,
)
from ursa.protocol.topics import (
    RETAINED_GLOBAL_NAMES,
    coordinator_subscriptions,
    down_topic,
    global_topic,
    name_for,
)

FED = "fed"
DIM = 8
CLASSIFIER = {"input_dim": DIM, "num_classes": 3, "hidden_sizes": [6]}
SETTINGS = FeddiskSettings(
    made_hidden_sizes=(6,),
    local_made_epochs_per_check=2,
    local_made_max_epochs=4,
    classifier_hidden=6,
    classifier_epochs=3,
)


class RecordingTrainer(FeddiskTrainer):
    """Records the global MADE each switch was given."""

    switched: list[Arrays | None]

    def switch(self, global_made: Arrays | None) -> dict[str, float]:
        self.switched.append(global_made)
        return super().switch(global_made)


def _trainer(index: int) -> RecordingTrainer:
    rng = np.random.default_rng(index)
    y = rng.integers(0, 3, 30)
    x = (rng.normal(size=(30, DIM)) + y[:, None]).astype(np.float32)
    classifier = TorchTrainer(x, y, model_config=CLASSIFIER, model="clf")
    trainer = RecordingTrainer(classifier, settings=SETTINGS, seed=index)
    trainer.switched = []
    return trainer


class Fleet:
    """Devices d0 (the epoch's agent) and d1, and a scripted coordinator."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.bus = tmp, InMemoryBus()
        self.identity = DeviceIdentity.generate(COORDINATOR)
        self.digests: dict[tuple[str, int], str] = {}
        """The SHA-256 of each (model, version) published, for its notice."""
        self.up: list[BaseMessage] = []
        self.hub = InMemoryTransport(self.bus, COORDINATOR)
        self.hub.set_handler(lambda topic, payload: self.up.append(decode(payload)))
        for pattern in coordinator_subscriptions(FED):
            self.hub.subscribe(pattern)
        self.hub.connect()
        self.clients: dict[str, EdgeClient] = {}
        self.trainers: dict[str, RecordingTrainer] = {}
        for device_id in ("d0", "d1"):
            self.start(device_id)
        self._open_epoch()

    def start(self, device_id: str) -> EdgeClient:
        trainer = _trainer(int(device_id[1:]))
        config = DeviceConfig(
            device_id=device_id,
            federation=FED,
            state_dir=self.tmp / device_id,
            obfuscator_pool_size=0,
            insecure_test_keys=True,
            methods=(
                DubheDeviceSpec(),
                FeddiskDeviceSpec.model_validate(SETTINGS.model_dump()),
            ),
        )
        client = EdgeClient(
            config,
            trainer.classifier.y,
            transport=InMemoryTransport(self.bus, device_id),
            trainer=trainer,
        )
        self.clients[device_id], self.trainers[device_id] = client, trainer
        client.start()
        return client

    def send(self, message: BaseMessage, device: str | None = None) -> None:
        """Publish as the coordinator does: signed, but a chunk or a relayed message."""
        if signed_by_coordinator(message) and not message.signature:
            signature = self.identity.sign(signing_bytes(message))
            message = message.model_copy(update={"signature": signature})
        name = name_for(message_kind(message))
        if device is None:
            topic, retain = global_topic(FED, name), name in RETAINED_GLOBAL_NAMES
        else:
            topic, retain = down_topic(FED, device, name), False
        self.hub.publish(topic, encode(message), retain=retain)

    def sent(self, kind: str, sender: str | None = None) -> list[Any]:
        return [
            m for m in self.up if message_kind(m) == kind and sender in (None, m.sender)
        ]

    def _keys(self, device_id: str) -> DeviceKeys:
        public = self.clients[device_id].link.identity.public()
        return DeviceKeys(
            device_id=device_id,
            x25519_public=public.x25519_public,
            ed25519_public=public.ed25519_public,
        )

    def _open_epoch(self) -> None:
        public = self.identity.public()
        keys = IdentityKeys(
            device_id=COORDINATOR,
            x25519_public=public.x25519_public,
            ed25519_public=public.ed25519_public,
        )
        head = {"federation": FED, "round": 0, "sender": COORDINATOR}
        for device_id in self.clients:
            enrol = EnrolResult(
                **head, device_id=device_id, accepted=True, coordinator_keys=keys
            )
            signed = self.identity.sign(signing_bytes(enrol))
            self.send(enrol.model_copy(update={"signature": signed}), device_id)
        notice = KeyEpochStart(
            **head,
            epoch=1,
            agent="d0",
            agent_keys=self._keys("d0"),
            num_classes=3,
            groups=(3,),
            sigma=(0.0,),
            max_parties=10,
            key_bits=512,  # test-only key size: the logic, not the security
            methods=("dubhe", "feddisk"),
        )
        signature = self.identity.sign(signing_bytes(notice))
        self.send(notice.model_copy(update={"signature": signature}))
        recipients = (self._keys("d0"), self._keys("d1"))
        self.send(SealRequest(**head, epoch=1, recipients=recipients), "d0")
        self.send(self.sent("agent_public_key")[-1])
        (box,) = self.sent("sealed_keys")[-1].boxes  # relayed as the coordinator does
        relayed = SealedSecretKey(
            **{**head, "sender": "d0"}, epoch=1, recipient=box.recipient, box=box.box
        )
        self.send(relayed, "d1")
        assert all(c.epoch_view.secret_key is not None for c in self.clients.values())

    def publish_model(self, model: str, version: int, arrays: Arrays) -> None:
        tid = model_transfer_id(FED, model, version)
        manifest, chunks = split(
            arrays_to_bytes(arrays),
            purpose=f"{model}.v{version}",
            federation=FED,
            round=version + 1,
            sender=COORDINATOR,
            transfer_id=tid,
        )
        for part in (manifest, *chunks):
            self.send(part)
        self.digests[(model, version)] = manifest.sha256
        self.announce(model, version, round_index=version + 1)

    def announce(self, model: str, version: int, *, round_index: int) -> None:
        tid = model_transfer_id(FED, model, version)
        self.send(
            ModelAvailable(
                federation=FED,
                round=round_index,
                sender=COORDINATOR,
                model=model,
                model_version=version,
                transfer_id=tid,
                sha256=self.digests.get((model, version), "0" * 64),
            )
        )

    def request_loss(self, round_index: int, version: int) -> None:
        self.send(
            MeanRequest(
                federation=FED,
                round=round_index,
                sender=COORDINATOR,
                purpose=MADE_LOSS,
                epoch=1,
                model="made",
                model_version=version,
            )
        )

    def sum_losses(self, round_index: int) -> MeanSum:
        """Sum this round's reports blind, as the coordinator does."""
        public_key = self.clients["d0"].epoch_view.public_key
        assert public_key is not None
        reports = [m for m in self.sent("mean_report") if m.round == round_index]
        latest = {m.sender: m for m in reports}
        total = sum_encrypted(
            public_key,
            (encrypted_vector_from(m.ciphertext, public_key) for m in latest.values()),
        )
        return MeanSum(
            federation=FED,
            round=round_index,
            sender=COORDINATOR,
            purpose=MADE_LOSS,
            epoch=1,
            model="made",
            model_version=reports[0].model_version,
            ciphertext=total.to_bytes(public_key),
            num_parties=len(latest),
        )

    def made_round(self, version: int, arrays: Arrays) -> MeanSum:
        """Publish MADE ``version``, collect the reports, send their sum."""
        round_index = version + 1
        self.publish_model("made", version, arrays)
        self.request_loss(round_index, version)
        total = self.sum_losses(round_index)
        self.send(total)
        return total

    def fleet_nll(self, arrays: Arrays) -> float:
        losses = [t.validation_loss(arrays) for t in self.trainers.values()]
        return sum(loss * n for loss, n in losses) / sum(n for _, n in losses)

    def switch(self, made_version: int) -> None:
        self.send(
            FeddiskSwitch(
                federation=FED,
                round=made_version + 2,
                sender=COORDINATOR,
                made_model="made",
                made_version=made_version,
                model="clf",
            )
        )

    def close(self) -> None:
        for client in self.clients.values():
            client.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    made = Fleet(tmp_path)
    yield made
    made.close()
    assert made.bus.handler_errors == 0


def _made(seed: int = 1) -> Arrays:
    return initial_arrays("made", SETTINGS.made_model_config(DIM), seed=seed)


def _worse(arrays: Arrays) -> Arrays:
    """The same MADE with its output layer scrambled (a clearly higher NLL)."""
    rng = np.random.default_rng(9)
    return {
        k: (v + rng.normal(0.0, 3.0, v.shape)).astype(np.float32)
        for k, v in arrays.items()
    }


def test_a_request_waits_for_the_version_and_the_report_decrypts_to_the_nll(
    fleet: Fleet,
) -> None:
    arrays = _made()
    fleet.request_loss(1, 0)
    assert fleet.sent("mean_report") == []  # version 0 not here yet

    fleet.publish_model("made", 0, arrays)

    reports = {m.sender: m for m in fleet.sent("mean_report")}
    assert set(reports) == {"d0", "d1"}
    secret_key = fleet.clients["d1"].epoch_view.secret_key
    assert secret_key is not None
    for device_id, report in reports.items():
        vector = encrypted_vector_from(report.ciphertext, secret_key.public_key)
        plain = decrypt_fleet_loss(secret_key, SETTINGS.loss, vector)
        loss, n_val = fleet.trainers[device_id].validation_loss(arrays)
        assert plain.mean_nll == pytest.approx(loss, abs=1e-5)
        assert (plain.num_examples, report.model_version) == (n_val, 0)

    fleet.request_loss(1, 0)  # re-published: the same report again
    again = [m for m in fleet.sent("mean_report", "d0")]
    assert len(again) == 2 and again[0].ciphertext == again[1].ciphertext
    assert again[0].message_id == again[1].message_id


def test_sums_drive_the_stopper_and_only_the_agent_sends_a_signed_verdict(
    fleet: Fleet,
) -> None:
    good, bad = _made(), _worse(_made())
    assert fleet.fleet_nll(bad) > fleet.fleet_nll(good)

    fleet.made_round(0, good)
    (first,) = fleet.sent("made_verdict")
    last = fleet.made_round(1, bad)

    first_verdict, second = fleet.sent("made_verdict")
    assert first_verdict == first and fleet.sent("made_verdict", "d1") == []
    assert (first.round, first.model_version, first.stop, first.best_version) == (
        1,
        0,
        False,
        0,
    )
    assert (second.model_version, second.stop, second.best_version) == (1, True, 0)
    agent = fleet.clients["d0"].link.identity.public()
    for verdict in (first, second):
        verify_signature(agent, signing_bytes(verdict), verdict.signature)
    for client in fleet.clients.values():
        method = client.method(FedDisk)
        stopper = method.stopper
        assert (stopper.rounds, stopper.best_round, stopper.stopped) == (2, 1, True)
        assert method.best is not None and method.best[0] == 0
        assert (client.link.config.state_dir / FEDDISK_MADE_FILE).exists()

    fleet.send(last)  # re-published sum: the same verdict, not applied twice
    third = fleet.sent("made_verdict")[-1]
    assert third.message_id == second.message_id and third.stop
    assert fleet.clients["d0"].method(FedDisk).stopper.rounds == 2


def test_a_restarted_device_keeps_its_stopper_and_best_made(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ursa.edge_sdk")
    good = _made()
    fleet.made_round(0, good)
    fleet.clients["d1"].stop()

    restarted = fleet.start("d1")

    method = restarted.method(FedDisk)
    assert method.stopper.rounds == 1
    assert method.best is not None and method.best[0] == 0
    for name, value in method.best[1].items():
        np.testing.assert_array_equal(value, good[name])
    assert "MADE round 1 over 2 devices" in caplog.text
    assert "fleet MADE NLL" not in caplog.text  # losses only at DEBUG


def test_switch_uses_the_best_made_persists_weights_and_resets_downloads(
    fleet: Fleet,
) -> None:
    good, bad = _made(), _worse(_made())
    fleet.made_round(0, good)
    fleet.made_round(1, bad)
    client, trainer = fleet.clients["d1"], fleet.trainers["d1"]
    fleet.announce("clf", 0, round_index=3)  # phase 2's model, before the switch
    assert client.router.is_parked(ModelAvailable)
    assert client.model_version == 1

    fleet.switch(made_version=0)

    (used,) = trainer.switched
    assert used is not None
    for name, value in used.items():
        np.testing.assert_array_equal(value, good[name])
    assert trainer.phase == "classifier" and trainer.model == "clf"
    weights = trainer.sample_weights
    assert weights is not None and weights.mean() == pytest.approx(1.0)
    state_dir = client.link.config.state_dir
    np.testing.assert_array_equal(np.load(state_dir / FEDDISK_WEIGHTS_FILE), weights)
    state = DeviceStateDir(state_dir).method_state("feddisk")
    assert state is not None and state["phase"] == "classifier"
    assert client.model_version is None and client.model_arrays is None
    assert not client.router.is_parked(ModelAvailable)  # released after the switch
    notice = client.training.model_notice
    assert notice is not None and (notice.model, notice.model_version) == ("clf", 0)
    # not selected in round 3: it fetches nothing, and takes the version it is sent
    assert client.downloads.wanted is None
    summary = client.method(FedDisk).summary
    assert summary is not None
    assert summary["weight_min"] == pytest.approx(weights.min())

    fleet.publish_model("clf", 0, initial_arrays("mlp", CLASSIFIER, seed=0))
    fleet.switch(made_version=0)  # retained copy or a repeat: ignored

    assert client.model_version == 0  # the classifier's versions restart at 0
    assert len(trainer.switched) == 1


def test_a_restarted_device_resumes_phase_two_from_its_state_dir(
    fleet: Fleet,
) -> None:
    fleet.made_round(0, _made())
    fleet.switch(made_version=0)
    weights = fleet.trainers["d1"].sample_weights
    fleet.clients["d1"].stop()

    restarted = fleet.start("d1")  # the retained switch arrives again

    trainer = fleet.trainers["d1"]
    assert trainer.phase == "classifier" and trainer.switched == []
    np.testing.assert_array_equal(trainer.sample_weights, weights)  # type: ignore[arg-type]
    assert not restarted.method(FedDisk).in_made_phase


def test_a_switch_to_a_version_never_seen_takes_the_closest_with_a_warning(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    good = _made()
    fleet.made_round(0, good)

    fleet.switch(made_version=5)

    (used,) = fleet.trainers["d0"].switched
    assert used is not None and all(np.array_equal(used[k], good[k]) for k in good)
    assert "MADE version 5 is not here" in caplog.text
