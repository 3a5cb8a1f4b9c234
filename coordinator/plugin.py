"""The training-phase hook of a round: what happens after the selection.

The coordinator runs selection (Dubhe) itself and then hands the round to a
`RoundPlugin` until `is_complete()`. FedAvg, CLIMB and FedDisk plug in here;
the default `NoTraining` completes every round at once (selection only).

Contract: `on_selected` may be called again for the same round after a
coordinator restart (it must be idempotent), `on_message` gets every
admitted device message the selection stages do not consume (already
authenticated, deduplicated and checked for the round), and the coordinator
completes the round once `is_complete()` is true or the training deadline
passes, whichever comes first. A plugin is built with its `PluginContext`
(a `PluginBuilder` from composition, called when the service wires its
parts): the view (read-only access to the key epoch and who is online, and
the coordinator's store for the plugin's progress and phase records, open
before any round: `on_message` runs inside the transaction that marks the
message seen) and the runtime's before-training steps (`TrainingSteps`).

The runtime runs the methods' steps between `on_selected` (the plugin has
published the round's model) and `on_steps_done` (the plugin trains): it
asks `round_info` what the round trains (None: no steps this round).
Optional hooks: `on_tick(round, now,
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

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.federation_end import FinalModel
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.paillier import PaillierPublicKey
from ursa.protocol.messages import BaseMessage, ModelSpec, ModelUpdate

SignedT = TypeVar("SignedT", bound=BaseMessage)
"""A message the coordinator signs (returned as the same type)."""

__all__ = [
    "CoordinatorView",
    "EpochView",
    "NoSteps",
    "NoTraining",
    "PluginBuilder",
    "PluginContext",
    "RoundInfo",
    "RoundOutcome",
    "RoundPlugin",
    "Send",
    "TrainingSteps",
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
class RoundInfo:
    """The round a step runs in: what the selected devices will train."""

    round: int
    model: str
    version: int
    """The global version the round trains from (the published model)."""
    selected: tuple[str, ...]


class TrainingSteps(Protocol):
    """What training reads of the round's before-training steps.

    The runtime runs the steps (`ursa.coordinator.step_runner.StepRunner`);
    the training plugin only asks them what they change about its round.
    """

    @property
    def weighting(self) -> Weighting | None:
        """How the rounds average updates, if a step says (None: the config's)."""
        ...

    def methods(self) -> tuple[str, ...]:
        """The signed methods the steps name (CLIMB's ``climb``; none: empty)."""
        ...

    def fleet_needs_model(self, round_index: int) -> bool:
        """Whether every online device reads the round's model in a step."""
        ...

    def awaits(self, round_index: int, now: float) -> bool:
        """Whether a step's own figure is still on its way (the round waits)."""
        ...

    def on_update(self, round_index: int, device: str, message: ModelUpdate) -> None:
        """An update was counted in the round."""
        ...

    def answered(self, round_index: int) -> Mapping[str, int]:
        """Devices that answered each step of the round, by step name."""
        ...

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """What the steps learned in the round (read once it aggregated)."""
        ...


class NoSteps:
    """No before-training steps (a plugin built outside a service, or none composed)."""

    weighting: Weighting | None = None

    def methods(self) -> tuple[str, ...]:
        """None."""
        return ()

    def fleet_needs_model(self, round_index: int) -> bool:
        """Never."""
        return False

    def awaits(self, round_index: int, now: float) -> bool:
        """Never."""
        return False

    def on_update(self, round_index: int, device: str, message: ModelUpdate) -> None:
        """Nothing to note."""

    def answered(self, round_index: int) -> Mapping[str, int]:
        """No step ran."""
        return {}

    def metrics(self, round_index: int) -> Mapping[str, Any]:
        """Nothing learned."""
        return {}


@dataclass(frozen=True)
class PluginContext:
    """What a round plugin is built with (its `PluginBuilder` is called with it)."""

    view: CoordinatorView
    """The key epoch, who is online, the store (open before any round)."""
    steps: TrainingSteps
    """The runtime's before-training steps, as training reads them."""


@dataclass(frozen=True)
class RoundOutcome:
    """A finished round's participants: counted in its sum, or failed."""

    contributed: frozenset[str]
    failed: frozenset[str]


class RoundPlugin(ABC):
    """Training phase of a round (after the exactly-K selection)."""

    def round_info(self, round_index: int) -> RoundInfo | None:
        """What the round trains while it waits on the runtime's steps.

        Asked after `on_selected`; None (the default): the round runs no
        before-training steps, `on_steps_done` follows at once.
        """
        return None

    def on_steps_done(self, round_index: int, send: Send) -> None:  # noqa: B027
        """The round's before-training steps are done: train (default: nothing).

        Called at every tick of the training stage once they are (idempotent).
        """

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


PluginBuilder = Callable[[PluginContext], RoundPlugin]
"""Builds the training plugin when the service wires its parts (composition's)."""


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
