"""Operator certificates: the root of trust the coordinator process does not hold.

The operator keeps an Ed25519 signing key (`OperatorKey`, made by ``ursa
operator init``) off the coordinator host and signs one `Certificate` per
device and one for the coordinator. Devices are provisioned with the
operator's public key (`OperatorPublicKey`) and check every identity the
coordinator relays (the agent, ring members, secure-aggregation peers, the
coordinator itself) against its certificate, so a coordinator that makes up
keys is refused instead of trusted.

Encoding (version 1, canonical: one byte string per certificate)::

    body        = 0x01 | role (1) | len(id) (1) | id | x25519 (32) | ed25519 (32)
                  | len(federation) (1) | federation | serial (8)
                  | issued_at (8) | expires_at (8)          (integers big-endian)
    certificate = body | signature (64)
    signature   = Ed25519(operator, "ursa-operator-certificate-v1" | operator
                  public key (32) | body)

The label keeps these signatures apart from every other Ed25519 signature in
ursa; the role keeps a device certificate from standing in for the
coordinator's. Times are unix seconds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from ursa.crypto.errors import CryptoError, UntrustedIdentityError
from ursa.crypto.identity import (
    KEY_BYTES,
    SIGNATURE_BYTES,
    DevicePublicIdentity,
    validate_device_id,
)
from ursa.crypto.secret_file import read_secret_file, write_new_secret_file

__all__ = [
    "COORDINATOR_SUBJECT",
    "MAX_CERTIFICATE_BYTES",
    "Certificate",
    "OperatorKey",
    "OperatorPublicKey",
    "Role",
]

_VERSION = 1
_FILE_VERSION = 1
_LABEL = b"ursa-operator-certificate-v1"
_FINGERPRINT_LABEL = b"ursa-operator-fingerprint-v1"
_TIMES = struct.Struct(">QQQ")
_ARMOUR = ("-----BEGIN URSA CERTIFICATE-----", "-----END URSA CERTIFICATE-----")
COORDINATOR_SUBJECT = "coordinator"
"""The subject id of a coordinator certificate (the protocol's reserved id)."""
MAX_CERTIFICATE_BYTES = 3 + 64 + 2 * KEY_BYTES + 1 + 64 + _TIMES.size + SIGNATURE_BYTES
"""Longest encoding: 64-character id and federation (285 bytes)."""


class Role(IntEnum):
    """What a certificate vouches for: a device, or the coordinator."""

    DEVICE = 1
    COORDINATOR = 2


@dataclass(frozen=True)
class Certificate:
    """An operator's statement: these keys are this subject's, in this federation."""

    role: Role
    subject: DevicePublicIdentity
    federation: str
    serial: int
    issued_at: int
    expires_at: int
    signature: bytes = b""

    def __post_init__(self) -> None:
        validate_device_id(self.federation)
        if (self.subject.device_id == COORDINATOR_SUBJECT) != (
            self.role is Role.COORDINATOR
        ):
            raise UntrustedIdentityError(
                f"a {self.role.name.lower()} certificate cannot name "
                f"{self.subject.device_id!r}"
            )
        for name in ("serial", "issued_at", "expires_at"):
            value = getattr(self, name)
            if not 0 <= value < 1 << 64:
                raise UntrustedIdentityError(f"certificate {name} out of range")
        if self.expires_at <= self.issued_at:
            raise UntrustedIdentityError("certificate expires before it is issued")

    def body(self) -> bytes:
        """The signed fields in their canonical encoding (no signature)."""
        subject_id = self.subject.device_id.encode("ascii")
        federation = self.federation.encode("ascii")
        return (
            bytes([_VERSION, self.role, len(subject_id)])
            + subject_id
            + self.subject.x25519_public
            + self.subject.ed25519_public
            + bytes([len(federation)])
            + federation
            + _TIMES.pack(self.serial, self.issued_at, self.expires_at)
        )

    def to_bytes(self) -> bytes:
        """``body | signature``: what the wire and the certificate file carry."""
        return self.body() + self.signature

    @classmethod
    def from_bytes(cls, data: bytes) -> Certificate:
        """Decode `to_bytes` output (not verified: see `OperatorPublicKey.verify`).

        Raises:
            UntrustedIdentityError: truncated, of another version, or malformed.
        """
        data = bytes(data)
        try:
            version, role, id_length = data[0], Role(data[1]), data[2]
            if version != _VERSION:
                raise UntrustedIdentityError(f"unknown certificate version {version}")
            at = 3 + id_length
            subject_id = data[3:at].decode("ascii")
            x25519, ed25519 = data[at : at + KEY_BYTES], data[at + KEY_BYTES :]
            ed25519, at = ed25519[:KEY_BYTES], at + 2 * KEY_BYTES
            federation_length = data[at]
            federation = data[at + 1 : at + 1 + federation_length].decode("ascii")
            at += 1 + federation_length
            serial, issued_at, expires_at = _TIMES.unpack_from(data, at)
            signature = data[at + _TIMES.size :]
            if len(signature) != SIGNATURE_BYTES:
                raise UntrustedIdentityError(
                    f"certificate of {len(data)} bytes has no whole signature"
                )
            subject = DevicePublicIdentity(subject_id, x25519, ed25519)
        except UntrustedIdentityError:
            raise
        except (IndexError, ValueError, struct.error, CryptoError) as exc:
            raise UntrustedIdentityError(f"malformed certificate: {exc}") from exc
        return cls(role, subject, federation, serial, issued_at, expires_at, signature)

    def to_text(self) -> str:
        """The armoured base64 form a certificate file holds."""
        encoded = base64.b64encode(self.to_bytes()).decode("ascii")
        return f"{_ARMOUR[0]}\n{encoded}\n{_ARMOUR[1]}\n"

    @classmethod
    def from_text(cls, text: str) -> Certificate:
        """Decode `to_text` output.

        Raises:
            UntrustedIdentityError: not an armoured certificate.
        """
        lines = [line.strip() for line in text.strip().splitlines()]
        if len(lines) != 3 or (lines[0], lines[2]) != _ARMOUR:
            raise UntrustedIdentityError("not an ursa certificate file")
        try:
            return cls.from_bytes(base64.b64decode(lines[1], validate=True))
        except binascii.Error as exc:
            raise UntrustedIdentityError(f"certificate is not base64: {exc}") from exc


@dataclass(frozen=True)
class OperatorPublicKey:
    """The operator's Ed25519 public key: what devices and the coordinator trust."""

    key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) != KEY_BYTES:
            raise UntrustedIdentityError(f"operator key must be {KEY_BYTES} bytes")
        try:
            Ed25519PublicKey.from_public_bytes(self.key)
        except ValueError as exc:
            raise UntrustedIdentityError(f"invalid operator key: {exc}") from exc

    @classmethod
    def from_hex(cls, text: str) -> OperatorPublicKey:
        """The key from its 64 hex digits (as configs hold it)."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as exc:
            raise UntrustedIdentityError(f"operator key is not hex: {exc}") from exc

    def hex(self) -> str:
        """64 hex digits, as `from_hex` reads them."""
        return self.key.hex()

    def fingerprint(self) -> str:
        """32 hex digits (128 bits) of SHA-256 over the key."""
        return hashlib.sha256(_FINGERPRINT_LABEL + self.key).hexdigest()[:32]

    def verify(
        self, certificate: Certificate, *, federation: str, role: Role, now: float
    ) -> DevicePublicIdentity:
        """The certified identity, if this key signed it for ``federation`` and now.

        Raises:
            UntrustedIdentityError: another signer, a tampered body, another
                federation or role, not yet valid or expired.
        """
        who = certificate.subject.device_id
        try:
            Ed25519PublicKey.from_public_bytes(self.key).verify(
                certificate.signature, _transcript(self.key, certificate.body())
            )
        except InvalidSignature as exc:
            raise UntrustedIdentityError(
                f"certificate of {who!r} is not signed by operator key "
                f"{self.fingerprint()}"
            ) from exc
        if certificate.federation != federation:
            raise UntrustedIdentityError(
                f"certificate of {who!r} is for federation "
                f"{certificate.federation!r}, not {federation!r}"
            )
        if certificate.role is not role:
            raise UntrustedIdentityError(
                f"certificate of {who!r} is a {certificate.role.name.lower()} "
                f"certificate, not a {role.name.lower()} one"
            )
        if not certificate.issued_at <= now < certificate.expires_at:
            raise UntrustedIdentityError(
                f"certificate of {who!r} is valid from {certificate.issued_at} "
                f"to {certificate.expires_at}, not at {int(now)}"
            )
        return certificate.subject


class OperatorKey:
    """The operator's private signing key; never on the coordinator host."""

    __slots__ = ("_key", "_public")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        """Wrap a key; use `generate` or `load` instead."""
        self._key = key
        self._public = OperatorPublicKey(key.public_key().public_bytes_raw())

    def __repr__(self) -> str:
        return f"OperatorKey(fingerprint={self._public.fingerprint()})"

    @classmethod
    def generate(cls) -> OperatorKey:
        """A fresh random key (not persisted)."""
        return cls(Ed25519PrivateKey.generate())

    def public(self) -> OperatorPublicKey:
        """The public key devices and the coordinator are provisioned with."""
        return self._public

    def certify(
        self,
        role: Role,
        subject: DevicePublicIdentity,
        *,
        federation: str,
        serial: int,
        issued_at: int,
        expires_at: int,
    ) -> Certificate:
        """Sign ``subject``'s keys for ``federation`` until ``expires_at``."""
        unsigned = Certificate(role, subject, federation, serial, issued_at, expires_at)
        signature = self._key.sign(_transcript(self._public.key, unsigned.body()))
        return Certificate(
            role, subject, federation, serial, issued_at, expires_at, signature
        )

    def write_new(self, path: Path) -> bool:
        """Write the key file (0600 from creation); False if ``path`` exists."""
        raw = self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        record = {"version": _FILE_VERSION, "ed25519_private": raw.hex()}
        data = (json.dumps(record, indent=2) + "\n").encode("ascii")
        return write_new_secret_file(path, data)

    @classmethod
    def load(cls, path: Path) -> OperatorKey:
        """Read a key file `write_new` made.

        Raises:
            CryptoError: unreadable, accessible by group or others, or corrupt.
        """
        data = read_secret_file(path, "operator key")
        try:
            record = json.loads(data)
            if record["version"] != _FILE_VERSION:
                raise ValueError(f"unknown version {record['version']}")
            raw = bytes.fromhex(record["ed25519_private"])
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise CryptoError(f"corrupt operator key file {path}: {exc}") from exc


def _transcript(operator: bytes, body: bytes) -> bytes:
    return _LABEL + operator + body
