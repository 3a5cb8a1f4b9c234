"""The coordinator's FLICKER method on the least runtime it needs, for in-process runs.

A simulation runs the production `FlickerMethod` (and so its
`FlickerSession`), as Flower's simulation runs the production apps: the host
builds it with a `MethodContext` made of the runtime's own parts
(`ursa.lab.simulate.host_parts`: a `CoordinatorStore` in the given
directory, the `SigningPoint` with a coordinator identity of its own, an
`Outbox`; and the `Router` FLICKER registers its kinds on) and answers
refusals through the runtime's `Rejections` (a signed `ErrorReply` to the
sender). What the host leaves out is admission: the in-memory bus of a
simulation is trusted (topic, sender, enrolment, limits and seen ids are
`CoordinatorService`'s, tested there). It keeps the refusals it answered in
`rejections`, for the tests and the bench.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
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
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.lab.simulate.host_parts import HostParts, Refusal
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import COORDINATOR, BaseMessage, ChunkRequest, ErrorCode
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.transport import Transport

__all__ = ["FlickerHost", "Refusal"]

logger = logging.getLogger("ursa.lab.simulate.flicker")


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
        self._clock = clock
        self._parts = parts = HostParts(
            federation,
            transport,
            state_dir=state_dir,
            clock=clock,
            logger=logger,
            identity=identity,
        )
        self._lock = parts.lock  # the transport's thread and the ticks
        self.identity = parts.identity
        self.rejections: list[Refusal] = parts.rejections
        store, outgoing = parts.store, parts.outgoing
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
        self._parts.attach(self.handle)

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
        self._parts.flush()
        return run_id

    def tick(self) -> None:
        """Act on passed deadlines, as the service's BALANCING stage does."""
        with self._lock:
            self.method.step(self._clock(), frozenset(self.devices))
        self._parts.flush()

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: decode, route to the method, answer a refusal."""
        self._parts.receive(topic, payload, self._route)

    def _route(self, message: BaseMessage) -> None:
        if isinstance(message, ChunkRequest):
            if not self.method.answers(message):
                raise RejectedError(ErrorCode.MALFORMED, "not the CKKS context")
        elif self._router.dispatch(message) is not Dispatch.HANDLED:
            kind = message_kind(message)
            raise RejectedError(ErrorCode.UNAUTHORISED, f"{kind} is not FLICKER's")

    def close(self) -> None:
        """Close the store (its directory is the caller's)."""
        self._parts.close()
