"""The coordinator runtime's parts a lab host lends a production method or step.

`FlickerHost` and `StepHost` run a production coordinator object in-process
without a `CoordinatorService`; both need the same few of its parts: a
`CoordinatorStore` in the given directory, an `Outbox`, the `SigningPoint`
with a coordinator identity of its own, and the runtime's `Rejections` (a
signed `ErrorReply` to the sender of a refused message). `HostParts` holds
them and the one receive path both use: parse an up topic, decode, hand the
message to the host's dispatch, answer a refusal (and keep it in
`rejections`, for the tests and the bench). Admission (topic ACLs, sender,
enrolment, limits, seen ids) is the service's and is left out: the in-memory
bus of a simulation is trusted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ursa.coordinator.clock import Clock
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.rejections import Rejections
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import decode, message_kind
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import COORDINATOR, BaseMessage, ErrorCode
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import RejectedError
from ursa.protocol.topics import coordinator_subscriptions, parse_topic
from ursa.protocol.transport import Transport

__all__ = ["HostParts", "Refusal"]


@dataclass(frozen=True)
class Refusal:
    """One message the host refused: who sent it, its kind, the code and why."""

    device: str | None
    kind: str
    code: str
    reason: str


class HostParts:
    """Store, outbox, signing point and refusals of one lab host (module doc).

    Args:
        federation: The federation id (topics, messages).
        transport: Where messages go; `attach` makes it deliver to a handler.
        state_dir: Where the store lives (the caller removes it).
        clock: Seconds (the refusals' timestamps).
        logger: Where refusals are logged (the host's).
        identity: The coordinator's signing identity (a fresh one by default).
    """

    def __init__(
        self,
        federation: str,
        transport: Transport,
        *,
        state_dir: Path,
        clock: Clock,
        logger: logging.Logger,
        identity: DeviceIdentity | None = None,
    ) -> None:
        self.federation = federation
        self.identity = identity or DeviceIdentity.generate(COORDINATOR)
        self.rejections: list[Refusal] = []
        self.lock = threading.Lock()
        """Held while the hosted object runs (the transport's thread, the driver)."""
        self.transport = transport
        self.store = CoordinatorStore(state_dir / DB_FILENAME)
        self.outbox = Outbox("coordinator (lab)")
        telemetry = Telemetry()
        self.outgoing = SigningPoint(federation, self.outbox, telemetry)
        self.outgoing.start(self.identity, self.store.run_id())
        self._rejections = Rejections(
            federation,
            telemetry=telemetry,
            refusals=RefusalLog(logger),
            outgoing=self.outgoing,
            clock=clock,
            round_index=lambda: 0,
        )

    def attach(self, handler: Callable[[str, bytes], None]) -> None:
        """Deliver the transport's messages to ``handler``; subscribe to devices."""
        self.transport.set_handler(handler)
        for pattern in coordinator_subscriptions(self.federation):
            self.transport.subscribe(pattern)

    def flush(self) -> None:
        """Publish what the hosted object queued."""
        self.outbox.flush(self.transport)

    def receive(
        self, topic: str, payload: bytes, dispatch: Callable[[BaseMessage], None]
    ) -> None:
        """A device's message: decoded, dispatched under `lock`, refusals answered.

        ``dispatch`` raises `RejectedError` (or `ProtocolError`) to refuse.
        Messages not on a device's up topic of this federation are ignored.
        """
        try:
            where = parse_topic(topic)
        except ProtocolError:
            return  # not an ursa topic
        if where.federation != self.federation or where.direction != "up":
            return  # another federation's, or the coordinator's own messages
        device = where.device
        if device is None:
            return
        kind, message_id = "?", None
        with self.lock:
            try:
                message = decode(payload)
                kind, message_id = message_kind(message), message.message_id
                dispatch(message)
            except ProtocolError as exc:
                self.refuse(device, kind, ErrorCode.MALFORMED, str(exc), message_id)
            except RejectedError as exc:
                self.refuse(device, kind, exc.code, exc.reason, message_id)
        self.flush()

    def refuse(
        self, device: str, kind: str, code: str, reason: str, in_reply_to: str | None
    ) -> None:
        """Keep the refusal; answer it with the runtime's signed `ErrorReply`."""
        self.rejections.append(Refusal(device, kind, code, reason))
        self._rejections.reject(device, kind, code, reason, in_reply_to)

    def close(self) -> None:
        """Close the store (its directory is the caller's)."""
        with self.lock:
            self.store.close()
