"""Enrolment: who may join, by pinned fingerprint or trust on first use.

`decide_enrolment` is pure: a `Hello`, what the coordinator already knows of
that device id, and the policy give accept/refuse and a reason. Pinned mode
(the default) admits only device ids listed with the fingerprint of their
identity keys; TOFU admits the first key a device id presents and refuses any
other key later (a device that lost its state directory must be re-admitted
by an operator).

`enrol_result` builds the reply: an acceptance carries the coordinator's
public identity in `EnrolResult.coordinator_keys`; devices pin it (or check it
against their configured fingerprint) and verify the coordinator's signatures
with it. `keys_of` gives the wire form of any public identity.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ursa.coordinator.config import EnrolmentConfig
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.trust_anchor import TrustAnchor
from ursa.protocol.messages import (
    COORDINATOR,
    DeviceKeys,
    EnrolResult,
    Hello,
    IdentityKeys,
)

__all__ = [
    "EnrolmentDecision",
    "decide_enrolment",
    "device_keys_of",
    "enrol_result",
    "identity_of",
    "keys_of",
]


@dataclass(frozen=True)
class EnrolmentDecision:
    """The outcome for one Hello."""

    accepted: bool
    reason: str
    is_new: bool = False
    identity: DevicePublicIdentity | None = None


def identity_of(hello: Hello) -> DevicePublicIdentity:
    """The public identity a Hello presents.

    Raises:
        CryptoError: malformed keys (e.g. an invalid Ed25519 point).
    """
    return DevicePublicIdentity(
        hello.device_id, bytes(hello.x25519_public), bytes(hello.ed25519_public)
    )


def decide_enrolment(
    hello: Hello,
    known: DevicePublicIdentity | None,
    policy: EnrolmentConfig,
    revoked: Collection[str] = frozenset(),
    trust: TrustAnchor | None = None,
) -> EnrolmentDecision:
    """Accept or refuse a Hello under `policy`, given the enrolled identity if any.

    A ``revoked`` device (`ursa coordinator revoke`) is refused in either mode.
    Under an operator ``trust`` anchor the Hello must carry a valid operator
    certificate for its keys, which then stands in for a pin (the operator
    enrolled the device when it certified it).
    """
    if hello.device_id in revoked:
        return EnrolmentDecision(False, "enrolment of this device id was revoked")
    try:
        identity = identity_of(hello)
    except CryptoError as exc:
        return EnrolmentDecision(False, f"invalid identity keys: {exc}")
    certified = trust is not None and trust.operator is not None
    if trust is not None:
        try:
            trust.check(identity, bytes(hello.certificate))
        except UntrustedIdentityError as exc:
            return EnrolmentDecision(False, f"untrusted identity: {exc}")
    fingerprint = identity.fingerprint()
    if known is not None:
        if known == identity:
            return EnrolmentDecision(True, "already enrolled", identity=identity)
        return EnrolmentDecision(
            False, "identity keys differ from the enrolled ones for this device id"
        )
    if policy.mode == "pinned" and not certified:
        pin = policy.pins.get(hello.device_id)
        if pin is None:
            return EnrolmentDecision(False, "device id is not on the enrolment list")
        if pin != fingerprint:
            return EnrolmentDecision(False, "identity fingerprint does not match pin")
    return EnrolmentDecision(True, "enrolled", is_new=True, identity=identity)


def keys_of(identity: DevicePublicIdentity, certificate: bytes = b"") -> IdentityKeys:
    """The wire form of a public identity (any id, the coordinator's included).

    ``certificate``: its operator certificate, relayed so the receiver can
    check the keys (b"": none, tofu).
    """
    return IdentityKeys(
        device_id=identity.device_id,
        x25519_public=identity.x25519_public,
        ed25519_public=identity.ed25519_public,
        certificate=certificate,
    )


def device_keys_of(
    identity: DevicePublicIdentity, certificate: bytes = b""
) -> DeviceKeys:
    """The wire form of a device's public identity (never the coordinator's)."""
    return DeviceKeys(
        device_id=identity.device_id,
        x25519_public=identity.x25519_public,
        ed25519_public=identity.ed25519_public,
        certificate=certificate,
    )


def enrol_result(
    decision: EnrolmentDecision,
    coordinator: DevicePublicIdentity,
    *,
    federation: str,
    round_index: int,
    device_id: str,
    epoch: int | None,
    certificate: bytes = b"",
) -> EnrolResult:
    """The reply to a Hello: an acceptance carries the coordinator's public keys.

    ``certificate``: the coordinator's operator certificate (b"": tofu).
    """
    if coordinator.device_id != COORDINATOR:
        raise ValueError(f"the coordinator identity must have id {COORDINATOR!r}")
    return EnrolResult(
        federation=federation,
        round=round_index,
        sender=COORDINATOR,
        device_id=device_id,
        accepted=decision.accepted,
        reason=decision.reason,
        epoch=epoch,
        coordinator_keys=(
            keys_of(coordinator, certificate) if decision.accepted else None
        ),
    )
