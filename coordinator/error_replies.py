"""Error replies from devices: what each code means for the coordinator.

A device answers what it refuses or fails with an `ErrorReply`. Most are
only logged (within the per-device refusal limits); four kinds act:

* ``coordinator_identity_mismatch``: the device pinned another coordinator;
  the (signed) refusal is checked, then the device is counted out.
* ``untrusted_identity``: it refused keys this coordinator relayed (someone
  swapped keys): an operator must look.
* a mismatch of method, data, model or security parameters: the device does
  not fit the federation and sits the key epoch out.
* its own work failed (training, evaluation, plain refused, secure
  aggregation, a transfer): the open round stops waiting for it;
* ``mean_refused``: it refused a secure mean's sum (logged); the open round
  hears of it too, so it stops waiting for the agent's result of that sum.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from ursa.coordinator.refusal_log import RefusalLog
from ursa.protocol.messages import ErrorCode, ErrorReply
from ursa.protocol.messages.secure_mean import MEAN_REFUSED

__all__ = ["ErrorReplies"]

SITS_OUT = frozenset(
    {
        ErrorCode.METHOD_MISMATCH,
        ErrorCode.DATA_MISMATCH,
        ErrorCode.MODEL_MISMATCH,
        ErrorCode.INSECURE_PARAMETERS,
    }
)
"""A device answering these does not fit the federation: not selected this epoch."""

FAILED = frozenset(
    {
        ErrorCode.TRAINING_FAILED,
        ErrorCode.EVALUATION_FAILED,
        ErrorCode.PLAIN_REFUSED,
        ErrorCode.SECURE_AGGREGATION_FAILED,
        ErrorCode.TRANSFER_FAILED,
    }
)
"""A selected device's own work failed (or the model it holds is not the signed
notice's): the open round stops waiting for it."""


class ErrorReplies:
    """Acts on a device's `ErrorReply` (module docstring).

    Args:
        refusals: Writes the lines within the per-device limits.
        clock: Seconds (the refusal limits).
        epoch: The current key epoch's number (for the sit-out line).
        refused: The device refused our identity (the reply is checked first).
        sit_out: Leaves a device out of the current key epoch (and why).
        failed: A device's work in ``round`` failed with ``code``.
    """

    def __init__(
        self,
        refusals: RefusalLog,
        *,
        clock: Callable[[], float],
        epoch: Callable[[], int],
        refused: Callable[[ErrorReply], None],
        sit_out: Callable[[str, str], None],
        failed: Callable[[int, str, str], None],
    ) -> None:
        self._refusals = refusals
        self._clock = clock
        self._epoch = epoch
        self._refused = refused
        self._sit_out = sit_out
        self._failed = failed

    def on_error_reply(self, message: ErrorReply) -> None:
        """The router's handler for `ErrorReply`."""
        report = functools.partial(
            self._refusals.write, self._clock(), message.sender, kind=message.code
        )
        if message.code == ErrorCode.COORDINATOR_IDENTITY_MISMATCH:
            self._refused(message)
            return
        if message.code == ErrorCode.UNTRUSTED_IDENTITY:  # someone swapped keys
            report(
                logging.ERROR,
                "%s refused keys this coordinator relayed: %s",
                message.sender,
                message.reason,
            )
            return
        if message.code in SITS_OUT:  # an operator must act
            report(
                logging.ERROR,
                "%s sits out: %s: %s (excluded from key epoch %d)",
                message.sender,
                message.code,
                message.reason,
                self._epoch(),
            )
            self._sit_out(message.sender, f"{message.code}: {message.reason}")
            return
        if message.code in FAILED:
            report(
                logging.WARNING,
                "%s reports %s in round %d: %s",
                message.sender,
                message.code,
                message.round,
                message.reason,
            )
            self._failed(message.round, message.sender, message.code)
            return
        if message.code == MEAN_REFUSED:
            self._failed(message.round, message.sender, message.code)
        report(
            logging.INFO,
            "%s reports %s: %s",
            message.sender,
            message.code,
            message.reason,
        )
