"""`DeviceMethodContext`: the `DeviceContext` a device's methods are given.

Built by `EdgeClient` from its parts' public surface (the link, the key
epoch's view, the data, the training rounds) before the methods, which are
each handed it at construction: a method reaches the device only through it,
never through the client. The training rounds are built after the methods
(they run the methods' hooks), so the context reaches them through a
callable, asked only when a method uses them (a message, never construction).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.epoch_view import CurrentEpoch
from ursa.edge_sdk.local_dataset import LocalDataset
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.edge_sdk.stats import DeviceStats, TrainingStats
from ursa.edge_sdk.trainer import Trainer
from ursa.edge_sdk.training_rounds import TrainingRounds
from ursa.models.weights import Arrays
from ursa.protocol.messages import BaseMessage, IdentityKeys, KeyEpochStart
from ursa.protocol.router import NotReadyError

__all__ = ["DeviceMethodContext"]


class DeviceMethodContext:
    """What a method may use of its device (`ursa.edge_sdk.method.DeviceContext`)."""

    def __init__(
        self,
        *,
        link: DeviceLink,
        view: CurrentEpoch,
        data: LocalDataset,
        training: Callable[[], TrainingRounds],
        stats: DeviceStats,
        rng: np.random.Generator,
    ) -> None:
        self._link = link
        self._view = view
        self._data = data
        self._training = training
        self.stats = stats
        """Crypto time and selection counters."""
        self.rng = rng
        """The device's private randomness (e.g. Dubhe's volunteer coins)."""

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._link.device_id

    @property
    def federation(self) -> str:
        """The federation's name."""
        return self._link.federation

    @property
    def store(self) -> DeviceStateDir:
        """The device's state directory."""
        return self._link.store

    @property
    def training_stats(self) -> TrainingStats:
        """Training counters."""
        return self._training().stats

    @property
    def trainer(self) -> Trainer:
        """The device's trainer."""
        return self._data.trainer

    @property
    def model_version(self) -> int | None:
        """The latest global version downloaded."""
        return self._training().downloads.model_version

    @property
    def epoch(self) -> KeyEpochStart | None:
        """The adopted key epoch's notice."""
        return self._view.notice

    def send(self, message: BaseMessage) -> None:
        """Queue ``message`` on this device's up topic."""
        self._link.send(message)

    def roster(self) -> Roster | None:
        """The adopted epoch's decrypted registry."""
        return self._view.roster()

    def label_distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """This device's label distribution (None if its labels do not fit)."""
        return self._data.distribution(num_classes)

    def signed(self, message: BaseMessage) -> BaseMessage:
        """``message`` signed with the device's identity key."""
        return self._link.signed(message)

    def keys(self, epoch: int) -> EpochKeys:
        """Key epoch ``epoch``'s keys (NotReadyError: not here yet)."""
        self._view.require(epoch)
        keys = self._view.current_keys()
        if keys is None:
            raise NotReadyError
        return keys

    def current_keys(self) -> EpochKeys | None:
        """The adopted epoch's keys, or None while its public key is missing."""
        return self._view.current_keys()

    def model_arrays_at(self, version: int) -> Arrays | None:
        """The global ``version`` if downloaded; else None, and fetch it."""
        return self._training().downloads.arrays_at(version)

    def seconds_since_model_notice(self) -> float:
        """Seconds since the current round's `ModelAvailable` arrived."""
        return self._training().seconds_since_notice()

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        """``plaintext`` sealed from this device to ``peer``, bound to ``context``."""
        return seal(self._link.identity, peer, context, plaintext)

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        """A box ``peer`` sealed to this device under ``context``."""
        return open_sealed(self._link.identity, peer, context, box)

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        """The identity behind relayed keys, operator-certified."""
        return self._link.trusted(keys)

    def verify_coordinator(self, message: BaseMessage) -> None:
        """Check the pinned coordinator's signature (NotReadyError: none yet)."""
        self._link.verify_coordinator(message)

    def retry_training(self) -> None:
        """Re-check the rounds waiting to train."""
        self._training().maybe_train()

    def forget_downloads(self) -> None:
        """Drop every downloaded version (the trainer switched models)."""
        self._training().forget_downloads()
