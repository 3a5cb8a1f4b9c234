"""Shared state and helpers of the edge client (its protocol steps build on it).

`DeviceCore` holds the device's view of the federation: the pinned
coordinator identity, the adopted key epoch, the agent's identity, the
epoch's keys and obfuscator pool, its registry slot, the decrypted overall
registry and the current round. Handlers that need something not known yet
raise `NotReadyError`; the client parks that message and retries it after the
next change. Sending goes through an outbox that the client flushes outside
its lock.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import FixedPoint
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity, verify_signature
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.state import DeviceStateDir, StoredEpoch
from ursa.edge_sdk.trainer import Trainer
from ursa.protocol.envelope import encode, message_kind, signing_bytes
from ursa.protocol.messages import BaseMessage, KeyEpochStart
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import NotReadyError
from ursa.protocol.topics import name_for, qos_for, up_topic

__all__ = [
    "DISTRIBUTION_CODEC",
    "DeviceCore",
    "DeviceStats",
    "TrainingStats",
    "derived_id",
    "seal_context",
]

DISTRIBUTION_CODEC = FixedPoint(bound=1.0)
"""Label distributions in [0, 1], 24 fraction bits (the protocol-wide scale)."""


class DeviceStats:
    """Counters for demos and benchmarks (crypto seconds, rounds)."""

    def __init__(self) -> None:
        self.crypto_s = 0.0
        self.selected_rounds: list[int] = []
        self.answered_rounds: list[int] = []


@dataclass
class TrainingStats:
    """Counters of the training side (for demos and benchmarks)."""

    train_s: float = 0.0
    rounds_trained: int = 0
    update_bytes: int = 0
    models_downloaded: int = 0
    dual_steps: int = 0


def seal_context(federation: str, epoch: int) -> bytes:
    """What a sealed epoch key is bound to (federation and key epoch)."""
    return f"ursa-epoch-key|{federation}|{epoch}".encode()


def derived_id(*parts: object) -> str:
    """A deterministic message id: answering twice is recognised as one answer."""
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()[:32]


class DeviceCore:
    """State and helpers shared by the device's protocol steps."""

    _config: DeviceConfig
    _labels: NDArray[np.int64]
    _trainer: Trainer
    _rng: np.random.Generator
    _store: DeviceStateDir
    _identity: DeviceIdentity
    _outbox: Outbox
    stats: DeviceStats
    enrolled: threading.Event
    _coordinator: DevicePublicIdentity | None
    _refused_coordinators: set[str]
    """Fingerprints of coordinators this device refused (and said so, once)."""
    _epoch: KeyEpochStart | None
    _epoch_payload: bytes
    _agent: DevicePublicIdentity | None
    _public_key: PaillierPublicKey | None
    _secret_key: PaillierSecretKey | None
    _pool: ObfuscatorPool | None
    _index: int | None
    _registry: NDArray[np.int64] | None
    _trained: set[int]
    _registered_epoch: int | None

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self._config.device_id

    def _send(self, message: BaseMessage) -> None:
        name = name_for(message_kind(message))
        topic = up_topic(self._config.federation, self.device_id, name)
        self._outbox.put(topic, encode(message), qos_for(name))

    def _signed(self, message: BaseMessage) -> BaseMessage:
        signature = self._identity.sign(signing_bytes(message))
        return message.model_copy(update={"signature": signature})

    def _verify(self, signer: DevicePublicIdentity, message: BaseMessage) -> None:
        signature: bytes = getattr(message, "signature", b"")
        verify_signature(signer, signing_bytes(message), signature)

    def _require_epoch(self, epoch: int) -> KeyEpochStart:
        """The adopted epoch if it is `epoch`; blocks on a newer one, refuses older."""
        current = self._epoch
        if current is None or epoch > current.epoch:
            raise NotReadyError
        if epoch < current.epoch:
            raise ValueError(f"key epoch {epoch} is over (current {current.epoch})")
        return current

    def _distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """The label distribution over `num_classes`, or None if labels do not fit."""
        if self._labels.size == 0 or int(self._labels.max()) >= num_classes:
            return None
        counts = np.bincount(self._labels, minlength=num_classes).astype(np.float64)
        distribution: NDArray[np.float64] = counts / counts.sum()
        return distribution

    def _set_public_key(self, public_key: PaillierPublicKey) -> None:
        self._public_key = public_key
        size = self._config.obfuscator_pool_size
        if size > 0 and self._pool is None:
            self._pool = ObfuscatorPool(public_key, size)

    def _save_epoch(self) -> None:
        self._store.save_epoch(
            StoredEpoch(
                notice=self._epoch_payload,
                agent=None if self._agent is None else self._agent.to_bytes(),
                public_key=None
                if self._public_key is None
                else self._public_key.to_bytes(),
            )
        )

    def _maybe_register(self, *, resend: bool) -> None:
        raise NotImplementedError

    def methods(self) -> tuple[str, ...]:
        """The methods this device runs (must equal the key epoch's signed list)."""
        raise NotImplementedError

    def _send_hello(self) -> None:
        raise NotImplementedError
