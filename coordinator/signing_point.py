"""The signing point: every message the coordinator sends is stamped, signed, queued.

Everything the coordinator sends is stamped with this run and encoded here;
every message devices check (`envelope.signed_by_coordinator`: all but a
chunk) is signed here, so no part of the runtime can publish an unsigned
notice. Nothing is published directly: messages go into the outbox, which
the service flushes after releasing its lock (a synchronous in-memory bus
that delivers replies re-entrantly never sees a half-updated state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import (
    encode,
    message_kind,
    signed_by_coordinator,
    signing_bytes,
)
from ursa.protocol.messages import BaseMessage
from ursa.protocol.outbox import Outbox
from ursa.protocol.topics import (
    RETAINED_GLOBAL_NAMES,
    down_topic,
    global_topic,
    name_for,
    qos_for,
)

__all__ = ["SigningPoint", "signed_for_devices"]

_M = TypeVar("_M", bound=BaseMessage)


def signed_for_devices(
    original: BaseMessage, stamped: _M, sign: Callable[[_M], _M]
) -> _M:
    """``stamped`` signed if devices check it and its signature is not yet valid.

    Devices check every coordinator message but a chunk
    (`envelope.signed_by_coordinator`); a message signed before ``stamped``
    changed its run (``stamped is not original``) is signed again.
    """
    if signed_by_coordinator(stamped) and (
        stamped is not original or not stamped.signature
    ):
        return sign(stamped)
    return stamped


class SigningPoint:
    """Stamps, signs and queues what the coordinator sends (module docstring).

    Args:
        federation: The federation whose topics messages go to.
        outbox: Where encoded messages wait for the next flush.
        telemetry: Counts what is sent, by kind.
    """

    def __init__(self, federation: str, outbox: Outbox, telemetry: Telemetry) -> None:
        self._federation = federation
        self._outbox = outbox
        self._telemetry = telemetry
        self._identity: DeviceIdentity | None = None
        self._run = ""

    def start(self, identity: DeviceIdentity, run: str) -> None:
        """Sign with ``identity``, stamp ``run`` from now on (the service started)."""
        self._identity = identity
        self._run = run

    @property
    def run(self) -> str:
        """This run's id (`CoordinatorStore.run_id`; "" before the start)."""
        return self._run

    def in_run(self, message: _M) -> _M:
        """`message` stamped with this run (a no-op if it carries it already)."""
        if message.run == self._run:
            return message
        return message.model_copy(update={"run": self._run})

    def sign(self, message: _M) -> _M:
        """Stamp the run, then sign: the signature covers the run."""
        identity = self._identity
        if identity is None:
            raise RuntimeError("nothing is signed before the service started")
        stamped = self.in_run(message)
        signature = identity.sign(signing_bytes(stamped))
        return stamped.model_copy(update={"signature": signature})

    def encode(self, message: BaseMessage) -> bytes:
        """The wire bytes of a message of this run, signed where devices check.

        A message signed before it was stamped with this run is signed again.
        """
        return encode(signed_for_devices(message, self.in_run(message), self.sign))

    def send(self, message: BaseMessage, device: str | None = None) -> None:
        """Queue `message` for one device's down topic, or the global topic."""
        self.send_raw(self.encode(message), message_kind(message), device)

    def send_raw(self, payload: bytes, kind: str, device: str | None) -> None:
        """Queue encoded bytes of ``kind`` (a stored notice published again)."""
        name = name_for(kind)
        if device is None:
            topic = global_topic(self._federation, name)
            retain = name in RETAINED_GLOBAL_NAMES
        else:
            topic = down_topic(self._federation, device, name)
            retain = False
        self._outbox.put(topic, payload, qos_for(name), retain)
        self._telemetry.sent(kind)
