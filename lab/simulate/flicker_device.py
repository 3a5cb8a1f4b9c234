"""One device of an in-process FLICKER run: the device protocol on its own transport.

In a federation, FLICKER's device half is the `Flicker` method inside an
`EdgeClient`, which admits and routes its messages. The simulation
(`ursa.lab.simulate.flicker_fleet`, ``ursa bench flicker``) runs the
coordinator's production `FlickerMethod` with bare devices instead: a
`FleetDevice` is the same `FlickerParticipant` behind the least host it
needs. It subscribes to the device's topics, admits what arrives (federation;
ring hops, redundancy asks and results only on the device's own down topic;
a ring hop from a known peer, everything else from the coordinator), routes
through a `Router` (work waiting for the CKKS context is parked there) and
publishes replies in order. Like an `EdgeClient` it keeps no seen message
ids: the participant's handlers are idempotent (cached replies per step).
Given the coordinator's public identity, it checks the coordinator's
signature on a `RingStart` and takes the ring members' keys from it, as a
device does; without one, the peers' keys are known beforehand and a signed
member list is refused. Anything refused is logged and kept in `rejections`;
nothing received raises.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import CkksPublicContext
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import (
    DeviceIdentity,
    DevicePublicIdentity,
    verify_signature,
)
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker.context import DEFAULT_MAX_CONTEXT_BYTES
from ursa.edge_sdk.methods.flicker.errors import RefusedError
from ursa.edge_sdk.methods.flicker.participant import FlickerParticipant
from ursa.lab.simulate.bare_device_link import BareDeviceLink
from ursa.protocol.envelope import decode, message_kind, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    Chunk,
    IdentityKeys,
    RedundancyAsk,
    RedundancyResult,
    RingHop,
    TransferManifest,
)
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.transport import Transport

__all__ = ["FleetDevice"]

logger = logging.getLogger("ursa.lab.simulate.flicker")

_OWN_TOPIC_ONLY = (RingHop, RedundancyAsk, RedundancyResult)


class FleetDevice:
    """A `FlickerParticipant` with its own transport, for in-process runs.

    Args:
        identity: This device's identity (seals and opens boxes).
        federation: The federation id.
        peers: Every device's public identity (the coordinator's enrolment).
        counts: This device's class counts.
        transport: Its connection; `attach` subscribes and takes its messages.
        coordinator: The coordinator's public identity (checks its signed
            member lists); None: none is accepted.
        resampler, rng, max_steps, max_context_bytes, global_test: as
            `FlickerParticipant`.
    """

    def __init__(
        self,
        *,
        identity: DeviceIdentity,
        federation: str,
        peers: Mapping[str, DevicePublicIdentity],
        counts: npt.ArrayLike,
        transport: Transport,
        coordinator: DevicePublicIdentity | None = None,
        resampler: dev.Resampler | None = None,
        rng: np.random.Generator | None = None,
        max_steps: int = dev.DEFAULT_MAX_STEPS,
        max_context_bytes: int = DEFAULT_MAX_CONTEXT_BYTES,
        global_test: bool = True,
    ) -> None:
        self.identity = identity
        self.rejections: list[tuple[str, str]] = []
        self._federation = federation
        self._coordinator = coordinator
        self._lock = threading.Lock()
        self._link = BareDeviceLink(federation, identity.device_id, transport)
        self.participant = FlickerParticipant(
            self,
            peers={d: p for d, p in peers.items() if d != identity.device_id},
            counts=counts,
            resampler=resampler,
            rng=rng,
            max_steps=max_steps,
            max_context_bytes=max_context_bytes,
            global_test=global_test,
            signed_members=coordinator is not None,
        )
        self._router = Router(identity.device_id)
        self.participant.register(self._router, owner="flicker")

    # --- the PeerChannel ----------------------------------------------------

    @property
    def device_id(self) -> str:
        """This device's id."""
        return self.identity.device_id

    @property
    def federation(self) -> str:
        """The federation's name."""
        return self._federation

    def send(self, message: BaseMessage) -> None:
        """Queue a message for the coordinator (published after the handler)."""
        self._link.send(message)

    def seal_for(
        self, peer: DevicePublicIdentity, context: bytes, plaintext: bytes
    ) -> bytes:
        """``plaintext`` sealed from this device to ``peer``."""
        return seal(self.identity, peer, context, plaintext)

    def open_from(
        self, peer: DevicePublicIdentity, context: bytes, box: bytes
    ) -> bytes:
        """A box ``peer`` sealed to this device."""
        return open_sealed(self.identity, peer, context, box)

    def peer_identity(self, keys: IdentityKeys) -> DevicePublicIdentity:
        """The keys as given: a simulation has no operator."""
        return keys.public_identity()

    def verify_coordinator(self, message: BaseMessage) -> None:
        """The coordinator's signature on ``message`` (refused without its key)."""
        coordinator = self._coordinator
        if coordinator is None:
            raise RefusedError("ring members, but no coordinator key to check them")
        signature: bytes = getattr(message, "signature", b"")
        try:
            verify_signature(coordinator, signing_bytes(message), signature)
        except CryptoError as exc:
            raise RefusedError(f"not signed by the coordinator: {exc}") from None

    # --- what the tests and the bench read --------------------------------------

    @property
    def counts(self) -> tuple[int, ...]:
        """The current class counts (after any resampling)."""
        return self.participant.counts

    @property
    def state(self) -> dev.DeviceState:
        """The device's FLICKER state (initial counts, added, removed, ...)."""
        return self.participant.state

    @property
    def steps(self) -> list[dev.StepReport]:
        """The resampling steps made."""
        return self.participant.steps

    @property
    def context(self) -> CkksPublicContext | None:
        """The coordinator's CKKS public context, once downloaded."""
        return self.participant.context

    @property
    def context_bytes(self) -> int:
        """Size of the downloaded public context (0 before)."""
        return self.participant.context_bytes

    # --- receiving ------------------------------------------------------------

    def attach(self) -> None:
        """Deliver the transport's messages to `handle`; subscribe to own topics."""
        self._link.attach(self.handle)

    def handle(self, topic: str, payload: bytes) -> None:
        """Transport handler: admit one raw message, route it, publish the replies."""
        own = self._link.addressed(topic)
        if own is None:
            return
        try:
            message = decode(payload)
        except ProtocolError as exc:
            self._note("?", f"undecodable message on {topic}: {exc}")
            return
        self.on_message(message, relayed=own)

    def on_message(self, message: BaseMessage, *, relayed: bool) -> None:
        """Admit and route one decoded message (``relayed``: on the own down topic)."""
        kind = message_kind(message)
        try:
            with self._lock:
                self._admit(message, relayed)
                self._route(message)  # the participant's handlers are idempotent
        except RejectedError as exc:
            self._note(kind, exc.reason)
        except Exception as exc:  # nothing received may crash the device
            logger.exception("FLICKER: %s failed on %s", kind, self.device_id)
            self._note(kind, f"internal error: {exc!r}")
        self._link.flush()

    def _admit(self, message: BaseMessage, relayed: bool) -> None:
        if message.federation != self._federation:
            raise RefusedError("another federation")
        if isinstance(message, _OWN_TOPIC_ONLY) and not relayed:
            kind = message_kind(message).replace("_", " ")
            raise RefusedError(f"{kind} not on this device's down topic")
        if not isinstance(message, RingHop) and message.sender != COORDINATOR:
            raise RefusedError(f"{message_kind(message)} not from the coordinator")

    def _route(self, message: BaseMessage) -> None:
        if isinstance(message, TransferManifest | Chunk):
            if not self.participant.claims(message):
                return  # a model's: not this run's
            if self.participant.on_transfer(message):
                self._router.retry_parked(self._refused)
            return
        if self._router.dispatch(message) is Dispatch.HANDLED:
            self._router.retry_parked(self._refused)

    def _refused(self, message: BaseMessage, exc: Exception) -> None:
        if not isinstance(exc, RejectedError):
            raise exc
        self._note(message_kind(message), exc.reason)

    def _note(self, kind: str, reason: str) -> None:
        logger.warning("FLICKER %s rejected %s: %s", self.device_id, kind, reason)
        self.rejections.append((kind, reason))
