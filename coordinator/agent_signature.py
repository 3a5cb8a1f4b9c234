"""The key epoch's agent as the only signer of what it answers the coordinator.

Dubhe's agent answer and the federated evaluation's decrypted result come
from the epoch's agent (it holds the Paillier secret key); a message from
any other device, or one the agent's identity did not sign, is refused
before its content is read.
"""

from __future__ import annotations

from ursa.coordinator.plugin import EpochView
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import verify_signature
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.messages import BaseMessage, ErrorCode
from ursa.protocol.router import RejectedError

__all__ = ["require_agent_signed"]


def require_agent_signed(epoch: EpochView | None, message: BaseMessage) -> None:
    """Refuse ``message`` unless the epoch's agent sent and signed it.

    Raises:
        RejectedError: ``unauthorised`` (no epoch, or another sender),
            ``bad_signature`` (not the agent's signature).
    """
    sender = getattr(message, "sender", None)
    signature = getattr(message, "signature", None)
    if epoch is None or sender != epoch.agent or epoch.agent_identity is None:
        raise RejectedError(ErrorCode.UNAUTHORISED, "only the epoch's agent answers")
    if not isinstance(signature, bytes):
        raise RejectedError(ErrorCode.BAD_SIGNATURE, "the answer is not signed")
    try:
        verify_signature(epoch.agent_identity, signing_bytes(message), signature)
    except CryptoError as exc:
        raise RejectedError(ErrorCode.BAD_SIGNATURE, str(exc)) from None
