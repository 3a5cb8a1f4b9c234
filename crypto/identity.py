"""Persistent device identity: X25519 for sealing, Ed25519 for signing.

A device creates its identity on first start (`DeviceIdentity.load_or_create`)
and keeps it in ``<state_dir>/identity.key``: a small JSON file with both
private keys, created atomically with mode 0600 and refused on load if group or
world can access it. The public half (`DevicePublicIdentity`) is what the
coordinator relays and what operators pin by `DevicePublicIdentity.fingerprint`.

Signatures are plain Ed25519 over the given bytes: callers must put everything
that gives the message its meaning (kind, federation, round, key epoch) into
the signed bytes. The private key file is not encrypted at rest; protect the
state directory (and the SD card) accordingly.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from ursa.crypto.errors import CryptoError, IdentityFormatError, SignatureError
from ursa.crypto.secret_file import read_secret_file, write_new_secret_file

__all__ = [
    "DEVICE_ID_PATTERN",
    "IDENTITY_FILENAME",
    "KEY_BYTES",
    "SIGNATURE_BYTES",
    "DeviceIdentity",
    "DevicePublicIdentity",
    "IdentityFormatError",
    "validate_device_id",
    "verify_signature",
]

IDENTITY_FILENAME = "identity.key"
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Device ids are MQTT-topic and client-id safe: no ``/ + #``, spaces or NUL."""
KEY_BYTES = 32
SIGNATURE_BYTES = 64
_PUBLIC_VERSION = 1
_FILE_VERSION = 1
_FINGERPRINT_LABEL = b"ursa-identity-fingerprint-v1"


def validate_device_id(device_id: str) -> str:
    """Return ``device_id`` if it matches `DEVICE_ID_PATTERN`, else raise."""
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
        raise IdentityFormatError(
            f"invalid device id {device_id!r}: 1-64 of [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return device_id


@dataclass(frozen=True)
class DevicePublicIdentity:
    """A device's public keys: what others seal to and verify against."""

    device_id: str
    x25519_public: bytes
    ed25519_public: bytes

    def __post_init__(self) -> None:
        validate_device_id(self.device_id)
        for name in ("x25519_public", "ed25519_public"):
            key = getattr(self, name)
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise IdentityFormatError(f"{name} must be {KEY_BYTES} bytes")
        try:
            Ed25519PublicKey.from_public_bytes(self.ed25519_public)
        except ValueError as exc:
            raise IdentityFormatError(f"invalid Ed25519 public key: {exc}") from exc

    def to_bytes(self) -> bytes:
        """Encode as ``version | len(id) | id | x25519 (32) | ed25519 (32)``."""
        encoded_id = self.device_id.encode("ascii")
        return (
            bytes([_PUBLIC_VERSION, len(encoded_id)])
            + encoded_id
            + self.x25519_public
            + self.ed25519_public
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> DevicePublicIdentity:
        """Decode `to_bytes` output; raises `IdentityFormatError` when malformed."""
        if not isinstance(data, bytes | bytearray) or len(data) < 2:
            raise IdentityFormatError("public identity is truncated")
        version, id_length = data[0], data[1]
        if version != _PUBLIC_VERSION:
            raise IdentityFormatError(f"unknown public identity version {version}")
        if len(data) != 2 + id_length + 2 * KEY_BYTES:
            raise IdentityFormatError(
                f"public identity has {len(data)} bytes, expected "
                f"{2 + id_length + 2 * KEY_BYTES}"
            )
        try:
            device_id = bytes(data[2 : 2 + id_length]).decode("ascii")
        except UnicodeDecodeError as exc:
            raise IdentityFormatError("device id is not ASCII") from exc
        keys = bytes(data[2 + id_length :])
        return cls(device_id, keys[:KEY_BYTES], keys[KEY_BYTES:])

    def fingerprint(self) -> str:
        """32 hex digits (128 bits) of SHA-256 over both public keys."""
        digest = hashlib.sha256(
            _FINGERPRINT_LABEL + self.x25519_public + self.ed25519_public
        )
        return digest.hexdigest()[:32]


class DeviceIdentity:
    """A device's private keys; never serialized except to its own state file."""

    __slots__ = ("_ed25519", "_public", "_x25519", "device_id")

    def __init__(
        self,
        device_id: str,
        x25519_private: X25519PrivateKey,
        ed25519_private: Ed25519PrivateKey,
    ) -> None:
        """Wrap existing keys; use `generate` or `load_or_create` instead."""
        self.device_id = validate_device_id(device_id)
        self._x25519 = x25519_private
        self._ed25519 = ed25519_private
        self._public = DevicePublicIdentity(
            device_id,
            x25519_private.public_key().public_bytes_raw(),
            ed25519_private.public_key().public_bytes_raw(),
        )

    def __repr__(self) -> str:
        return (
            f"DeviceIdentity(device_id={self.device_id!r}, "
            f"fingerprint={self._public.fingerprint()})"
        )

    @classmethod
    def generate(cls, device_id: str) -> DeviceIdentity:
        """Create fresh random keys (not persisted)."""
        return cls(device_id, X25519PrivateKey.generate(), Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(
        cls, state_dir: Path, device_id: str, *, key_path: Path | None = None
    ) -> DeviceIdentity:
        """Load ``state_dir/identity.key``, or create it (mode 0600) on first start.

        ``key_path`` puts the file elsewhere (a coordinator's identity kept
        apart from its store, so it can be backed up and outlive a reset).

        Raises:
            CryptoError: the file is group/world accessible, a symlink, corrupt,
                or belongs to another device id.
        """
        validate_device_id(device_id)
        path = Path(state_dir) / IDENTITY_FILENAME if key_path is None else key_path
        if path.exists() or path.is_symlink():
            return cls._load(path, device_id)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        identity = cls.generate(device_id)
        if not identity._write_new(path):
            return cls._load(path, device_id)  # another process won the race
        return identity

    def public(self) -> DevicePublicIdentity:
        """The shareable public identity."""
        return self._public

    def sign(self, message: bytes) -> bytes:
        """Ed25519 signature (64 bytes) over ``message``."""
        return self._ed25519.sign(message)

    def x25519_exchange(self, peer_public: bytes) -> bytes:
        """X25519 shared secret with a peer's public key.

        Raises:
            CryptoError: the peer key is malformed or of low order.
        """
        if not isinstance(peer_public, bytes) or len(peer_public) != KEY_BYTES:
            raise CryptoError(f"X25519 public key must be {KEY_BYTES} bytes")
        try:
            return self._x25519.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError as exc:  # all-zero shared secret: low-order point
            raise CryptoError(f"X25519 exchange failed: {exc}") from exc

    def _file_bytes(self) -> bytes:
        record = {
            "version": _FILE_VERSION,
            "device_id": self.device_id,
            "x25519_private": _raw_private(self._x25519).hex(),
            "ed25519_private": _raw_private(self._ed25519).hex(),
        }
        return (json.dumps(record, indent=2) + "\n").encode("ascii")

    def _write_new(self, path: Path) -> bool:
        """Write the key file atomically (0600 from creation); False if it exists."""
        return write_new_secret_file(path, self._file_bytes())

    @classmethod
    def _load(cls, path: Path, device_id: str) -> DeviceIdentity:
        data = read_secret_file(path, "identity")
        try:
            record = json.loads(data)
            if record["version"] != _FILE_VERSION:
                raise ValueError(f"unknown version {record['version']}")
            stored_id = record["device_id"]
            x25519_raw = bytes.fromhex(record["x25519_private"])
            ed25519_raw = bytes.fromhex(record["ed25519_private"])
            x25519 = X25519PrivateKey.from_private_bytes(x25519_raw)
            ed25519 = Ed25519PrivateKey.from_private_bytes(ed25519_raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise CryptoError(f"corrupt identity file {path}: {exc}") from exc
        if stored_id != device_id:
            raise CryptoError(
                f"identity file {path} belongs to device {stored_id!r}, "
                f"not {device_id!r}"
            )
        return cls(device_id, x25519, ed25519)


def verify_signature(
    signer: DevicePublicIdentity, message: bytes, signature: bytes
) -> None:
    """Check an Ed25519 signature; raises `SignatureError` if it does not verify."""
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        raise SignatureError(
            f"signature of device {signer.device_id!r} must be {SIGNATURE_BYTES} bytes"
        )
    try:
        Ed25519PublicKey.from_public_bytes(signer.ed25519_public).verify(
            signature, message
        )
    except InvalidSignature as exc:
        raise SignatureError(
            f"signature does not verify for device {signer.device_id!r}"
        ) from exc


def _raw_private(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
