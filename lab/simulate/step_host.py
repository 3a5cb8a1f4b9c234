"""A coordinator's before-training step on the least runtime it needs, in-process.

A simulation runs a production `BeforeTraining` step (CLIMB's `ClimbDualStep`)
as the coordinator runs it, only without a service: the host builds the
step's `StepContext` from the runtime's own parts
(`ursa.lab.simulate.host_parts`: a `CoordinatorStore` in the given directory
for its phase records, the `SigningPoint` with a coordinator identity of its
own, an `Outbox`; and the `Router` the step registers its kinds on, the
given clock) and a view of one fixed key epoch (its epoch
number, Paillier public key and registered devices; every device online).
Refusals are answered through the runtime's `Rejections` (a signed
`ErrorReply` to the sender) and kept in `rejections`. Like
`ursa.lab.simulate.flicker_host`, it leaves admission out: the in-memory bus
of a simulation is trusted (topic, sender, enrolment, limits and seen ids are
`CoordinatorService`'s, tested there).

The step is driven only through the `BeforeTraining` contract (`open`,
`on_tick`, `is_done`, `close`), as the training plugin drives it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set
from pathlib import Path
from typing import TypeVar

from ursa.coordinator.before_training import (
    BeforeTraining,
    RoundInfo,
    StepBuilder,
    StepContext,
)
from ursa.coordinator.clock import Clock
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.store import CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity
from ursa.lab.simulate.host_parts import HostParts, Refusal
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import COORDINATOR, BaseMessage, ErrorCode
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.transport import Transport

__all__ = ["StepHost"]

logger = logging.getLogger("ursa.lab.simulate.steps")

SignedT = TypeVar("SignedT", bound=BaseMessage)


class _EpochOnly:
    """The `CoordinatorView` of a host: one key epoch, everyone online."""

    def __init__(
        self,
        epoch: EpochView,
        store: CoordinatorStore,
        outgoing: SigningPoint,
        identities: Mapping[str, DevicePublicIdentity],
    ) -> None:
        self._epoch = epoch
        self._store = store
        self._outgoing = outgoing
        self._identities = identities

    def epoch_view(self) -> EpochView | None:
        return self._epoch

    def online_devices(self) -> Set[str]:
        return self._epoch.registered

    @property
    def store(self) -> CoordinatorStore:
        return self._store

    def sign(self, message: SignedT) -> SignedT:
        return self._outgoing.sign(message)

    def device_identity(self, device: str) -> DevicePublicIdentity | None:
        return self._identities.get(device)

    def device_certificate(self, device: str) -> bytes:
        return b""  # a simulation has no operator


class StepHost:
    """Hosts one `BeforeTraining` step on a transport (module docstring).

    Args:
        federation: The federation id (topics, messages).
        step: How to build the step once its context exists (`later`).
        epoch: The key epoch the step runs in (public key, registered devices).
        devices: The enrolled devices' public identities.
        transport: Where messages go; `attach` makes it deliver to `handle`.
        state_dir: Where the store lives (the caller removes it).
        clock: Seconds, for the step's deadlines (a fake one in simulations).
    """

    def __init__(
        self,
        federation: str,
        step: StepBuilder,
        *,
        epoch: EpochView,
        devices: Mapping[str, DevicePublicIdentity],
        transport: Transport,
        state_dir: Path,
        clock: Clock,
    ) -> None:
        self.federation = federation
        self._clock = clock
        self._parts = parts = HostParts(
            federation, transport, state_dir=state_dir, clock=clock, logger=logger
        )
        self._lock = parts.lock  # the transport's thread and the driver's
        self.identity = parts.identity
        self.rejections: list[Refusal] = parts.rejections
        outgoing = parts.outgoing
        view = _EpochOnly(epoch, parts.store, outgoing, devices)
        self.step: BeforeTraining = step.build(
            StepContext(
                federation=federation, view=view, send=outgoing.send, clock=clock
            )
        )
        self._router = Router(COORDINATOR)
        self.step.register(self._router)

    def sign(self, message: SignedT) -> SignedT:
        """``message`` stamped with the run and signed by the host's identity."""
        return self._parts.outgoing.sign(message)

    # --- driving it -----------------------------------------------------------

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to device topics."""
        self._parts.attach(self.handle)

    def open(self, info: RoundInfo) -> bool:
        """Open the step for ``info`` and send what it asks.

        With a synchronous bus every device has answered by the time this
        returns; otherwise the caller moves the clock and `tick`s.

        Returns:
            Whether the step runs in this round (it is due and has a key).
        """
        with self._lock:
            phase = self.step.open(info, self._clock())
        self._parts.flush()
        return phase is not None

    def is_done(self, round_index: int) -> bool:
        """Whether the round's phase is closed (or never opened)."""
        with self._lock:
            return self.step.is_done(round_index)

    def close_round(self, round_index: int) -> None:
        """The round is over: the step forgets its phase."""
        with self._lock:
            self.step.close(round_index)

    def tick(self, round_index: int) -> None:
        """Act on passed deadlines, as the training stage's tick does."""
        with self._lock:
            self.step.on_tick(round_index, self._clock())
        self._parts.flush()

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: decode, route to the step, answer a refusal."""
        self._parts.receive(topic, payload, self._route)

    def close(self) -> None:
        """Close the store (its directory is the caller's)."""
        self._parts.close()

    def _route(self, message: BaseMessage) -> None:
        if self._router.dispatch(message) is not Dispatch.HANDLED:
            kind = message_kind(message)
            raise RejectedError(ErrorCode.UNAUTHORISED, f"{kind} is not the step's")
