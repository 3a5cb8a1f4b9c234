from __future__ import annotations

import os
from pathlib import Path

import pytest

from ursa.crypto.certificate import (
    MAX_CERTIFICATE_BYTES,
    Certificate,
    OperatorKey,
    OperatorPublicKey,
    Role,
)
from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.trust_anchor import TrustAnchor

NOW = 1_800_000_000
OPERATOR = OperatorKey.generate()
OPERATOR_PUBLIC = OPERATOR.public()


def _certificate(
    device_id: str = "pi-01", role: Role = Role.DEVICE, federation: str = "trial"
) -> Certificate:
    subject = DeviceIdentity.generate(device_id).public()
    return OPERATOR.certify(
        role,
        subject,
        federation=federation,
        serial=7,
        issued_at=NOW - 10,
        expires_at=NOW + 3600,
    )


def _verify(
    certificate: Certificate, key: OperatorPublicKey = OPERATOR_PUBLIC
) -> DevicePublicIdentity:
    return key.verify(certificate, federation="trial", role=Role.DEVICE, now=NOW)


def test_round_trip_through_bytes_and_text_verifies() -> None:
    certificate = _certificate()
    assert Certificate.from_bytes(certificate.to_bytes()) == certificate
    assert Certificate.from_text(certificate.to_text()) == certificate
    assert _verify(Certificate.from_text(certificate.to_text())) == certificate.subject


def test_longest_encoding_is_bounded() -> None:
    certificate = _certificate("d" * 64, federation="f" * 64)
    assert len(certificate.to_bytes()) == MAX_CERTIFICATE_BYTES


@pytest.mark.parametrize("index", [1, 3, 10, 40, 80, 100, -70, -1])
def test_a_flipped_byte_is_refused(index: int) -> None:
    data = bytearray(_certificate().to_bytes())
    data[index] ^= 0x01
    with pytest.raises(UntrustedIdentityError):
        _verify(Certificate.from_bytes(bytes(data)))


def test_truncated_and_overlong_encodings_are_refused() -> None:
    data = _certificate().to_bytes()
    for broken in (data[:-1], data + b"\0", b"", data[:5]):
        with pytest.raises(UntrustedIdentityError):
            Certificate.from_bytes(broken)


def test_expired_and_not_yet_valid_are_refused() -> None:
    certificate = _certificate()
    key = OPERATOR.public()
    for now in (NOW + 3600, NOW - 11):
        with pytest.raises(UntrustedIdentityError, match="valid from"):
            key.verify(certificate, federation="trial", role=Role.DEVICE, now=now)


def test_wrong_federation_role_and_signer_are_refused() -> None:
    with pytest.raises(UntrustedIdentityError, match="federation"):
        _verify(_certificate(federation="other"))
    with pytest.raises(UntrustedIdentityError, match="not signed"):
        _verify(_certificate(), OperatorKey.generate().public())
    coordinator = _certificate("coordinator", Role.COORDINATOR)
    with pytest.raises(UntrustedIdentityError, match="coordinator certificate"):
        _verify(coordinator)


def test_roles_and_reserved_subject_go_together() -> None:
    with pytest.raises(UntrustedIdentityError):
        _certificate("coordinator", Role.DEVICE)
    with pytest.raises(UntrustedIdentityError):
        _certificate("pi-01", Role.COORDINATOR)


def test_operator_key_file_is_0600_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "operator.key"
    old_umask = os.umask(0)
    try:
        assert OPERATOR.write_new(path)
    finally:
        os.umask(old_umask)
    assert path.stat().st_mode & 0o777 == 0o600
    assert not OPERATOR.write_new(path)  # never overwritten
    assert OperatorKey.load(path).public() == OPERATOR.public()
    assert OPERATOR.public().hex() not in repr(OPERATOR)
    path.chmod(0o640)
    with pytest.raises(CryptoError, match="must not be accessible"):
        OperatorKey.load(path)


def test_operator_public_key_hex_round_trip() -> None:
    key = OPERATOR.public()
    assert OperatorPublicKey.from_hex(key.hex()) == key
    assert len(key.fingerprint()) == 32
    with pytest.raises(UntrustedIdentityError):
        OperatorPublicKey.from_hex("zz")


def test_trust_anchor_checks_the_keys_the_certificate_names() -> None:
    certificate = _certificate()
    anchor = TrustAnchor(OPERATOR.public(), "trial", clock=lambda: NOW)
    subject = certificate.subject
    assert anchor.check(subject, certificate.to_bytes()) == subject
    impostor = DeviceIdentity.generate("pi-01").public()
    with pytest.raises(UntrustedIdentityError, match="does not match"):
        anchor.check(impostor, certificate.to_bytes())
    with pytest.raises(UntrustedIdentityError, match="no operator certificate"):
        anchor.check(subject, b"")


def test_tofu_anchor_takes_presented_keys() -> None:
    anchor = TrustAnchor(None, "trial")
    impostor = DeviceIdentity.generate("pi-01").public()
    assert anchor.mode == "tofu"
    assert anchor.check(impostor, b"") == impostor
