"""The training-phase hook of a round: what happens after the selection.

The coordinator runs selection (Dubhe) itself and then hands the round to a
`RoundPlugin` until `is_complete()`. FedAvg, CLIMB and FedDisk plug in here;
the default `NoTraining` completes every round at once (selection only).

Contract: `on_selected` may be called again for the same round after a
coordinator restart (it must be idempotent), `on_message` gets every
admitted device message the selection stages do not consume (already
authenticated, deduplicated and checked for the round), and the coordinator
completes the round once `is_complete()` is true or the training deadline
passes, whichever comes first. Optional hooks: `attach(view)` once at start
(read-only access to the key epoch and who is online, and the coordinator's
store for the plugin's progress and phase records: `on_message` runs inside
the transaction that marks the message seen), `on_tick(round, now,
send)` at every tick of the training stage (sub-phase deadlines, re-requests),
`on_device_failed(round, device, code)` when a selected device reports that
its training failed (``training_failed``: the round stops waiting for it),
`final_model(send)` once the rounds are done (the `FederationEnd` names it);
device `chunk_request`s reach `on_message` in any stage (model downloads).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from ursa.coordinator.federation_end import FinalModel
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.paillier import PaillierPublicKey
from ursa.protocol.messages import BaseMessage, ModelSpec

SignedT = TypeVar("SignedT", bound=BaseMessage)
"""A message the coordinator signs (returned as the same type)."""

__all__ = [
    "CoordinatorView",
    "EpochView",
    "NoTraining",
    "RoundOutcome",
    "RoundPlugin",
    "Send",
]

Send = Callable[[BaseMessage, str | None], None]
"""How a plugin publishes: ``send(message, device_id)``; None means to all."""


@dataclass(frozen=True)
class EpochView:
    """The current key epoch as a plugin may see it (public data only)."""

    epoch: int
    public_key: PaillierPublicKey | None
    registered: Set[str]
    agent: str | None = None
    agent_identity: DevicePublicIdentity | None = None
    """The agent's identity keys, to check what it signs."""


class CoordinatorView(Protocol):
    """What the service gives a plugin: the epoch, who is online, the store."""

    def epoch_view(self) -> EpochView | None:
        """The current key epoch, or None before the first."""
        ...

    def online_devices(self) -> Set[str]:
        """Enrolled devices currently online (a live read-only view: copy to keep)."""
        ...

    @property
    def store(self) -> CoordinatorStore:
        """The coordinator's store (method state and phase records go here)."""
        ...

    def sign(self, message: SignedT) -> SignedT:
        """``message`` stamped with the run and signed by the coordinator."""
        ...

    def device_identity(self, device: str) -> DevicePublicIdentity | None:
        """An enrolled device's identity keys, or None."""
        ...

    def device_certificate(self, device: str) -> bytes:
        """An enrolled device's operator certificate (b"": none, tofu)."""
        ...


@dataclass(frozen=True)
class RoundOutcome:
    """A finished round's participants: counted in its sum, or failed."""

    contributed: frozenset[str]
    failed: frozenset[str]


class RoundPlugin(ABC):
    """Training phase of a round (after the exactly-K selection)."""

    def attach(self, view: CoordinatorView) -> None:  # noqa: B027 - optional hook
        """Called once when the service starts (default: ignore)."""

    def on_tick(self, round_index: int, now: float, send: Send) -> None:  # noqa: B027
        """Called at every tick of the training stage (default: nothing)."""

    @abstractmethod
    def on_selected(
        self, round_index: int, selected: tuple[str, ...], send: Send
    ) -> None:
        """The round's participants are fixed; start training them."""

    @abstractmethod
    def on_message(self, round_index: int, message: BaseMessage, send: Send) -> None:
        """A device message for the training phase (e.g. a model update)."""

    @abstractmethod
    def is_complete(self, round_index: int) -> bool:
        """Whether the round's training phase is done."""

    def methods(self) -> tuple[str, ...]:
        """Methods this plugin needs devices to run (signed into each key epoch)."""
        return ()

    def aggregation_mode(self) -> Literal["secure", "plain"]:
        """How its rounds sum updates, signed into each key epoch (``secure``)."""
        return "secure"

    def model_spec(self) -> ModelSpec | None:
        """The tensor spec of the model its rounds train, signed into each key epoch.

        Devices check their own model against it before they register
        (None: no model, nothing to check).
        """
        return None

    def extend_deadlines(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """The broker was away ``seconds``: give open windows that time back."""

    def on_device_failed(  # noqa: B027 - optional hook
        self, round_index: int, device: str, code: str
    ) -> None:
        """A device's work in the round failed or was refused (its `ErrorReply`).

        A selected device's training failed: stop waiting for it. ``code``
        ``mean_refused``: a device refused a secure mean's sum (it still trains).
        """

    def last_metrics(self) -> Mapping[str, Any]:
        """The last completed round's evaluation (for ``target_accuracy``)."""
        return {}

    def round_outcome(self, round_index: int) -> RoundOutcome | None:
        """Whose contributions a finished round counted, and who failed it.

        The runtime keeps each device's streak of failed rounds from it
        (`ursa.coordinator.training_health`); None: the plugin does not say.
        """
        return None

    def final_model(self, send: Send) -> FinalModel | None:
        """The federation is over: the final model, its chunks sent (None: no model)."""
        return None


class NoTraining(RoundPlugin):
    """Selection only: every round completes as soon as it is selected."""

    def on_selected(
        self, round_index: int, selected: tuple[str, ...], send: Send
    ) -> None:
        """Nothing to train."""

    def on_message(self, round_index: int, message: BaseMessage, send: Send) -> None:
        """No training messages are expected."""

    def is_complete(self, round_index: int) -> bool:
        """Always complete."""
        return True
