"""A `DeviceContext` by hand for the methods' unit tests (no client, no bus)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey, generate_keypair
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.edge_sdk.stats import DeviceStats, TrainingStats
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer, Trainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import BaseMessage, IdentityKeys, KeyEpochStart
from ursa.protocol.router import NotReadyError

FED = "fed"


class FixedLoss(ModelTrainer):
    """A trainer whose loss is a constant and whose delta is the model, scaled."""

    def __init__(self, loss: float) -> None:
        self.loss = loss

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        return LocalDelta({k: v * delta_scale for k, v in global_arrays.items()}, 1)

    def local_loss(self, global_arrays: Arrays) -> float:
        return self.loss


class FakeContext:
    """A `DeviceContext` by hand: a model cache, an outbox list, a fake clock.

    Its coordinator signature check accepts every message once the coordinator
    is "pinned" (`coordinator_pinned`) and records it in `verified`.
    """

    def __init__(self, tmp: Path, keys: tuple[PaillierPublicKey, PaillierSecretKey]):
        self.device_id = "d0"
        self.federation = FED
        self.store = DeviceStateDir(tmp / "d0")
        self.stats = DeviceStats()
        self.training_stats = TrainingStats()
        self.trainer: Trainer = FixedLoss(0.8)
        self.model_version: int | None = None
        self.arrays: dict[int, Arrays] = {}
        self.sent: list[BaseMessage] = []
        self.wanted: list[int] = []
        self.retries = 0
        self.notice_age = 0.0
        public, secret = keys
        self.epoch = KeyEpochStart.model_construct(  # the fields methods read
            epoch=3, agent="d0", num_classes=4, max_parties=100
        )
        self.rng = np.random.default_rng(0)
        self.labels = np.array([0, 0, 0, 1], dtype=np.int64)
        self.the_roster: Roster | None = None
        self.epoch_keys: EpochKeys | None = EpochKeys(self.epoch, public, secret, None)
        self.identity = DeviceIdentity.generate("d0")
        self.coordinator_pinned = True
        self.verified: list[BaseMessage] = []

    def send(self, message: BaseMessage) -> None:
        self.sent.append(message)

    def signed(self, message: BaseMessage) -> BaseMessage:
        return message

    def keys(self, epoch: int) -> EpochKeys:
        if self.epoch_keys is None or epoch > self.epoch.epoch:
            raise NotReadyError
        return self.epoch_keys

    def current_keys(self) -> EpochKeys | None:
        return self.epoch_keys

    def model_arrays_at(self, version: int) -> Arrays | None:
        if version in self.arrays:
            return self.arrays[version]
        self.wanted.append(version)
        return None

    def seconds_since_model_notice(self) -> float:
        return self.notice_age

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        return seal(self.identity, peer, context, plaintext)

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        return open_sealed(self.identity, peer, context, box)

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        return keys.public_identity()

    def verify_coordinator(self, message: BaseMessage) -> None:
        if not self.coordinator_pinned:
            raise NotReadyError
        self.verified.append(message)

    def retry_training(self) -> None:
        self.retries += 1

    def forget_downloads(self) -> None:
        self.arrays.clear()

    def roster(self) -> Roster | None:
        return self.the_roster

    def label_distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        counts = np.bincount(self.labels, minlength=num_classes).astype(np.float64)
        return counts / counts.sum()


@pytest.fixture(scope="session")
def keys() -> tuple[PaillierPublicKey, PaillierSecretKey]:
    return generate_keypair(512)  # the logic, not the security


@pytest.fixture
def new_context(
    tmp_path: Path, keys: tuple[PaillierPublicKey, PaillierSecretKey]
) -> Callable[[], FakeContext]:
    """Fake contexts of device d0, all on the same state directory."""
    return lambda: FakeContext(tmp_path, keys)
