"""Enrolment decisions: pinned list and trust on first use."""

from __future__ import annotations

import pytest

from ursa.coordinator.config import EnrolmentConfig
from ursa.coordinator.enrolment import (
    EnrolmentDecision,
    decide_enrolment,
    device_keys_of,
    enrol_result,
    keys_of,
)
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import COORDINATOR, EnrolResult, Hello


def _hello(identity: DevicePublicIdentity) -> Hello:
    return Hello(
        federation="f",
        round=0,
        sender=identity.device_id,
        device_id=identity.device_id,
        x25519_public=identity.x25519_public,
        ed25519_public=identity.ed25519_public,
    )


def test_pinned_accepts_only_matching_fingerprints() -> None:
    good = DeviceIdentity.generate("a").public()
    other = DeviceIdentity.generate("a").public()
    policy = EnrolmentConfig(mode="pinned", pins={"a": good.fingerprint()})
    assert decide_enrolment(_hello(good), None, policy).is_new
    refused = decide_enrolment(_hello(other), None, policy)
    assert not refused.accepted and "does not match pin" in refused.reason
    unlisted = DeviceIdentity.generate("b").public()
    assert not decide_enrolment(_hello(unlisted), None, policy).accepted


def test_tofu_first_key_wins() -> None:
    first = DeviceIdentity.generate("a").public()
    second = DeviceIdentity.generate("a").public()
    policy = EnrolmentConfig(mode="tofu")
    decision = decide_enrolment(_hello(first), None, policy)
    assert decision.accepted and decision.is_new and decision.identity == first
    again = decide_enrolment(_hello(first), first, policy)
    assert again.accepted and not again.is_new
    assert not decide_enrolment(_hello(second), first, policy).accepted


def test_an_acceptance_carries_the_coordinator_keys_a_refusal_none() -> None:
    coordinator = DeviceIdentity.generate(COORDINATOR).public()
    device = DeviceIdentity.generate("a").public()
    policy = EnrolmentConfig(mode="tofu")
    where = {"federation": "f", "round_index": 3, "device_id": "a", "epoch": 2}

    accepted = enrol_result(
        decide_enrolment(_hello(device), None, policy), coordinator, **where
    )
    wire = decode(encode(accepted))
    assert isinstance(wire, EnrolResult) and wire.accepted
    assert wire.coordinator_keys == keys_of(coordinator)
    assert (wire.sender, wire.round, wire.epoch) == (COORDINATOR, 3, 2)
    keys = wire.coordinator_keys
    assert keys is not None
    rebuilt = DevicePublicIdentity(
        keys.device_id, keys.x25519_public, keys.ed25519_public
    )
    assert rebuilt == coordinator

    other = DeviceIdentity.generate("a").public()
    refused = enrol_result(
        decide_enrolment(_hello(other), device, policy), coordinator, **where
    )
    assert not refused.accepted and refused.coordinator_keys is None
    assert "differ" in refused.reason


def test_enrol_result_refuses_a_coordinator_identity_with_another_id() -> None:
    impostor = DeviceIdentity.generate("not-coordinator").public()
    with pytest.raises(ValueError, match="must have id"):
        enrol_result(
            EnrolmentDecision(True, "enrolled"),
            impostor,
            federation="f",
            round_index=0,
            device_id="a",
            epoch=None,
        )


def test_device_keys_of_gives_the_wire_form_of_a_device_identity() -> None:
    device = DeviceIdentity.generate("a").public()
    keys = device_keys_of(device)
    assert (keys.device_id, keys.x25519_public, keys.ed25519_public) == (
        "a",
        device.x25519_public,
        device.ed25519_public,
    )
    with pytest.raises(ValueError):
        device_keys_of(DeviceIdentity.generate(COORDINATOR).public())


def test_a_revoked_device_is_refused_in_either_mode() -> None:
    known = DeviceIdentity.generate("a").public()
    for policy in (
        EnrolmentConfig(mode="tofu"),
        EnrolmentConfig(mode="pinned", pins={"a": known.fingerprint()}),
    ):
        assert decide_enrolment(_hello(known), known, policy).accepted
        refused = decide_enrolment(_hello(known), known, policy, {"a"})
        assert not refused.accepted and "revoked" in refused.reason


def test_an_operator_certificate_stands_in_for_a_pin_and_is_required() -> None:
    from ursa.crypto.certificate import OperatorKey, Role
    from ursa.crypto.trust_anchor import TrustAnchor
    from ursa.tools.cli.operator import certify

    operator = OperatorKey.generate()
    trust = TrustAnchor(operator.public(), "f")
    device = DeviceIdentity.generate("a").public()
    certificate = certify(operator, Role.DEVICE, device, federation="f").to_bytes()
    pinned = EnrolmentConfig(mode="pinned")  # "a" is on no list
    hello = _hello(device).model_copy(update={"certificate": certificate})
    assert decide_enrolment(hello, None, pinned, trust=trust).is_new
    bare = decide_enrolment(_hello(device), None, pinned, trust=trust)
    assert not bare.accepted and "untrusted identity" in bare.reason
    impostor = _hello(DeviceIdentity.generate("a").public())
    forged = impostor.model_copy(update={"certificate": certificate})
    refused = decide_enrolment(forged, None, EnrolmentConfig(mode="tofu"), trust=trust)
    assert not refused.accepted and "does not match" in refused.reason
