"""One device of an in-process CLIMB run: the production `Climb` on its own transport.

In a federation, CLIMB's device half is the `Climb` method and the runtime's
`SecureMeans` inside an `EdgeClient`. The simulation (`ursa.lab.simulate.climb_fleet`)
runs both production objects behind the least `DeviceContext` they need: a
`ClimbDevice` subscribes to the device's topics, admits what arrives (its
federation, from the coordinator, signed by the coordinator's identity),
routes it through a `Router` and publishes replies in order. What a real
client adds and the simulation leaves out: the key epoch's agent and sealed
secret key (every device is handed the epoch's `EpochKeys`), model downloads
(the fleet's published versions are read from a shared table) and training
(the simulator trains the selected devices itself and reads `weight`).

Its trainer's ``f_i`` is `ursa.lab.simulate.fleet_mlp`'s mean cross-entropy,
the numpy twin of the torch trainer's `evaluate_loss` (tested equal). Anything
refused is logged and kept in `rejections`; nothing received raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity, verify_signature
from ursa.edge_sdk.method import EpochKeys, Roster
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.secure_mean import SecureMeans
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.edge_sdk.stats import DeviceStats, TrainingStats
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer, Trainer
from ursa.lab.simulate.bare_device_link import BareDeviceLink
from ursa.lab.simulate.fleet_mlp import cross_entropy, forward
from ursa.models.weights import Arrays
from ursa.protocol.envelope import decode, message_kind, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    ErrorCode,
    ErrorReply,
    IdentityKeys,
    KeyEpochStart,
)
from ursa.protocol.router import NotReadyError, RejectedError, Router
from ursa.protocol.transport import Transport
from ursa.tools.data.federation import DeviceData

__all__ = ["ClimbDevice", "LossOnlyTrainer"]

logger = logging.getLogger("ursa.lab.simulate.climb")


class LossOnlyTrainer(ModelTrainer):
    """A device's ``f_i`` on its own data; the simulator trains the rounds itself."""

    model = "mlp"

    def __init__(self, data: DeviceData) -> None:
        self.data = data

    def local_loss(self, global_arrays: Arrays) -> float:
        """Mean cross-entropy per sample in nats (= `evaluate_loss`)."""
        ce = cross_entropy(forward(global_arrays, self.data.x), self.data.y)
        return float(ce.mean())

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        """Not here: the simulator trains the selected devices as one fleet."""
        raise NotImplementedError("the simulator trains the rounds (fleet_mlp)")


class ClimbDevice:
    """`Climb` and `SecureMeans` with their own transport (module docstring).

    Args:
        device_id: This device's id.
        federation: The federation id.
        data: Its local data (``f_i`` is evaluated on it).
        config: CLIMB's device constants.
        keys: The key epoch's keys (notice, public and secret key).
        coordinator: The coordinator's public identity (signatures checked).
        models: The published global versions (the simulated downloads).
        state_dir: Its state directory (CLIMB persists lambda and weight there).
        transport: Its connection; `attach` subscribes and takes its messages.
    """

    def __init__(
        self,
        device_id: str,
        federation: str,
        data: DeviceData,
        config: ClimbConfig,
        *,
        keys: EpochKeys,
        coordinator: DevicePublicIdentity,
        models: Mapping[int, Arrays],
        state_dir: Path,
        transport: Transport,
    ) -> None:
        self.device_id = device_id
        self.federation = federation
        self.store = DeviceStateDir(state_dir)
        self.stats = DeviceStats()
        self.training_stats = TrainingStats()
        self.trainer: Trainer = LossOnlyTrainer(data)
        self.epoch: KeyEpochStart | None = keys.notice
        self.rng = np.random.default_rng(0)  # CLIMB draws nothing
        self.rejections: list[tuple[str, str]] = []
        self._keys = keys
        self._coordinator = coordinator
        self._models = models
        self._lock = threading.Lock()
        self._link = BareDeviceLink(federation, device_id, transport)
        self.climb = Climb(self, config)
        self._means = SecureMeans(self, [self.climb])
        self._router = Router(device_id)
        self.climb.register(self._router)
        self._means.register(self._router)
        self.climb.start()

    # --- what the simulation reads --------------------------------------------

    @property
    def weight(self) -> float:
        """``w_i``: the scale of this device's next delta."""
        return self.climb.weight

    @property
    def lam(self) -> float:
        """``lambda_i``: this device's dual variable."""
        return self.climb.lam

    # --- the DeviceContext ------------------------------------------------------

    @property
    def model_version(self) -> int | None:
        """The latest published version."""
        return max(self._models, default=None)

    def send(self, message: BaseMessage) -> None:
        """Queue a message for the coordinator (published after the handler)."""
        self._link.send(message)

    def signed(self, message: BaseMessage) -> BaseMessage:
        """Unsigned: the host trusts the bus (admission is the service's)."""
        return message

    def keys(self, epoch: int) -> EpochKeys:
        """The one epoch's keys.

        Raises:
            NotReadyError: another epoch.
        """
        if epoch != self._keys.notice.epoch:
            raise NotReadyError
        return self._keys

    def current_keys(self) -> EpochKeys | None:
        """The one epoch's keys."""
        return self._keys

    def model_arrays_at(self, version: int) -> Arrays | None:
        """A published version (None: never published)."""
        return self._models.get(version)

    def seconds_since_model_notice(self) -> float:
        """Zero: the simulator trains only after the dual step closed."""
        return 0.0

    def retry_training(self) -> None:
        """Nothing waits: the simulator trains after the dual step."""

    def forget_downloads(self) -> None:
        """The versions are the fleet's, not this device's."""

    def roster(self) -> Roster | None:
        """No registry: CLIMB does not read one."""
        return None

    def label_distribution(self, num_classes: int) -> NDArray[np.float64] | None:
        """Not read by CLIMB."""
        return None

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        """CLIMB talks to no peer."""
        raise NotImplementedError("CLIMB seals nothing to peers")

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        """CLIMB talks to no peer."""
        raise NotImplementedError("CLIMB opens nothing from peers")

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        """The keys as given: a simulation has no operator."""
        return keys.public_identity()

    def verify_coordinator(self, message: BaseMessage) -> None:
        """The coordinator's signature on ``message``.

        Raises:
            RejectedError: a missing or bad signature.
        """
        signature: bytes = getattr(message, "signature", b"")
        try:
            verify_signature(self._coordinator, signing_bytes(message), signature)
        except CryptoError as exc:
            raise RejectedError(
                ErrorCode.BAD_SIGNATURE, f"not the coordinator's: {exc}"
            ) from None

    # --- receiving ------------------------------------------------------------

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to own topics."""
        self._link.attach(self.handle)

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: admit one raw message, route it, publish the replies."""
        if self._link.addressed(topic) is None:
            return
        kind = "?"
        try:
            message = decode(payload)
            kind = message_kind(message)
            with self._lock:
                self._admit(message)
                self._route(message)
        except ProtocolError as exc:
            self._note(kind, str(exc))
        except RejectedError as exc:
            self._note(kind, exc.reason)
        except Exception as exc:  # nothing received may crash the device
            logger.exception("CLIMB: %s failed on %s", kind, self.device_id)
            self._note(kind, f"internal error: {exc!r}")
        self._link.flush()

    def _admit(self, message: BaseMessage) -> None:
        if message.federation != self.federation:
            raise RejectedError(ErrorCode.MALFORMED, "another federation")
        if message.sender != COORDINATOR:
            raise RejectedError(ErrorCode.UNAUTHORISED, "not from the coordinator")
        self.verify_coordinator(message)

    def _route(self, message: BaseMessage) -> None:
        if isinstance(message, ErrorReply):
            self._means.on_error_reply(message)
            return
        self._router.dispatch(message)

    def _note(self, kind: str, reason: str) -> None:
        logger.warning("CLIMB %s rejected %s: %s", self.device_id, kind, reason)
        self.rejections.append((kind, reason))
