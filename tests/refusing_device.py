"""A compromised device that says Hello and refuses the coordinator at will.

The real SDK may run for the same device: the helper holds its identity key
(the SDK loads the same ``identity.key``), so it can say Hello and sign what
it likes, publishing on the device's own topics only, as the broker ACL
allows. For the key-epoch tests (`tests/adversarial/test_key_epochs.py`).
"""

from __future__ import annotations

from typing import Any

from ursa.crypto.identity import DeviceIdentity
from ursa.protocol.envelope import message_digest, signing_bytes
from ursa.protocol.messages import EnrolResult, ErrorReply, Hello

MISMATCH = "coordinator_identity_mismatch"


class RefusingDevice:
    """One device of a test `Federation` (``fed``), as its attacker speaks."""

    def __init__(self, fed: Any, device: str) -> None:
        self.fed, self.device = fed, device
        self.identity = DeviceIdentity.load_or_create(fed.tmp_path / device, device)

    def hello(self) -> EnrolResult:
        """Say Hello; the acceptance the coordinator answered with."""
        public = self.identity.public()
        self.fed.send_as(
            self.device,
            Hello(
                federation=self.fed.config.federation,
                round=0,
                sender=self.device,
                device_id=self.device,
                x25519_public=public.x25519_public,
                ed25519_public=public.ed25519_public,
            ),
        )
        return self.acceptances()[-1]

    def acceptances(self) -> list[EnrolResult]:
        """The acceptances the coordinator sent this device, oldest first."""
        return [
            m
            for _, m in self.fed.messages("enrol_result")
            if m.device_id == self.device and m.accepted
        ]

    def refusal(
        self,
        named: Any = None,
        *,
        signer: DeviceIdentity | None = None,
        digest: str | None = None,
        in_reply_to: str | None = None,
    ) -> ErrorReply:
        """A `coordinator_identity_mismatch` naming ``named``, signed by ``signer``."""
        reply = ErrorReply(
            federation=self.fed.config.federation,
            run=self.fed.coordinator.run_id,
            round=0,
            sender=self.device,
            code=MISMATCH,
            reason="coordinator identity is not the pinned one",
            in_reply_to=in_reply_to or (named.message_id if named else None),
            in_reply_to_digest=digest or (message_digest(named) if named else None),
        )
        if signer is None:
            return reply
        return reply.model_copy(update={"signature": signer.sign(signing_bytes(reply))})

    def refuse(self, named: Any, **kwargs: Any) -> ErrorReply:
        """Send a refusal (by default signed by this device's own key)."""
        kwargs.setdefault("signer", self.identity)
        message = self.refusal(named, **kwargs)
        self.fed.send_as(self.device, message)
        return message
