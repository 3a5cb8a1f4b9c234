"""Typed errors of the crypto layer.

CryptoError
 ├── KeyMismatchError      a ciphertext or key from another key pair / epoch
 ├── KeyFormatError        malformed public or secret key bytes
 ├── IdentityFormatError   a malformed device id, identity key or identity file
 ├── CiphertextError       truncated, wrong length or out-of-range ciphertext bytes
 ├── EncodingError         a value outside what the codec can represent
 │    └── SlotOverflowError  a decoded slot exceeds its bound (carry or bad input)
 ├── SealError             a sealed box that is tampered, misaddressed or malformed
 ├── SignatureError        a signature that does not verify
 ├── UntrustedIdentityError  an identity no valid operator certificate vouches for
 └── BackendUnavailableError  an optional backend (TenSEAL) is not installed
"""

from __future__ import annotations


class CryptoError(Exception):
    """Base of every error raised by `ursa.crypto`."""


class KeyMismatchError(CryptoError):
    """The key does not belong to the ciphertext (another key pair or epoch)."""


class KeyFormatError(CryptoError):
    """Public or secret key bytes are malformed or inconsistent."""


class IdentityFormatError(CryptoError, ValueError):
    """A device id, public key or identity encoding is malformed."""


class UnsafeDirectoryError(CryptoError, ValueError):
    """A state directory that is not a directory or cannot be made private."""


class CiphertextError(CryptoError):
    """Ciphertext bytes are truncated, of the wrong length or out of range."""


class EncodingError(CryptoError):
    """A value lies outside the range the codec was configured for."""


class SlotOverflowError(EncodingError):
    """A decoded slot exceeds the bound its parties could reach."""


class SealError(CryptoError):
    """A sealed box failed to open: tampered, misaddressed or malformed."""


class SignatureError(CryptoError):
    """A signature does not verify under the claimed signer's key."""


class UntrustedIdentityError(CryptoError):
    """An identity without a valid operator certificate for its keys.

    Malformed, tampered, expired, of another federation or role, signed by
    another operator key, or for other keys than the ones presented.
    """


class BackendUnavailableError(CryptoError):
    """An optional crypto backend is not installed (the message says which extra)."""
