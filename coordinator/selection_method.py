"""The contract of a coordinator selection method: who takes part in a round.

A federation has exactly one selection method (``[[methods]]``), a package
under ``coordinator/methods/<m>/`` registered in
`ursa.coordinator.methods.registry`: Dubhe's encrypted self-selection
(``dubhe``) or the uniform baseline (``random``). The runtime opens each
round (the stored, retained `RoundAnnounce`), calls `SelectionMethod.open_round`
and then `SelectionMethod.select` at every step of its SELECTING stage (every
tick and after every admitted message) until the method names the
participants. The runtime checks them (K distinct eligible devices), signs
and publishes the `SelectionResult`, persists it with the round, and hands
the round to the training method.

What the runtime owns: admission, dedup, the store's transaction around each
message, the key epoch, the announce and the signed result. What a method
owns: the messages it registers on the runtime's `Router` (Dubhe's
volunteers, distributions and agent answer), its own windows and deadlines
(`SelectionRequest.now`), and its progress in the store (in the transaction
of the message that changed it), so that after a restart `resume` re-sends
what it waits on and a re-sent device answer is never counted twice.

A method with no messages (random) implements only `select`: a pure function
of what the runtime saw.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from ursa.coordinator.plugin import EpochView
from ursa.coordinator.store import CoordinatorStore, NaturalKey
from ursa.protocol.messages import BaseMessage, Registration
from ursa.protocol.router import Router

__all__ = [
    "Selection",
    "SelectionContext",
    "SelectionMethod",
    "SelectionRequest",
]


@dataclass(frozen=True)
class SelectionRequest:
    """What a selection method may base a round's participants on.

    Attributes:
        round: The round being selected.
        epoch: The key epoch the round runs in.
        k: How many participants the round needs (exactly).
        eligible: Devices registered in this key epoch (they hold its key, which
            CLIMB's and FedDisk's encrypted means need) and online now. The
            runtime passes a set built on first use (`LazyDevices`): a method
            that reads it per message pays O(N) per message.
        rng: The coordinator's seeded generator (reproducible draws).
        now: The coordinator's clock (for a method's own windows).
        explicit_replies: The round's signed announce asks every online
            registered device to answer, all-no draws included (a fleet
            under ``[selection] explicit_replies_below``): a method may close
            its window once every eligible device has answered. False:
            silence means no.
    """

    round: int
    epoch: int
    k: int
    eligible: Set[str]
    rng: np.random.Generator
    now: float = 0.0
    explicit_replies: bool = False
    excluded: Set[str] = frozenset()
    """Devices of the epoch that sit it out (failing, a model that does not
    fit): in no selection, even if they volunteered before."""


@dataclass(frozen=True)
class Selection:
    """A method's answer: the participants, and what the runtime should record.

    Attributes:
        selected: Exactly K distinct eligible device ids.
        try_index: Which of Dubhe's tentative sets won (signed into the
            result; None for a method without tries or a repaired set).
        rekey: Start a new key epoch before the next round (e.g. Dubhe's agent
            stayed silent: it holds the only answer the protocol trusts).
    """

    selected: tuple[str, ...]
    try_index: int | None = None
    rekey: bool = False


class SelectionContext(Protocol):
    """What the runtime lends a selection method (given at construction).

    Its builder in `ursa.coordinator.methods.registry` hands it over; the
    store behind it opens when the service starts, before any round.
    """

    @property
    def federation(self) -> str:
        """The federation id (messages carry it)."""
        ...

    @property
    def store(self) -> CoordinatorStore:
        """The coordinator's store; writes join the current message's transaction."""
        ...

    def epoch_view(self) -> EpochView | None:
        """The current key epoch (public key, registered devices, agent)."""
        ...

    def online_devices(self) -> Set[str]:
        """Enrolled devices currently online (a live read-only view: copy to keep)."""
        ...

    def send(self, message: BaseMessage, device: str | None) -> None:
        """Queue a message for one device's down topic (None: the global topic)."""
        ...

    def reannounce(self) -> None:
        """Publish the open round's `RoundAnnounce` again (a fresh message id)."""
        ...


class SelectionMethod(ABC):
    """Chooses a round's participants; the runtime signs and publishes them."""

    name: ClassVar[str]
    """The method's ``[[methods]]`` kind (signed into each key epoch)."""

    @property
    def private_selection(self) -> bool:
        """Whether each selected device alone hears its selection (default: no).

        True when publishing the set would let devices link ids to private
        data (Dubhe's stratified draw): the runtime then signs a
        `SelectionResult` naming only its device and sends it to that device.
        """
        return False

    def register(self, router: Router) -> None:  # noqa: B027 - optional hook
        """Route the method's device messages to it (a kind has one owner)."""

    def open_round(self, request: SelectionRequest) -> None:  # noqa: B027
        """A new round was announced (default: nothing to prepare)."""

    def resume(self, request: SelectionRequest) -> None:  # noqa: B027
        """After a restart in SELECTING: reload progress, re-send what it waits on."""

    def registered(  # noqa: B027 - optional hook
        self, epoch: int, registration: Registration
    ) -> None:
        """The key epoch accepted ``registration``: keep what the method needs of it.

        Called inside the registration's transaction, so the method's rows
        and the registration are written together or not at all (Dubhe's
        rank key); the registry ciphertext is the key epoch's, not the
        method's. It does not refuse (the key epoch judged the registration):
        an error it raises rolls the whole message back, registration
        included. Default: nothing to keep.
        """

    def epoch_unusable(self, epoch: EpochView, online: Set[str]) -> str | None:
        """Why the next round needs a new key epoch first (None: it does not)."""
        return None

    def natural_key(self, message: BaseMessage) -> NaturalKey | None:
        """The stored row that de-duplicates one of its messages (None: a ``seen`` row).

        A method that keeps one row per device and round (`CoordinatorStore.
        add_method_row`) names it here, so a re-sent answer costs one read.
        """
        return None

    def extend_deadlines(self, seconds: float) -> None:  # noqa: B027 - optional hook
        """The broker was away ``seconds``: give open windows that time back."""

    @abstractmethod
    def select(self, request: SelectionRequest) -> Selection | None:
        """The round's participants, or None to be asked again at the next step."""
