"""Refusals of this coordinator's identity: which ones count, and what they may cost.

A device that pinned another coordinator identity answers our accepted
`EnrolResult` with an `ErrorReply` of code ``coordinator_identity_mismatch``.
The refusal takes the device out of the counted fleet and, when the current
key epoch counted it, makes the fleet key again, since it will neither seal
(as the agent) nor register. Unchecked, any enrolled device could send one
whenever it liked: two devices alternating unsigned refusals started 41 key
epochs in a row (issue 28). So:

* A refusal counts only when it is signed by the device's enrolled Ed25519
  identity and names, by id and `message_digest`, the latest acceptance this
  coordinator sent that device: the one under which the current key epoch
  counted it. Each acceptance is refused once (it is then forgotten), so a
  replayed refusal, one naming an older acceptance (of an earlier epoch) or
  one naming a message never sent names nothing. The refusal is then
  rejected (``bad_signature`` or ``unauthorised``), logged and answered like
  any bad message, and changes nothing.
* One device's counted refusals start at most ``refusal_rekeys`` key epochs
  in any ``refusal_window_s`` (`KeyEpochConfig`); a refusal beyond that makes
  the device sit the epoch out, which serves the fleet as well.

Bookkeeping only: the service records what it sends, asks here, and starts
epochs. The acceptances live in memory (one per device that has not refused
its latest): after a restart an honest refuser's answer to an acceptance of
the previous process names nothing, and its next Hello (the device says one
whenever it sees the coordinator's run, `HELLO_ON_NEW_RUN_S`) gets a fresh
one. The re-key times are persisted by the service (`to_json`, `restore`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ursa.coordinator.config import KeyEpochConfig
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity, verify_signature
from ursa.protocol.envelope import message_digest, signing_bytes
from ursa.protocol.messages import EnrolResult, ErrorCode, ErrorReply
from ursa.protocol.router import RejectedError

__all__ = ["REFUSAL_REKEYS_KEY", "IdentityRefusals"]

logger = logging.getLogger("ursa.coordinator")

REFUSAL_REKEYS_KEY = "refusal_rekeys"
"""Store meta key: JSON ``{device: [unix seconds, ...]}`` of refusal re-keys."""


@dataclass(frozen=True)
class _Sent:
    """An acceptance as a refusal must name it."""

    message_id: str
    digest: str


class IdentityRefusals:
    """The acceptances a device may refuse, and each device's refusal re-keys.

    Args:
        config: ``[key_epochs]``: the re-keys one device may cause per window.
    """

    def __init__(self, config: KeyEpochConfig) -> None:
        self._config = config
        self._sent: dict[str, _Sent] = {}
        self._rekeys: dict[str, list[float]] = {}

    def sent(self, acceptance: EnrolResult) -> None:
        """Record the acceptance sent to ``acceptance.device_id`` (the latest wins)."""
        self._sent[acceptance.device_id] = _Sent(
            acceptance.message_id, message_digest(acceptance)
        )

    def check(self, refusal: ErrorReply, identity: DevicePublicIdentity) -> None:
        """Accept a refusal by the device of ``identity`` once, or raise.

        Raises:
            RejectedError: ``unauthorised`` when it names no acceptance
                outstanding for the device (never sent, refused already, an
                older one, or altered); ``bad_signature`` when the device's
                identity key did not sign it. Either way nothing changes.
        """
        device = refusal.sender
        sent = self._sent.get(device)
        if (
            sent is None
            or refusal.in_reply_to != sent.message_id
            or refusal.in_reply_to_digest != sent.digest
        ):
            raise RejectedError(
                ErrorCode.UNAUTHORISED,
                f"the refusal names no enrol_result this coordinator sent {device} "
                "and it has not refused yet; ignored",
            )
        try:
            verify_signature(identity, signing_bytes(refusal), refusal.signature)
        except CryptoError as exc:
            raise RejectedError(
                ErrorCode.BAD_SIGNATURE,
                f"a refusal of the coordinator's identity must be signed by the "
                f"device ({exc}); ignored",
            ) from None
        del self._sent[device]

    def may_rekey(self, device: str, now: float) -> bool:
        """Whether ``device``'s refusal may start a key epoch now (counted if so)."""
        window = self._config.refusal_window_s
        recent = [t for t in self._rekeys.get(device, ()) if now - t < window]
        allowed = len(recent) < self._config.refusal_rekeys
        if allowed:
            recent.append(now)
        if recent:
            self._rekeys[device] = recent
        else:
            self._rekeys.pop(device, None)
        return allowed

    def to_json(self) -> str:
        """The re-key times, for the store (`REFUSAL_REKEYS_KEY`)."""
        return json.dumps(self._rekeys, sort_keys=True)

    def restore(self, raw: str | None) -> None:
        """Take the re-key times back from the store; an unreadable record is empty."""
        self._rekeys = {}
        try:
            data = json.loads(raw or "{}")
            if not isinstance(data, dict):
                raise TypeError("not an object")
            for device, times in data.items():
                self._rekeys[str(device)] = [float(t) for t in times]
        except (ValueError, TypeError) as exc:
            logger.warning(
                "ignoring an unreadable %s record: %s", REFUSAL_REKEYS_KEY, exc
            )
            self._rekeys = {}
