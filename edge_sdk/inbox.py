"""The device's inbox: every message heard, from the wire to its handler.

`DeviceAdmission` judges what arrives (limits, decoding, federation, sender,
run); a message of the joined run then has its coordinator signature checked
and goes to the router table. Messages arrive in any order across topics: one
that needs something not known yet (the coordinator identity, the agent's
identity, the key, the registry) waits in the router's per-kind slot and is
retried after every message consumed. What the joined run sent before the
device joined it comes back from the `RunMembership`, in order. A handler's
refusal is a log line (an untrusted identity also a reply), never fatal.
The runtime's own kind is the inbox's too: an `ErrorReply` (the coordinator
refused something) goes to the enrolment (an unknown device says Hello), the
app's ``on_error`` and every method.
"""

from __future__ import annotations

import logging
import threading

from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.edge_sdk.admission import DeviceAdmission
from ursa.edge_sdk.callbacks import DeviceCallbacks, DeviceError, notify
from ursa.edge_sdk.device_link import DeviceLink
from ursa.edge_sdk.device_methods import DeviceMethods
from ursa.edge_sdk.enrolment import Enrolment
from ursa.edge_sdk.membership import RunMembership
from ursa.edge_sdk.registration import RegistrationError
from ursa.protocol.envelope import message_kind
from ursa.protocol.messages import BaseMessage, ErrorReply
from ursa.protocol.router import Dispatch, RejectedError, Router
from ursa.protocol.untrusted_text import escape

__all__ = ["REFUSALS", "DeviceInbox"]

logger = logging.getLogger("ursa.edge_sdk")

REFUSALS = (CryptoError, RegistrationError, RejectedError, ValueError)
"""What a handler raises for a message it refuses: logged, never fatal."""


class DeviceInbox:
    """From the transport's bytes to the handler that owns the kind.

    Args:
        link: The device (its log name, its reply to an untrusted identity).
        admission: The checks before any handler.
        membership: The joined run (it hands back what that run sent early).
        lock: The client's lock, held while a message is handled.
        enrolment: Hears the coordinator's error replies first.
        methods: Hear them next.
        callbacks: The app's ``on_error`` hears them too.
    """

    def __init__(
        self,
        *,
        link: DeviceLink,
        admission: DeviceAdmission,
        membership: RunMembership,
        lock: threading.RLock,
        enrolment: Enrolment,
        methods: DeviceMethods,
        callbacks: DeviceCallbacks | None,
    ) -> None:
        self._link = link
        self._admission = admission
        self._membership = membership
        self._lock = lock
        self._enrolment = enrolment
        self._methods = methods
        self._callbacks = callbacks
        self.router = Router(link.device_id)
        """Every kind the device handles, registered by the part that owns it."""
        self.router.register(ErrorReply, self._on_error_reply, owner="inbox")

    def receive(self, topic: str, payload: bytes) -> None:
        """Admit, dispatch, then what the run sent before the device joined it.

        A handler's bug is logged with its traceback: nothing a message does
        stops the device.
        """
        try:
            with self._lock:
                message = self._admission.accept(topic, payload)
                if message is None:
                    return
                self._process(message)
                while (joined := self._membership.next_joined()) is not None:
                    self._process(joined)
        except Exception:
            logger.exception("%s: internal error on %s", self._link.device_id, topic)

    def _process(self, message: BaseMessage) -> None:
        """Dispatch; once a message is consumed, retry the ones that waited."""
        if not self._admission.authentic(message):
            return
        router = self.router
        try:
            outcome = router.dispatch(message)
        except REFUSALS as exc:
            self._refused(message, exc)
            return
        if outcome is Dispatch.UNHANDLED:
            logger.debug(
                "%s: no handler for %s", self._link.device_id, message_kind(message)
            )
        elif outcome is Dispatch.HANDLED:
            router.retry_parked(self._refused)

    def _refused(self, message: BaseMessage, exc: Exception) -> None:
        if not isinstance(exc, REFUSALS):
            raise exc
        if isinstance(exc, UntrustedIdentityError):
            self._link.refuse_untrusted(message, exc)
            return
        kind, why = message_kind(message), escape(str(exc))
        logger.warning("%s: refused %s: %s", self._link.device_id, kind, why)

    def _on_error_reply(self, message: ErrorReply) -> None:
        self._enrolment.on_error(message)
        reason = escape(message.reason)
        event = DeviceError(message.round, message.code, reason, "coordinator")
        notify(self._callbacks, "on_error", event, device=self._link.device_id)
        self._methods.on_error_reply(message)
