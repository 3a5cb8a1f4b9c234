"""`Enrolment`: how a device says Hello, pins its coordinator and joins its run.

The device sends `Hello` with its identity public keys (and operator
certificate) and pins the coordinator identity from the signed `EnrolResult`
(checked against its operator certificate under ``[trust]``, and against the
configured fingerprint if set); that acceptance names the run it joins
(`RunMembership`). A Hello left unanswered is sent again with backoff; a
coordinator that answers `unknown_device` or `wrong_run` gets a new one.

A refused enrolment (a pinned coordinator that does not list this device
yet) names this device's fingerprint and the ``ursa coordinator enrol``
command that admits it, and the device says Hello again with a jittered
backoff (5 s doubling to 5 min), so an operator's ``enrol`` takes effect
without a restart.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from ursa.crypto.certificate import Role
from ursa.crypto.identity import DevicePublicIdentity
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.membership import RunMembership
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    COORDINATOR,
    EnrolResult,
    ErrorCode,
    ErrorReply,
    Hello,
    IdentityKeys,
)
from ursa.protocol.messages.base import TIMING_CODES
from ursa.protocol.operator_commands import enrol_command
from ursa.protocol.untrusted_text import escape

__all__ = [
    "HELLO_RETRY_MAX_S",
    "HELLO_RETRY_S",
    "REFUSED_RETRY_MAX_S",
    "REFUSED_RETRY_S",
    "Enrolment",
]

logger = logging.getLogger("ursa.edge_sdk")

HELLO_RETRY_S = 10.0
"""A Hello unanswered this long is sent again (then 2x, 4x, ... the wait)."""
HELLO_RETRY_MAX_S = 300.0
"""The longest wait between two Hellos."""
REFUSED_RETRY_S = 5.0
"""After a refused enrolment, the first wait before the next Hello (then 2x, ...)."""
REFUSED_RETRY_MAX_S = 300.0
"""The longest wait between two Hellos of a refused device."""


def _coordinator_keys(message: EnrolResult) -> IdentityKeys:
    """The coordinator keys an acceptance carries."""
    if message.coordinator_keys is None:
        raise ValueError("enrolment accepted without the coordinator's keys")
    return message.coordinator_keys


class Enrolment:
    """This device's Hello, its pin of the coordinator, and the run it joins.

    Args:
        link: The device on the wire (its identity, the pin it keeps).
        membership: The run joined (a signed acceptance names it).
        forget_run: Drops the old run's state when a new run is joined.
        jitter: The factor in [0.5, 1] on each wait after a refusal (random:
            a fleet refused together does not come back together).
    """

    def __init__(
        self,
        *,
        link: DeviceLink,
        membership: RunMembership,
        forget_run: Callable[[], None],
        jitter: Callable[[], float] | None = None,
    ) -> None:
        self._link = link
        self._membership = membership
        self._forget_run = forget_run
        self.enrolled = threading.Event()
        """Set once a signed acceptance pinned the coordinator (cleared on a reset)."""
        self._refused_coordinators: set[str] = set()
        """Fingerprints of coordinators this device refused (and said so, once)."""
        self._unanswered = False
        self._retry_at: float | None = None
        self._backoff_s: float | None = None
        self._refusals = 0
        """Enrolments refused in a row (0: none since the last acceptance)."""
        self._refusal_reasons: set[str] = set()
        self._jitter = jitter or (lambda: random.uniform(0.5, 1.0))

    def say_hello(self) -> None:
        """Send `Hello` (again until an `EnrolResult` answers it)."""
        self._unanswered = True
        link = self._link
        public = link.identity.public()
        link.send(
            Hello(
                federation=link.federation,
                round=0,
                sender=link.device_id,
                device_id=link.device_id,
                x25519_public=public.x25519_public,
                ed25519_public=public.ed25519_public,
                certificate=link.certificate,
            )
        )

    def retry_hello(self, now: float) -> None:
        """Say hello again, with backoff, while no EnrolResult answered the last.

        A coordinator killed after it enrolled us but before its reply left
        has our Hello marked seen and counts us as enrolled; without a new
        Hello we would wait for its answer forever, and it would wait for us
        in every key epoch (issue 14). A coordinator that enrolled us already
        simply answers again.
        """
        if self._refusals:
            self._retry_refused(now)
            return
        if not self._unanswered:
            self._retry_at = self._backoff_s = None
            return
        if self._retry_at is None:
            self._retry_at = now + (self._backoff_s or HELLO_RETRY_S)
            return
        if now < self._retry_at:
            return
        backoff = min(2 * (self._backoff_s or HELLO_RETRY_S), HELLO_RETRY_MAX_S)
        self._backoff_s, self._retry_at = backoff, None
        logger.warning(
            "%s: no answer to hello from the coordinator; saying hello again",
            self._link.device_id,
        )
        self.say_hello()

    def _retry_refused(self, now: float) -> None:
        """After a refusal: Hello again in 5 s, 10 s, ... 5 min (jittered)."""
        if self._retry_at is None:
            wait = REFUSED_RETRY_S * 2 ** min(self._refusals - 1, 16)
            self._retry_at = now + min(wait, REFUSED_RETRY_MAX_S) * self._jitter()
            return
        if now < self._retry_at:
            return
        self._retry_at = None
        logger.info(
            "%s: asking the coordinator to enrol it again", self._link.device_id
        )
        self.say_hello()

    def on_enrol_result(self, message: EnrolResult) -> None:
        """A signed acceptance pins the coordinator and joins its run."""
        link = self._link
        if message.device_id != link.device_id:
            return
        self._unanswered = False
        self._retry_at = self._backoff_s = None
        if not message.accepted:
            self._refused(escape(message.reason))
            return
        identity = link.trusted(_coordinator_keys(message), Role.COORDINATOR)
        pin = link.config.coordinator_fingerprint
        if identity.device_id != COORDINATOR:
            raise ValueError("coordinator identity has the wrong id")
        if pin is not None and identity.fingerprint() != pin:
            self._refuse_coordinator(message, identity, pin, "configured pin")
            return
        known = link.coordinator
        if known is not None and known != identity:
            self._refuse_coordinator(message, identity, known.fingerprint(), "pinned")
            return
        link.verify(identity, message)  # the anchor of the run: signed by the pin
        if known is None:
            link.pin(identity)
        self._membership.enter(message.run, link.store, self._forget_run)
        self._refusals = 0
        self._refusal_reasons.clear()
        self.enrolled.set()
        logger.info("%s: enrolled (run %s)", link.device_id, message.run)

    def _refused(self, reason: str) -> None:
        """The coordinator refused this device: say how to admit it, ask again later.

        One ERROR per distinct reason (with the fingerprint and the command
        that admits the device); each further refusal is an INFO line.
        """
        self._refusals += 1
        device = self._link.device_id
        if reason in self._refusal_reasons:
            logger.info(
                "%s: enrolment still refused (%s); asking again later", device, reason
            )
            return
        self._refusal_reasons.add(reason)
        fingerprint = self._link.identity.public().fingerprint()
        logger.error(
            "%s: enrolment refused: %s. This device's fingerprint is %s; to admit "
            "it, run on the coordinator's host: %s (it says hello again, with "
            "backoff, until admitted)",
            device,
            reason,
            fingerprint,
            enrol_command(device, fingerprint),
        )

    def _refuse_coordinator(
        self,
        message: EnrolResult,
        identity: DevicePublicIdentity,
        pinned: str,
        where: str,
    ) -> None:
        """Refuse a coordinator with another identity, loudly, on both sides.

        A replaced coordinator (a new state dir, a lost identity key) must not
        be trusted silently, and must not be left guessing either: the device
        logs one ERROR with the remedy and tells the coordinator why.
        """
        fingerprint = identity.fingerprint()
        reason = f"coordinator identity {fingerprint} is not the {where} {pinned}"
        if fingerprint not in self._refused_coordinators:  # one ERROR, every reply
            self._refused_coordinators.add(fingerprint)
            logger.error(
                "%s: refusing the coordinator: %s. If it was replaced on purpose, "
                "run `ursa device repin --config <device config>` (and update "
                "coordinator_fingerprint if set); else restore the coordinator's "
                "identity.key from its backup",
                self._link.device_id,
                reason,
            )
        self._link.tell_coordinator(
            ErrorCode.COORDINATOR_IDENTITY_MISMATCH,
            reason,
            round_index=message.round,
            message_id=derived_id(self._link.device_id, "identity", message.message_id),
            in_reply_to=message.message_id,
            run=message.run,
            named=message,  # signed, with its digest: it can start a key epoch
        )

    def on_error(self, message: ErrorReply) -> None:
        """The coordinator refused something: an unknown device says Hello again.

        A refusal of when a message came (`TIMING_CODES`: a late reply, a run
        gone by) or of a device not enrolled yet (the Hello below mends it) is
        an expected race: INFO. Any other is a WARNING.
        """
        expected = (
            message.code in TIMING_CODES or message.code == ErrorCode.UNKNOWN_DEVICE
        )
        logger.log(
            logging.INFO if expected else logging.WARNING,
            "%s: coordinator refused a message: %s: %s",
            self._link.device_id,
            message.code,
            escape(message.reason),
        )
        if message.code in (ErrorCode.UNKNOWN_DEVICE, ErrorCode.WRONG_RUN):
            # our hello preceded the coordinator, or it was reset (a new run):
            # a hello gets the signed EnrolResult that names its run
            self.enrolled.clear()
            self.say_hello()
