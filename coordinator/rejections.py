"""The coordinator's refusal path: count, log within limits, keep, answer the sender.

Admission, the handlers and the error replies all refuse through one
`Rejections`, so every refused message is counted by its code (telemetry),
written within the sender's refusal limits (`RefusalLog`, its text escaped,
kept for ``ursa coordinator status``) and answered with an `ErrorReply`
when the sender is known. A refusal that only says when the message came
(`TIMING_CODES`: late, a round, epoch or run gone by) or an expected race the
caller names (``race``: a device's status before its hello) is written at
INFO; every other refusal at WARNING.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ursa.coordinator.clock import Clock
from ursa.coordinator.refusal_log import RefusalLog, Stored
from ursa.coordinator.signing_point import SigningPoint
from ursa.coordinator.telemetry import Telemetry
from ursa.protocol.messages import COORDINATOR, ErrorReply
from ursa.protocol.messages.base import TIMING_CODES

__all__ = ["Rejections"]


class Rejections:
    """Refuses a message (module docstring).

    Args:
        federation: The federation id (replies carry it).
        telemetry: Counts each refusal by code.
        refusals: Writes the line and keeps the error, within limits.
        outgoing: Queues the reply.
        clock: Seconds (the refusal limits).
        round_index: The current round (replies carry it).
    """

    def __init__(
        self,
        federation: str,
        *,
        telemetry: Telemetry,
        refusals: RefusalLog,
        outgoing: SigningPoint,
        clock: Clock,
        round_index: Callable[[], int],
    ) -> None:
        self._federation = federation
        self._telemetry = telemetry
        self._refusals = refusals
        self._outgoing = outgoing
        self._clock = clock
        self._round = round_index

    def reject(
        self,
        device: str | None,
        what: str,
        code: str,
        reason: str,
        in_reply_to: str | None,
        counted: bool = False,
        *,
        race: bool = False,
    ) -> None:
        """Refuse `what` from `device` (``counted``: the telemetry already has it).

        ``race``: an expected race, not a fault (logged at INFO, as the
        `TIMING_CODES` are).
        """
        if not counted:
            self._telemetry.rejected(code)
        expected = race or code in TIMING_CODES
        self._refusals.write(
            self._clock(),
            device,
            logging.INFO if expected else logging.WARNING,
            "rejected %s from %s: %s: %s",
            what,
            device,
            code,
            reason,
            kind=code,
            stored=Stored(what, code, reason),
        )
        if device is None:
            return
        reply = ErrorReply(
            federation=self._federation,
            round=self._round(),
            sender=COORDINATOR,
            code=code,
            reason=reason[:256],
            in_reply_to=in_reply_to,
        )
        self._outgoing.send(reply, device)
