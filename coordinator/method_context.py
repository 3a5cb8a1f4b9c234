"""What the coordinator lends its methods: a context object, never the service.

The service builds one `MethodContext` with its parts; the selection and
the balancing method are built with it (`ursa.coordinator.methods.registry`),
as are the round plugin (its `PluginContext`) and the before-training steps.
It holds the
runtime's public surface as plain callables (send, relay, sign, the clock,
the key epoch's view, who is online, the store, the enrolled devices' keys),
so a method can neither reach the service's state nor depend on how the
service is composed. The store opens when the service starts, before any
round or device message.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Protocol

from ursa.coordinator.plugin import EpochView, SignedT
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity
from ursa.protocol.messages import BaseMessage

__all__ = ["MethodContext", "Signer"]


class Signer(Protocol):
    """Stamps a message with the run and signs it (the one signing point)."""

    def __call__(self, message: SignedT) -> SignedT:
        """``message`` in this run, signed."""


@dataclass(frozen=True)
class MethodContext:
    """The runtime's surface for methods (`CoordinatorView`, `SelectionContext`).

    Args:
        federation: The federation id (messages carry it).
        stores: The coordinator's store (opened at start); writes join the
            current transaction.
        online: Enrolled devices online and not sitting the epoch out (a live
            read-only view, never a copy).
        epoch: The current key epoch's public data, or None before the first.
        sender: Queues a message for a device (None: the global topic).
        signer: Stamps a message with the run and signs it.
        announcer: Publishes the open round's announce again.
        identities: An enrolled device's identity keys, or None.
        certificates: An enrolled device's operator certificate (b"": tofu).
        clock: Seconds, for the method's own deadlines (the service's clock).
        raw_sender: Queues encoded bytes of a kind for a device (None: the
            global topic): a device's message relayed as it arrived.
    """

    federation: str
    stores: Callable[[], CoordinatorStore]
    online: Set[str]
    epoch: Callable[[], EpochView | None]
    sender: Callable[[BaseMessage, str | None], None]
    signer: Signer
    announcer: Callable[[], None]
    identities: Callable[[str], DevicePublicIdentity | None]
    certificates: Callable[[str], bytes]
    clock: Callable[[], float]
    raw_sender: Callable[[bytes, str, str | None], None]

    @property
    def store(self) -> CoordinatorStore:
        """The coordinator's store (raises before the service started)."""
        return self.stores()

    def epoch_view(self) -> EpochView | None:
        """The current key epoch (public key, registered devices, agent)."""
        return self.epoch()

    def online_devices(self) -> Set[str]:
        """Enrolled devices currently online (a live read-only view: copy to keep)."""
        return self.online

    def send(self, message: BaseMessage, device: str | None) -> None:
        """Queue a message (flushed after the current step)."""
        self.sender(message, device)

    def send_raw(self, payload: bytes, kind: str, device: str | None) -> None:
        """Queue encoded bytes of ``kind`` (a relayed device message)."""
        self.raw_sender(payload, kind, device)

    def now(self) -> float:
        """The runtime's clock, in seconds."""
        return self.clock()

    def sign(self, message: SignedT) -> SignedT:
        """``message`` stamped with the run and signed by the coordinator."""
        return self.signer(message)

    def reannounce(self) -> None:
        """Publish the open round's `RoundAnnounce` again (a fresh message id)."""
        self.announcer()

    def device_identity(self, device: str) -> DevicePublicIdentity | None:
        """An enrolled device's identity keys (its peers verify it with them)."""
        return self.identities(device)

    def device_certificate(self, device: str) -> bytes:
        """An enrolled device's operator certificate (b"": none, tofu)."""
        return self.certificates(device)
