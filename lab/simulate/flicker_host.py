"""The coordinator's FLICKER method on the least runtime it needs, for in-process runs.

A simulation runs the production `FlickerMethod` (and so its
`FlickerSession`), as Flower's simulation runs the production apps: the host
builds it with a `MethodContext` made of the runtime's own parts (a
`CoordinatorStore` in the given directory, the `SigningPoint` with a
coordinator identity of its own, an `Outbox`, the `Router` FLICKER registers
its kinds on) and answers refusals through the runtime's `Rejections` (a
signed `ErrorReply` to the sender). What the host leaves out is admission:
the in-memory bus of a simulation is trusted (topic, sender, enrolment,
limits and seen ids are `CoordinatorService`'s, tested there). It keeps the
refusals it answered in `rejections`, for the tests and the bench.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ursa.coordinator.clock import Clock
from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.flicker.outcome import (
    FlickerOutcome,
    FlickerPhase,
    FlickerServiceConfig,
)
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.rejections import Rejections
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.telemetry import Telemetry
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.protocol.envelope import decode, message_kind
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import COORDINATOR, ChunkRequest, ErrorCode
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.topics import coordinator_subscriptions, parse_topic
from ursa.protocol.transport import Transport

__all__ = ["FlickerHost", "Refusal"]

logger = logging.getLogger("ursa.lab.simulate.flicker")


@dataclass(frozen=True)
class Refusal:
    """One message the method refused: who sent it, its kind, the code and why."""

    device: str | None
    kind: str
    code: str
    reason: str


class FlickerHost:
    """Hosts one `FlickerMethod` on a transport (module docstring).

    Args:
        federation: The federation id.
        build: Builds the coordinator's FLICKER method with the host's
            context (with a key owner or a state dir, as the method table
            builds it).
        devices: The enrolled devices' public identities.
        transport: Where messages go; `attach` makes it deliver to `handle`.
        state_dir: Where the store lives (the caller removes it).
        clock: Seconds, for the run's deadlines (a fake one in simulations).
        identity: The coordinator's signing identity (a fresh one by default).
    """

    def __init__(
        self,
        federation: str,
        build: Callable[[MethodContext], FlickerMethod],
        devices: Mapping[str, DevicePublicIdentity],
        transport: Transport,
        *,
        state_dir: Path,
        clock: Clock,
        identity: DeviceIdentity | None = None,
    ) -> None:
        self.devices = devices
        self.rejections: list[Refusal] = []
        self.identity = identity or DeviceIdentity.generate(COORDINATOR)
        self._transport = transport
        self._clock = clock
        self._lock = threading.Lock()  # the transport's thread and the ticks
        self._store = store = CoordinatorStore(state_dir / DB_FILENAME)
        self._outbox = outbox = Outbox("coordinator (lab)")
        telemetry = Telemetry()
        self._outgoing = outgoing = SigningPoint(federation, outbox, telemetry)
        outgoing.start(self.identity, store.run_id())
        self._rejections = Rejections(
            federation,
            telemetry=telemetry,
            refusals=RefusalLog(logger),
            outgoing=outgoing,
            clock=clock,
            round_index=lambda: 0,
        )
        self.method = method = build(
            MethodContext(
                federation=federation,
                stores=lambda: store,
                online=frozenset(devices),
                epoch=lambda: None,
                sender=outgoing.send,
                signer=outgoing.sign,
                announcer=lambda: None,
                identities=devices.get,
                certificates=lambda device: b"",
                clock=clock,
                raw_sender=outgoing.send_raw,
            )
        )
        method.restore()  # a run its state dir holds, if any
        self._router = Router(COORDINATOR)
        method.register(self._router)

    # --- what the simulation reads ------------------------------------------

    @property
    def config(self) -> FlickerServiceConfig:
        """The run's thresholds and deadlines."""
        return self.method.config

    @property
    def phase(self) -> FlickerPhase:
        """The run's phase."""
        return self.method.session.phase

    @property
    def key_owner(self) -> CkksKeyOwner:
        """The CKKS key pair the method decrypts with."""
        return self.method.session.key_owner

    @property
    def public_context_bytes(self) -> int:
        """Size of the public context every device downloads."""
        return self.method.session.public_context_bytes

    def outcome(self) -> FlickerOutcome:
        """The run so far."""
        return self.method.outcome()

    # --- driving it ---------------------------------------------------------

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to device topics."""
        self._transport.set_handler(self.handle)
        for pattern in coordinator_subscriptions(self.config.federation):
            self._transport.subscribe(pattern)

    def start(self, order: Sequence[str] | None = None) -> str:
        """Start a run over ``order`` (default: every device, shuffled); its id.

        Raises:
            FlickerError: a run is in progress, or a bad order.
        """
        with self._lock:
            if order is None:
                rng = self.method.session.rng
                order = fl.choose_ring_order(sorted(self.devices), rng)
            run_id = self.method.start(order, self._clock())
        self._outbox.flush(self._transport)
        return run_id

    def tick(self) -> None:
        """Act on passed deadlines, as the service's BALANCING stage does."""
        with self._lock:
            self.method.step(self._clock(), frozenset(self.devices))
        self._outbox.flush(self._transport)

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: decode, route to the method, answer a refusal."""
        try:
            where = parse_topic(topic)
        except ProtocolError:
            return  # not an ursa topic
        if where.federation != self.config.federation or where.direction != "up":
            return  # another federation's, or the coordinator's own messages
        if where.device is None:
            return
        with self._lock:
            self._route(where.device, payload)
        self._outbox.flush(self._transport)

    def _route(self, device: str, payload: bytes) -> None:
        kind, message_id = "?", None
        try:
            message = decode(payload)
            kind, message_id = message_kind(message), message.message_id
            if isinstance(message, ChunkRequest):
                if not self.method.answers(message):
                    raise RejectedError(ErrorCode.MALFORMED, "not the CKKS context")
            elif self._router.dispatch(message) is not Dispatch.HANDLED:
                raise RejectedError(ErrorCode.UNAUTHORISED, f"{kind} is not FLICKER's")
        except ProtocolError as exc:
            self._refuse(device, kind, ErrorCode.MALFORMED, str(exc), message_id)
        except RejectedError as exc:
            self._refuse(device, kind, exc.code, exc.reason, message_id)

    def close(self) -> None:
        """Close the store (its directory is the caller's)."""
        with self._lock:
            self._store.close()

    def _refuse(
        self, device: str, kind: str, code: str, reason: str, in_reply_to: str | None
    ) -> None:
        self.rejections.append(Refusal(device, kind, code, reason))
        self._rejections.reject(device, kind, code, reason, in_reply_to)
