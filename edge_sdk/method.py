"""The contract between the device runtime (`EdgeClient`) and a method.

A method's device half (CLIMB's dual steps, FedDisk's MADE phase, ...) is an
object composed into the client, not a base class of it. The client builds
one `DeviceMethod` per method it runs, handing it its `DeviceContext` in its
constructor (a `MethodFactory` is ``ctx -> method``): the identity, the
current key epoch's keys, the model downloads, the trainer and the outbox are
all a method reaches of the device, and it holds them from the start (there
is no half-built method without a device). Each registers its message kinds
on the client's typed `Router` (`register`). The runtime keeps the loop,
admission, dedup, parking of early messages, transfers and the key epoch;
a method never opens a connection or keeps its own dedup table.

A method that runs before the federation trains (FLICKER balances the
devices' data between enrolment and the first key epoch) may take transfers
that are not models (`take_transfer`, e.g. its CKKS context), seal and open
boxes to other devices through the context (ring hops, which the runtime
admits only on the device's own down topic: `Relay.PEER` on the kind), and
replace the device's data before it first registers (`replace_data`).

Hooks into a selected device's training round, in the order they run:
`admit_model` (may hold a `ModelAvailable` back), `ready_to_train` (may make
the round wait, e.g. for CLIMB's dual step), then `plan` (how the delta is
scaled). `on_model_ready` tells a method a new global version has arrived.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.edge_sdk.stats import DeviceStats, TrainingStats
from ursa.edge_sdk.trainer import ModelTrainer, Trainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    BaseMessage,
    Chunk,
    ErrorReply,
    IdentityKeys,
    KeyEpochStart,
    ModelAvailable,
    TransferManifest,
)
from ursa.protocol.methods import MethodRole
from ursa.protocol.router import Router

__all__ = [
    "DeviceContext",
    "DeviceMethod",
    "EpochKeys",
    "LocalData",
    "MethodFactory",
    "PeerChannel",
    "Roster",
    "TrainPlan",
    "model_trainer",
]


@dataclass(frozen=True)
class TrainPlan:
    """How a selected device trains a round; methods adjust it in config order.

    Attributes:
        round: The round being trained.
        delta_scale: The factor on the uploaded delta (CLIMB's ``w_i``).
        scaled: Whether a method scaled the delta (the coordinator then
            averages without example counts).
        proximal_mu: FedProx's ``mu``, signed by the coordinator: the trainer
            adds ``(mu / 2) * ||w - w_global||^2`` to its loss (0: none).
    """

    round: int
    delta_scale: float = 1.0
    scaled: bool = False
    proximal_mu: float = 0.0


@dataclass(frozen=True)
class LocalData:
    """The data a device trains on and registers: samples (if it has them), labels."""

    x: NDArray[Any] | None
    labels: NDArray[np.int64]


@dataclass(frozen=True)
class EpochKeys:
    """The adopted key epoch's Paillier keys as a method may use them."""

    notice: KeyEpochStart
    public_key: PaillierPublicKey
    secret_key: PaillierSecretKey | None
    """None until the agent's sealed key has been opened."""
    pool: ObfuscatorPool | None
    """Precomputed obfuscators (None: encrypt without a pool)."""


@dataclass(frozen=True)
class Roster:
    """The key epoch's registry as this device decrypted it (Dubhe's input).

    Attributes:
        epoch: The key epoch.
        index: This device's registry slot (its category), None if its labels
            do not fit the epoch's classes.
        registry: The overall registry: devices per slot.
    """

    epoch: int
    index: int | None
    registry: NDArray[np.int64]


class PeerChannel(Protocol):
    """The device as a method that talks to other devices sees it.

    Messages to a peer travel through the coordinator, sealed to the peer's
    identity (the coordinator relays them unopened); the coordinator signs
    who the peers are.
    """

    @property
    def device_id(self) -> str:
        """This device's id."""
        ...

    @property
    def federation(self) -> str:
        """The federation's name."""
        ...

    def send(self, message: BaseMessage) -> None:
        """Queue ``message`` on this device's up topic."""
        ...

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        """``plaintext`` sealed from this device to ``peer``, bound to ``context``."""
        ...

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        """A box ``peer`` sealed to this device under ``context``.

        Raises:
            CryptoError: the box does not open.
        """
        ...

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        """The identity behind keys the coordinator relayed, operator-certified.

        Raises:
            UntrustedIdentityError: under ``[trust]``, no valid operator
                certificate for these keys.
        """
        ...

    def verify_coordinator(self, message: BaseMessage) -> None:
        """Check the coordinator's signature on ``message``.

        Raises:
            NotReadyError: the coordinator's identity is not pinned yet.
            CryptoError: a bad signature.
        """
        ...


class DeviceContext(PeerChannel, Protocol):
    """What a method may use of its device (provided by `EdgeClient`)."""

    @property
    def store(self) -> DeviceStateDir:
        """The device's state directory (`DeviceStateDir.method_state` per method)."""
        ...

    @property
    def stats(self) -> DeviceStats:
        """Crypto time and selection counters."""
        ...

    @property
    def training_stats(self) -> TrainingStats:
        """Training counters."""
        ...

    @property
    def trainer(self) -> Trainer:
        """The device's trainer."""
        ...

    @property
    def model_version(self) -> int | None:
        """The latest global version downloaded."""
        ...

    @property
    def epoch(self) -> KeyEpochStart | None:
        """The adopted key epoch's notice (signed by the coordinator)."""
        ...

    @property
    def rng(self) -> np.random.Generator:
        """The device's private randomness (e.g. Dubhe's volunteer coins)."""
        ...

    def roster(self) -> Roster | None:
        """The adopted epoch's decrypted registry (None until its sum is here)."""
        ...

    def label_distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """This device's label distribution (None if its labels do not fit)."""
        ...

    def signed(self, message: BaseMessage) -> BaseMessage:
        """``message`` signed with the device's identity key."""
        ...

    def keys(self, epoch: int) -> EpochKeys:
        """Key epoch ``epoch``'s keys.

        Raises:
            NotReadyError: that epoch (or its public key) is not here yet.
            ValueError: ``epoch`` is over.
        """
        ...

    def current_keys(self) -> EpochKeys | None:
        """The adopted epoch's keys, or None while its public key is missing."""
        ...

    def model_arrays_at(self, version: int) -> Arrays | None:
        """The global ``version`` if downloaded; else None, and fetch it."""
        ...

    def seconds_since_model_notice(self) -> float:
        """Seconds since the current round's `ModelAvailable` arrived."""
        ...

    def retry_training(self) -> None:
        """Re-check the rounds waiting to train (after a hook changed its mind)."""
        ...

    def forget_downloads(self) -> None:
        """Drop every downloaded version (the trainer switched models)."""
        ...


def model_trainer(ctx: DeviceContext) -> ModelTrainer | None:
    """The context's trainer if it trains models (else None)."""
    trainer = ctx.trainer
    return trainer if isinstance(trainer, ModelTrainer) else None


class DeviceMethod(ABC):
    """A method's device half, composed into `EdgeClient`.

    The contract holds no state: each method keeps the `DeviceContext` it is
    built with (its first constructor argument) itself.
    """

    name: ClassVar[str]
    """The method's ``[[methods]]`` kind (compared with the signed list)."""
    role: ClassVar[MethodRole | None] = None
    """What it provides (None: a helper that is no ``[[methods]]`` kind)."""

    @abstractmethod
    def register(self, router: Router) -> None:
        """Register this method's message kinds on the device's ``router``."""

    def start(self) -> None:  # noqa: B027 - optional hook
        """Reload persisted progress (the client starts; default: nothing)."""

    def new_run(self) -> None:  # noqa: B027 - optional hook
        """The coordinator started a new run: forget this run's progress.

        The state directory's method progress is already gone; a method
        resets what it keeps in memory (as a device that never ran).
        """

    def take_transfer(self, message: TransferManifest | Chunk) -> bool:
        """Take a transfer message that is not a model's (default: not mine).

        Returns True when the message belongs to this method (the runtime then
        does not treat it as a model download). Raises as a handler does.
        """
        return False

    def registration_key(self, epoch: int) -> bytes | None:
        """A public key to send with this epoch's registration (default: none).

        Dubhe's stratified draw sends a one-time X25519 key; the runtime puts
        the first method's key into `Registration.rank_key`.
        """
        return None

    def replace_data(self) -> LocalData | None:
        """The data to use instead of the device's own, or None (default: keep).

        Asked once, when the first signed key epoch arrives, before the
        device computes its registry entry: a balancing method's run is over.
        """
        return None

    def admit_model(self, message: ModelAvailable) -> None:  # noqa: B027
        """Raise `NotReadyError` to hold a model notice back (default: admit)."""

    def ready_to_train(self, round_index: int) -> bool:
        """Whether a selected round may train now (default: yes)."""
        return True

    def plan(self, plan: TrainPlan) -> TrainPlan:
        """Adjust how the round trains (default: unchanged)."""
        return plan

    def on_model_ready(self) -> None:  # noqa: B027 - optional hook
        """A new global version has been downloaded (default: nothing)."""

    def on_error_reply(self, message: ErrorReply) -> None:  # noqa: B027
        """The coordinator refused something this device sent (default: ignore)."""


MethodFactory = Callable[[DeviceContext], DeviceMethod]
"""Builds a method over its device's context (``EdgeClient(methods=[...])``).

An app gives factories, not methods, because the context exists only once
the client does: ``lambda ctx: Flicker(ctx, spec, labels=y, x=x)``, or a
method class whose constructor takes the context alone (``Dubhe``).
"""
