"""`DeviceAdmission`: what a device takes from the broker, and what it drops.

Everything a device receives is the coordinator's (the broker's ACL), on the
global topics or its own. Before any handler sees a message it is held to
the admission limits (rate and size per topic scope, before any decode),
decoded strictly, checked for federation, sender, relay and run, and, for
every kind the coordinator signs, checked against the pinned coordinator's
signature. A drop is a log line, never an exception.
"""

from __future__ import annotations

import logging
import time

from ursa.crypto.errors import CryptoError
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.membership import RunMembership
from ursa.protocol.admission_limits import AdmissionLimiter, AdmissionStats
from ursa.protocol.envelope import decode, message_kind, signed_by_coordinator
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import (
    COORDINATOR,
    BaseMessage,
    EnrolResult,
    ErrorCode,
    ErrorReply,
    RelayedFrom,
    Status,
)
from ursa.protocol.topics import parse_topic
from ursa.protocol.untrusted_text import escape

__all__ = ["DeviceAdmission"]

logger = logging.getLogger("ursa.edge_sdk")

_ANY_RUN = (EnrolResult, ErrorReply)
"""Kinds a device takes from any run: a signed acceptance is how it joins a
run, and an error (`unknown_device`, `wrong_run`) only makes it say Hello."""


class DeviceAdmission:
    """The device's checks of what arrives (see the module docstring).

    Args:
        link: The device (its config, its pinned coordinator).
        membership: The run joined (a foreign run's messages go to it).
    """

    def __init__(self, link: DeviceLink, membership: RunMembership) -> None:
        config = link.config
        self._link = link
        self._membership = membership
        self._limiter = AdmissionLimiter(
            config.admission, max_message_bytes=config.max_message_bytes
        )

    def stats(self) -> AdmissionStats:
        """Incoming messages admitted and dropped by the limits, so far."""
        return self._limiter.stats()

    def accept(self, topic: str, payload: bytes) -> BaseMessage | None:
        """The message on ``topic`` if it is the device's to take (else None, logged).

        Within the limits, well-formed, of this federation, on a global topic
        or the device's own, from the coordinator (or relayed as its kind
        allows), and of the joined run (another run's goes to the membership).
        """
        cfg = self._link.config
        if not payload:  # a retained message cleared (a new run), not a message
            return None
        try:
            parsed = parse_topic(topic)
            if not self._within_limits(parsed.device or "global", payload):
                return None
            message = decode(payload, max_size=cfg.max_message_bytes)
        except ProtocolError as exc:
            why = escape(f"{topic}: {exc}")
            logger.warning("%s: dropped message on %s", self._link.device_id, why)
            return None
        own = parsed.device == cfg.device_id and parsed.direction == "down"
        if parsed.federation != cfg.federation or not (own or parsed.scope == "global"):
            return None
        if message.federation != cfg.federation:
            logger.warning(
                "%s: dropped message of another federation", self._link.device_id
            )
            return None
        kind = message_kind(message)
        if isinstance(message, Status):
            return None
        relay = type(message).relay
        relayed = relay is RelayedFrom.AGENT or (own and relay is RelayedFrom.PEER)
        if message.sender != COORDINATOR and not relayed:
            logger.warning(
                "%s: dropped %s claiming sender %s",
                self._link.device_id,
                kind,
                message.sender,
            )
            return None
        if message.run != self._membership.run and not isinstance(message, _ANY_RUN):
            self._membership.foreign(kind, message)
            return None
        return message

    def _within_limits(self, scope: str, payload: bytes) -> bool:
        """The rate and size limits per topic scope, before any decode.

        Everything a device receives is the coordinator's (the broker's ACL),
        on the global topics or its own; each scope has its own bucket. A
        drop is logged once per scope per `LOG_INTERVAL_S`, with a count.
        """
        verdict = self._limiter.admit(scope, len(payload), time.monotonic())
        if verdict.should_log and verdict.reason is not None:
            limits = self._link.config.admission
            logger.warning(
                "%s: dropping messages on %s topics over the admission limits "
                "(%g/s, burst %d, %d bytes; this one: %s): %d dropped since the "
                "last report",
                self._link.device_id,
                scope,
                limits.messages_per_s,
                limits.burst,
                self._limiter.max_message_bytes,
                verdict.reason.value,
                verdict.dropped_since_log,
            )
        return verdict.is_admitted

    def authentic(self, message: BaseMessage) -> bool:
        """Whether a coordinator message carries the pinned coordinator's signature.

        The one check of what the coordinator sends (every kind but a chunk:
        `envelope.signed_by_coordinator`), before any handler sees it. An
        `EnrolResult` is checked by its handler against the trust anchor (it
        is what pins the coordinator's key); an error before any key is
        pinned is taken unchecked, since all it can do is prompt a Hello.
        """
        if not signed_by_coordinator(message) or isinstance(message, EnrolResult):
            return True
        kind = message_kind(message)
        coordinator = self._link.coordinator
        if coordinator is None:
            if isinstance(message, ErrorReply):
                return True
            logger.info(  # a race: retained notices come before the EnrolResult
                "%s: dropped %s: no coordinator key is pinned yet",
                self._link.device_id,
                kind,
            )
            return False
        try:
            self._link.verify(coordinator, message)
        except CryptoError as exc:
            logger.warning(
                "%s: refused %s: %s: not signed by the pinned coordinator %s (%s)",
                self._link.device_id,
                kind,
                ErrorCode.BAD_SIGNATURE.value,
                coordinator.fingerprint()[:16],
                escape(str(exc)),
            )
            return False
        return True
