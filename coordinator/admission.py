"""Admission: what a message must pass before any stage handler sees it.

In order: the topic parses and belongs to this federation; the sender's
rate and size limits (before any decode or crypto work); msgpack + pydantic
decode; federation; ``sender`` equals the topic's device (Mosquitto's ACL
stops a device publishing under another's topic); then, off the status
topic, this run and enrolled (except Hello). A failure is logged with its
reason and, where the sender can act, answered with an `ErrorReply`.
Messages that come before the service has restored its stage are held
(`StartupHold`), charged to their sender's limits as they come.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.refusal_log import RefusalLog
from ursa.coordinator.startup_hold import StartupHold
from ursa.coordinator.telemetry import Telemetry
from ursa.protocol.admission_limits import (
    AdmissionLimiter,
    AdmissionStats,
    DropReason,
)
from ursa.protocol.envelope import decode, message_kind
from ursa.protocol.errors import DecodeError, OversizeError, TopicError, VersionError
from ursa.protocol.messages import BaseMessage, ErrorCode
from ursa.protocol.topics import parse_topic

__all__ = ["Admission", "Admitted", "Reject"]

logger = logging.getLogger("ursa.coordinator")


Reject = Callable[[str | None, str, str, str, str | None, bool], None]
"""The service's one refusal path, ``(device, what, code, reason, in_reply_to,
counted)``: log and keep it, answer the sender (``counted``: the telemetry
counted it already)."""


@dataclass(frozen=True)
class Admitted:
    """A message that passed admission, with where it came from."""

    device: str
    message: BaseMessage
    kind: str
    on_status_topic: bool
    """On the device's status topic: run and enrolment are not checked."""


class Admission:
    """Judges every incoming message up to its stage handler (module docstring).

    Args:
        config: The service configuration (federation, size and rate limits).
        telemetry: Counts what is received and dropped.
        refusals: Writes topic refusals within the log limits.
        reject: The service's refusal path (it answers the device).
        run: This run's id (known once the store is open).
        is_enrolled: Whether a device is enrolled.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        telemetry: Telemetry,
        refusals: RefusalLog,
        reject: Reject,
        run: Callable[[], str],
        is_enrolled: Callable[[str], bool],
    ) -> None:
        self._config = config
        self._telemetry = telemetry
        self._refusals = refusals
        self._reject = reject
        self._run = run
        self._is_enrolled = is_enrolled
        self._limiter = AdmissionLimiter(
            config.admission, max_message_bytes=config.max_message_bytes
        )
        self._held = StartupHold()
        self._run_drops: dict[str, int] = {}

    @property
    def held_dropped(self) -> int:
        """Messages dropped because too many arrived before the stage was restored."""
        return self._held.dropped

    def stats(self) -> AdmissionStats:
        """Messages admitted and dropped by the per-device limits, so far."""
        return self._limiter.stats()

    def run_drops(self) -> dict[str, int]:
        """Messages dropped per device because they belong to another run."""
        return dict(self._run_drops)

    def judge(
        self, topic: str, payload: bytes, now: float, *, charged: bool = False
    ) -> Admitted | None:
        """The admitted message, or None (refused, logged and answered as due).

        ``charged``: the message's admission token is already taken (held).
        """
        cfg = self._config
        try:
            parsed = parse_topic(topic)
        except TopicError as exc:
            line = "rejected message on an invalid topic: %s"
            self._refusals.write(
                now, None, logging.WARNING, line, str(exc), kind="invalid_topic"
            )
            return None
        device = parsed.device
        if parsed.federation != cfg.federation or device is None:
            line = "rejected message on foreign topic %s"
            self._refusals.write(
                now, None, logging.WARNING, line, topic, kind="foreign_topic"
            )
            return None
        if parsed.direction == "down" or not payload:
            return None  # our own publishes, if a broker echoes them; a cleared retain
        if not charged and not self._within_limits(device, payload, now):
            return None
        message = self._decoded(device, payload)
        if message is None:
            return None
        kind = message_kind(message)
        self._telemetry.received(device, kind)
        reason = None
        if message.federation != cfg.federation:
            reason = "wrong federation"
        elif message.sender != device:
            reason = f"sender {message.sender!r} does not match the topic's device"
        if reason is not None:
            self._refuse(
                device, kind, ErrorCode.UNAUTHORISED, reason, message.message_id
            )
            return None
        if parsed.direction is None:
            return Admitted(device, message, kind, on_status_topic=True)
        if kind != "hello" and message.run != self._run():
            self._wrong_run(device, kind, message)
            return None
        if kind != "hello" and not self._is_enrolled(device):
            reason = "device is not enrolled (send hello)"
            self._refuse(
                device, kind, ErrorCode.UNKNOWN_DEVICE, reason, message.message_id
            )
            return None
        return Admitted(device, message, kind, on_status_topic=False)

    def _decoded(self, device: str, payload: bytes) -> BaseMessage | None:
        """The decoded message, or None (refused with the decode's reason)."""
        try:
            return decode(payload, max_size=self._config.max_message_bytes)
        except OversizeError as exc:
            self._refuse(device, "message", ErrorCode.OVERSIZE, str(exc), None)
        except VersionError as exc:
            self._refuse(
                device, "message", ErrorCode.UNSUPPORTED_VERSION, str(exc), None
            )
        except DecodeError as exc:
            self._refuse(
                device, "message", ErrorCode.MALFORMED, exc.reason, exc.message_id
            )
        return None

    def _wrong_run(self, device: str, kind: str, message: BaseMessage) -> None:
        """A message of another run: counted, answered `wrong_run`, not marked seen.

        The device is on an older run (this coordinator was reset) or on none;
        the answer makes it say Hello, and the signed `EnrolResult` takes it
        into this run.
        """
        self._run_drops[device] = self._run_drops.get(device, 0) + 1
        theirs = message.run or "(none)"
        reason = f"run {theirs} is not this coordinator's run {self._run()}"
        self._refuse(device, kind, ErrorCode.WRONG_RUN, reason, message.message_id)

    def _refuse(
        self, device: str, what: str, code: str, reason: str, reply_to: str | None
    ) -> None:
        """Refuse a message the telemetry has not counted yet."""
        self._reject(device, what, code, reason, reply_to, False)

    def _within_limits(self, device: str, payload: bytes, now: float) -> bool:
        """The per-device rate and size limits, before any decode or crypto work.

        A drop is logged (an oversize one also answered) once per device per
        `LOG_INTERVAL_S`, with the count since the last line; the rest are
        only counted, so a flood floods neither the log nor the device.
        """
        verdict = self._limiter.admit(device, len(payload), now)
        if verdict.reason is not None:
            self._telemetry.rejected(verdict.reason.value)
        if verdict.is_admitted or not verdict.should_log:
            return verdict.is_admitted
        count = verdict.dropped_since_log
        if verdict.reason is DropReason.OVERSIZE:
            limit = self._limiter.max_message_bytes
            size = len(payload)
            reason = f"message of {size} bytes exceeds the limit of {limit} bytes"
            self._reject(
                device, "message", ErrorCode.OVERSIZE, reason, None, True
            )  # counted
        if verdict.reason is DropReason.RATE or count > 1:
            limits = self._config.admission
            logger.warning(
                "dropping messages from %s over the admission limits (%g/s, burst "
                "%d, %d bytes): %d dropped since the last report",
                device,
                limits.messages_per_s,
                limits.burst,
                self._limiter.max_message_bytes,
                count,
            )
        return False

    def report_unlogged(self) -> None:
        """The drops since each sender's last line, in one last line (at stop)."""
        for device, count in self._limiter.unlogged().items():
            logger.warning(
                "dropping messages from %s over the admission limits (at stop): "
                "%d dropped since the last report",
                device,
                count,
            )

    def hold(self, topic: str, payload: bytes, now: float) -> None:
        """Keep a message until the stage is restored, within `StartupHold`'s caps.

        The message takes its token from the sender's admission bucket now
        (and is not charged again when replayed), so a device's backlog is
        held only as far as its rate allows, and within its share of bytes.
        """
        sender = _sender_of(topic)
        reason = None
        if sender:
            reason = self._limiter.admit(sender, len(payload), now).reason
        if reason is None and self._held.offer(sender, topic, payload):
            return
        if reason is not None:  # a rate or size drop: the hold never saw it
            self._held.drop(len(payload))
            self._telemetry.rejected(reason.value)
        held = self._held
        if held.dropped == 1 or held.dropped % 1000 == 0:
            logger.warning(
                "%d messages (%d bytes) dropped while starting up: over the "
                "hold's caps (%d messages, %d bytes, %d bytes per device) or a "
                "device's admission rate; last on %r",
                held.dropped,
                held.dropped_bytes,
                held.max_messages,
                held.max_bytes,
                held.max_sender_bytes,
                topic,
            )

    def take_held(self) -> list[tuple[str, bytes]]:
        """The held messages, oldest first (each already charged), emptying the hold."""
        return self._held.take()


def _sender_of(topic: str) -> str:
    """The device a topic belongs to, or ``""`` (global, bridge, invalid)."""
    try:
        return parse_topic(topic).device or ""
    except TopicError:
        return ""
