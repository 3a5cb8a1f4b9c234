"""`DeviceLink`: what every part of the device runtime shares to talk to the fleet.

The client owns the outbox and the run it joined; its parts are handed this
link (who the device is, its identity and state directory once started, the
pinned coordinator, whom relayed keys must be certified by, how a message
leaves) rather than the client itself.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from ursa.crypto.certificate import Role
from ursa.crypto.errors import UntrustedIdentityError
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity, verify_signature
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.membership import RunMembership
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.protocol.envelope import encode, message_digest, message_kind, signing_bytes
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import BaseMessage, ErrorCode, ErrorReply, IdentityKeys
from ursa.protocol.outbox import Outbox
from ursa.protocol.router import NotReadyError
from ursa.protocol.topics import name_for, qos_for, up_topic
from ursa.protocol.untrusted_text import escape

__all__ = ["DeviceLink"]

logger = logging.getLogger("ursa.edge_sdk")

_M = TypeVar("_M", bound=BaseMessage)


class DeviceLink:
    """This device on the wire: who it is, whom it trusts, and its way out.

    Args:
        config: The device configuration.
        outbox: The client's outbox (flushed outside the client's lock).
        membership: The run joined (stamped on what is sent).
    """

    def __init__(
        self, config: DeviceConfig, outbox: Outbox, membership: RunMembership
    ) -> None:
        self.config = config
        self.federation = config.federation
        self.device_id = config.device_id
        self.trust = config.trust.anchor(config.federation, config.device_id)
        """Whom relayed identities must be certified by (``[trust]``)."""
        self._outbox = outbox
        self._membership = membership
        self._identity: DeviceIdentity | None = None
        self._store: DeviceStateDir | None = None
        self._coordinator: DevicePublicIdentity | None = None
        self.certificate = b""
        """This device's operator certificate, sent in its Hello (b"": tofu)."""

    def open(self) -> DeviceStateDir:
        """Load the state directory, the identity and the pinned coordinator.

        Raises:
            UnsafeDirectoryError: the state directory is not private.
        """
        config = self.config
        self._store = DeviceStateDir(config.state_dir)
        self._identity = DeviceIdentity.load_or_create(
            config.state_dir, config.device_id
        )
        self.certificate = config.trust.own_certificate(
            self.trust, self._identity.public(), Role.DEVICE
        )
        self._coordinator = self._store.load_coordinator()
        return self._store

    @property
    def store(self) -> DeviceStateDir:
        """The device's state directory (after `EdgeClient.start`)."""
        if self._store is None:
            raise RuntimeError(f"{self.device_id} is not started")
        return self._store

    @property
    def identity(self) -> DeviceIdentity:
        """The device's identity keys (after `EdgeClient.start`)."""
        if self._identity is None:
            raise RuntimeError(f"{self.device_id} is not started")
        return self._identity

    @property
    def coordinator(self) -> DevicePublicIdentity | None:
        """The pinned coordinator identity (None before the first acceptance)."""
        return self._coordinator

    def pin(self, coordinator: DevicePublicIdentity) -> None:
        """Pin the coordinator identity (stored first: it outlives a restart)."""
        self.store.save_coordinator(coordinator)
        self._coordinator = coordinator

    def in_run(self, message: _M) -> _M:
        """`message` stamped with the joined run (unless it names one already)."""
        if message.run:
            return message
        return message.model_copy(update={"run": self._membership.run})

    def send(self, message: BaseMessage) -> None:
        """Queue ``message`` on this device's up topic, stamped with the run."""
        name = name_for(message_kind(message))
        topic = up_topic(self.federation, self.device_id, name)
        self._outbox.put(topic, encode(self.in_run(message)), qos_for(name))

    def signed(self, message: _M) -> _M:
        """Stamp the run, then sign: the signature covers the run."""
        stamped = self.in_run(message)
        signature = self.identity.sign(signing_bytes(stamped))
        return stamped.model_copy(update={"signature": signature})

    @staticmethod
    def verify(signer: DevicePublicIdentity, message: BaseMessage) -> None:
        """``signer``'s signature on ``message`` (raises `CryptoError`)."""
        signature: bytes = getattr(message, "signature", b"")
        verify_signature(signer, signing_bytes(message), signature)

    def verify_coordinator(self, message: BaseMessage) -> None:
        """The pinned coordinator's signature on ``message`` (parked until pinned)."""
        coordinator = self._coordinator
        if coordinator is None:
            raise NotReadyError
        self.verify(coordinator, message)

    def trusted(
        self, keys: IdentityKeys, role: Role = Role.DEVICE
    ) -> DevicePublicIdentity:
        """The identity behind relayed keys, if the operator certified them.

        The one place a device takes a peer's keys from the coordinator: under
        an operator key a made-up agent, ring member or peer stops here.

        Raises:
            UntrustedIdentityError: no valid certificate for these keys (the
                client then refuses the message with ``untrusted_identity``).
        """
        return self.trust.check(keys.public_identity(), keys.certificate, role)

    def refuse_untrusted(
        self, message: BaseMessage, exc: UntrustedIdentityError
    ) -> None:
        """One ERROR and an ``untrusted_identity`` reply for keys nobody vouched for."""
        kind, why = message_kind(message), escape(str(exc))
        logger.error(
            "%s: refusing %s: untrusted identity: %s", self.device_id, kind, why
        )
        self.tell_coordinator(
            ErrorCode.UNTRUSTED_IDENTITY,
            f"{kind}: {why}",
            round_index=message.round,
            message_id=derived_id(self.device_id, "untrusted", message.message_id),
            in_reply_to=message.message_id,
            run=message.run,
        )

    def tell_coordinator(
        self,
        code: ErrorCode,
        reason: str,
        *,
        round_index: int,
        message_id: str,
        in_reply_to: str | None,
        run: str = "",
        named: BaseMessage | None = None,
    ) -> ErrorReply:
        """Why this device refuses what the coordinator sent (an `ErrorReply`).

        ``message_id`` is derived from what is refused, so a repeated answer
        is recognised by the coordinator's dedup. ``run``: the refused
        message's run, when the device has not joined it (else the joined one).
        ``named``: the refused message, for a refusal that can start a key
        epoch: the answer then carries its digest and is signed, so the
        coordinator can tell it from a forged or unsolicited one.
        """
        reply = ErrorReply(
            federation=self.federation,
            run=run,
            round=round_index,
            sender=self.device_id,
            message_id=message_id,
            code=code,
            reason=reason[:256],
            in_reply_to=in_reply_to if named is None else named.message_id,
            in_reply_to_digest=None if named is None else message_digest(named),
        )
        sent = reply if named is None else self.signed(reply)
        self.send(sent)
        return sent
